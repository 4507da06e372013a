"""The one training loop every backend uses (docs/design.md, "One update").

    schedule → rollout → advantages → TokenBatch → objective → step → diagnostics → run directory

At update ``u`` (the policy's version is ``u``: it has taken ``u`` optimizer steps):

1. **schedule**   the batches whose generating version is ``u`` are sampled now and buffered
                  (:mod:`offpolicylab.staleness`); the batch consumed at ``u`` is taken from the buffer.  Old weights
                  are never kept — stale data is data generated earlier, not a copy of an earlier policy.
2. **rollout**    ``policy.sample(prompts, G, temperature)`` records ``behavior_logp``; ``world.reward`` scores it.
3. **advantages** group-relative, one per sequence, broadcast over its tokens: ``mean`` A_i = r_i − mean_{j∈g(i)} r_j
                  (REC paper, Yao et al. 2025) or ``std`` A_i = (r_i − r̄)/(std_{j∈g(i)} r_j + 1e-6) (GRPO, Shao et
                  al. 2024, DeepSeekMath); ``config.advantage = "auto"`` takes the objective's paper's choice
                  (:attr:`Objective.advantage`) and config.json records the estimator used.
4. **TokenBatch** ``policy.score`` gives ``logp`` (with grad) and ``entropy``; staleness = u − version per sequence.
5. **objective**  ``objective.update(batch)`` once per optimizer update, then ``objective(batch)`` → loss, metrics.
6. **step**       backward, global-norm gradient clipping, optimizer step (skipped, and the run stopped as
                  ``collapsed``, when the loss or gradient is not finite).
7. **diagnostics** objective metrics (ratio mean / max / 99.9th percentile, KL estimates, entropy, ...), reward of
                  the consumed batch and of the current policy's fresh responses, pre-clip grad norm, staleness; every ``eval_every`` updates the sampled reward on
                  ``world.eval_prompts()`` with its standard error, the greedy reward, the sampled KL(π‖π_0) and, where
                  the world is enumerable, the exact return J(π) and the exact KL(π‖π_0); collapse detection
                  (:mod:`offpolicylab.diagnostics.collapse`).
8. **run directory** metrics row, histogram samples, events, atomic checkpoint (:mod:`offpolicylab.runs`).
"""

from __future__ import annotations

import contextlib
import copy
import cProfile
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from offpolicylab.config import TrainConfig
from offpolicylab.contracts import ClonablePolicy, ExactWorld, GreedyPolicy, Policy, Rollout, World
from offpolicylab.diagnostics import stats
from offpolicylab.diagnostics.collapse import CollapseDetector
from offpolicylab.objectives import LossOutput, Objective, TokenBatch, get_objective
from offpolicylab.profiling import LoopProfile
from offpolicylab.proximal import needs_proximal, proximal_logp
from offpolicylab.runs import MAX_SAMPLE_TOKENS, RunDir, RunError
from offpolicylab.seeds import STACKABLE_POLICIES, SeedGroup
from offpolicylab.staleness import Schedule, parse_schedule
from offpolicylab.worlds.exact import MAX_ENUMERATION, kl_divergence, sequence_logprobs

INITIAL_VERSION = 0


class TrainingFailed(RuntimeError):
    """Training raised after the run directory was created (summary.json then says ``failed``)."""


@dataclass
class Parts:
    """Everything a run is made of, built (and validated) from a :class:`TrainConfig` before any file is written."""

    config: TrainConfig
    world: World
    policy: Policy
    objective: Objective
    schedule: Schedule
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    detector: CollapseDetector
    advantage: str = "std"  # the advantage estimator used ("mean" or "std"), config.advantage resolved
    frozen_initial: Policy | None = None  # π_0, kept for mixture / offline data and for the exact KL(π‖π_0)
    enumerable: bool = False  # the world can enumerate its responses (exact return and KL at evaluation)
    memory_plan: str | None = None  # the policy's own memory plan (hf: how it scores), printed at the start
    buffer: dict[int, Rollout] = field(default_factory=dict)
    initial_logprobs: Tensor | None = None  # cache of log π_0(y|x) over an enumerable world's responses
    torch_rng: Tensor | None = None  # the global RNG state to checkpoint when seeds share a process (else current)


# ================================================================================================ the loop
def train(config: TrainConfig, run_dir: str | Path, *, resume: bool = False, progress: bool | str = False,
          stopwatch: Stopwatch | None = None, profile: bool = False) -> dict[str, Any]:
    """Train as ``config`` says, writing the run directory ``run_dir``; returns the summary.

    ``resume=True`` continues from ``run_dir``'s checkpoint (the metrics file then ends identical to an
    uninterrupted run).  Bad configuration raises ``ValueError`` before the directory is touched.  ``progress``:
    ``"bar"`` (or True) a tqdm bar on stderr, ``"lines"`` one line per update on stderr (for logs), False nothing;
    either prints the policy-dependent defaults it filled in first.  ``profile=True`` profiles the updates
    (:mod:`offpolicylab.profiling`), writes ``profile.txt`` and ``profile.pstats`` into the run directory and prints
    the section table and the top functions on stderr."""
    run = RunDir(run_dir, fsync=config.fsync)
    if resume:  # nothing to resume: refused before the lock creates anything
        config = with_stored_plan(config, run.read_config())
    parts = build(config)
    with run.locked():  # one writer per run directory
        start = open_run(run, parts, resume)
        if progress:
            _log(describe_defaults(config, parts.memory_plan))
        return train_group(SeedGroup.single(parts, run), start, stopwatch or Stopwatch(), progress, profile)[0]


def train_seeds(config: TrainConfig, seeds: list[int], run_dirs: str | Path | list[str | Path], *,
                resume: bool = False, progress: bool | str = False, stopwatch: Stopwatch | None = None,
                profile: bool = False) -> list[dict[str, Any]]:
    """Train ``config`` once per seed of ``seeds``, writing for seed S the run directory that ``train`` of
    ``config`` with ``seed=S`` writes — ``run_dirs[i]`` for ``seeds[i]``, or ``run_dirs/seed=S`` when one folder is
    given — and return the summaries.

    Policies in :data:`~offpolicylab.seeds.STACKABLE_POLICIES` train all seeds as one batched computation
    (:mod:`offpolicylab.seeds`); other policies train the seeds one after another.  Every directory is checked
    before any is written: a fresh run refuses a directory that already holds a run, ``resume=True`` needs every
    seed's checkpoint at the same update."""
    configs = [replace(config, seed=seed) for seed in seeds]
    if isinstance(run_dirs, (str, Path)):
        run_dirs = [seed_dir(run_dirs, seed) for seed in seeds]
    if len(run_dirs) != len(seeds):
        raise ValueError(f"{len(seeds)} seeds but {len(run_dirs)} run directories")
    if config.policy not in STACKABLE_POLICIES or len(seeds) == 1:
        if progress and len(seeds) > 1:
            _log(f"offpolicylab: policy {config.policy} trains its seeds one after another (batched: "
                 f"{', '.join(STACKABLE_POLICIES)})")
        return [train(c, path, resume=resume, progress=progress, stopwatch=stopwatch, profile=profile)
                for c, path in zip(configs, run_dirs, strict=True)]
    return train_together(configs, run_dirs, resume=resume, progress=progress, stopwatch=stopwatch, profile=profile)


MEMBER_FIELDS = ("seed", "objective", "objective_params")
"""The fields in which the runs trained together by :func:`train_together` may differ."""


def train_together(configs: list[TrainConfig], run_dirs: list[str | Path], *, resume: bool = False,
                   progress: bool | str = False, stopwatch: Stopwatch | None = None,
                   profile: bool = False) -> list[dict[str, Any]]:
    """Train the runs ``configs`` — one stackable policy kind, equal in every field but :data:`MEMBER_FIELDS` —
    as one batched computation (:mod:`offpolicylab.seeds`: each member keeps its own generator, objective and
    advantage estimator), ``configs[i]`` writing ``run_dirs[i]`` as ``train(configs[i], run_dirs[i])`` does; returns
    the summaries.  Configurations that cannot train together raise ``ValueError`` before anything is written."""
    check_together(configs)
    runs = [RunDir(path, fsync=configs[0].fsync) for path in run_dirs]
    members = build_members(configs)
    check_seed_dirs(runs, resume)
    with contextlib.ExitStack() as locks:
        for run in runs:
            locks.enter_context(run.locked())
        starts = [open_run(run, parts, resume) for run, parts in zip(runs, members, strict=True)]
        if progress:
            _log(describe_defaults(configs[0], members[0].memory_plan) +
                 f"; seeds {','.join(str(c.seed) for c in configs)} batched")
        group = SeedGroup.stack(members, runs)
        return train_group(group, starts[0], stopwatch or Stopwatch(), progress, profile)


def check_together(configs: list[TrainConfig]) -> None:
    """``ValueError`` unless ``configs`` can train as one batched computation (:func:`train_together`)."""
    shared = [{k: v for k, v in c.to_dict().items() if k not in MEMBER_FIELDS} for c in configs]
    if configs[0].policy not in STACKABLE_POLICIES:
        raise ValueError(f"policy {configs[0].policy} cannot train runs together; valid: "
                         f"{', '.join(STACKABLE_POLICIES)}")
    differ = sorted({k for other in shared[1:] for k in other if other[k] != shared[0][k]})
    if differ:
        raise ValueError(f"runs trained together must agree in every field but {', '.join(MEMBER_FIELDS)}; "
                         f"{', '.join(differ)} differ")


def build_seeds(config: TrainConfig, seeds: list[int]) -> list[Parts]:
    """:func:`build` of ``config`` with each seed of ``seeds`` (the members of a seed group)."""
    return build_members([replace(config, seed=seed) for seed in seeds])


def build_members(configs: list[TrainConfig]) -> list[Parts]:
    """:func:`build` of each of ``configs`` (the members of a group trained together)."""
    members = []
    for config in configs:
        members.append(build(config))
        members[-1].torch_rng = torch.get_rng_state()  # what this member's separate run would checkpoint
    return members


def seed_dir(out_dir: str | Path, seed: int) -> Path:
    """The run directory of seed ``seed`` of a ``--seeds`` run (a sweep cell's name for its seed axis)."""
    return Path(out_dir) / f"seed={seed}"


def check_seed_dirs(runs: list[RunDir], resume: bool) -> None:
    """Refuse, before anything is written, seed directories that a fresh run would overwrite, or (``resume``)
    that lack a run or whose checkpoints are at different updates."""
    if not resume:
        taken = [str(run.path) for run in runs if run.holds_run()]
        if taken:
            raise RunError(f"run directory {taken[0]} already holds a run; pass --resume to continue the seeds or "
                           "choose another --out")
        return
    updates = {}
    for run in runs:
        run.read_config()
        updates[run.path.name] = run.load_checkpoint()["next_update"] if run.checkpoint_path.exists() else 0
    values = {int(v) for v in updates.values()}
    if len(values) > 1:
        found = ", ".join(f"{name} at update {value}" for name, value in updates.items())
        raise RunError(f"the seeds' checkpoints are at different updates ({found}); valid: resume each seed on its "
                       "own (--seed S --out DIR/seed=S --resume)")


def train_group(group: SeedGroup, start: int, watch: Stopwatch, progress: bool | str,
                profile: bool) -> list[dict[str, Any]]:
    """Run the group's updates (profiled when asked) and write every member's summary; a failure is recorded in
    every member's run directory and raised as :class:`TrainingFailed`."""
    members, runs = list(group.members), list(group.runs)
    try:
        if profile:
            statuses, loop = profiled_group(group, start, watch, progress)
            for run in runs:
                run.write_profile(loop.report(), loop.stats_bytes())
            _log(loop.short() + f"\n(full profile: {', '.join(str(run.profile_path) for run in runs)})")
        else:
            statuses = run_group(group, start, watch, progress)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        for run in runs:
            record_failure(run, error)
        raise TrainingFailed(f"run {', '.join(str(run.path) for run in runs)} failed: {error}") from exc
    finally:
        for run in runs:
            with contextlib.suppress(OSError):  # closing flushes; a full disk already failed the run
                run.close()
    return [run.write_summary(status, collapse_update=parts.detector.collapsed_at, **exact_optimum(parts.world))
            for run, parts, status in zip(runs, members, statuses, strict=True)]


def record_failure(run: RunDir, error: str) -> None:
    """The ``failed`` event and summary, as far as they can be written (on a full disk they may not be)."""
    with contextlib.suppress(OSError):
        run.event("failed", -1, error=error)
    with contextlib.suppress(OSError):
        run.write_summary("failed", error=error)


def profiled_group(group: SeedGroup, start: int, watch: Stopwatch,
                   progress: bool | str) -> tuple[list[str], LoopProfile]:
    """:func:`run_group` under :mod:`cProfile`, timed by ``watch``; (final statuses, its :class:`LoopProfile`)."""
    profiler = cProfile.Profile()
    clock = time.perf_counter()
    first = group.runs[0]
    profiler.enable()
    try:
        statuses = run_group(group, start, watch, progress)
    finally:
        profiler.disable()
    updates = len(first.read_metrics()) - start
    return statuses, LoopProfile(updates, time.perf_counter() - clock, dict(watch.seconds), profiler)


def run_updates(parts: Parts, run: RunDir, start: int, watch: Stopwatch, progress: bool | str) -> str:
    """Updates ``start … config.updates − 1`` of one run; returns the final status."""
    return run_group(SeedGroup.single(parts, run), start, watch, progress)[0]


def run_group(group: SeedGroup, start: int, watch: Stopwatch, progress: bool | str) -> list[str]:
    """Updates ``start … config.updates − 1`` of every member of ``group`` (one run, or seeds batched together,
    :mod:`offpolicylab.seeds`); returns each member's final status.  A member that stops (non-finite loss, or a
    collapse with ``stop_on_collapse``) leaves the group; the others go on."""
    cfg, schedule = group.members[0].config, group.members[0].schedule
    statuses: list[str | None] = [None] * len(group)
    active = list(range(len(group)))  # the original index of each member still in the group
    not_evaluated = dict.fromkeys(eval_columns(group.members[0]))
    clock = time.perf_counter()
    for update in _progress(range(start, cfg.updates), cfg.updates, start, progress):
        tick = time.perf_counter()
        # 1-2. schedule → rollout: generate what is due now, consume this update's batch
        fresh: list[list[Rollout]] = [[] for _ in active]
        due = schedule.generate_at(update, cfg.updates)
        for key in due:
            for member, own, rollout in zip(group.members, fresh, generate_group(group, update, watch), strict=True):
                member.buffer[key] = rollout
                own.append(rollout)
        if cfg.collapse_tail and not due and watches_tail(schedule, update, cfg.updates):
            for own, rollout in zip(fresh, generate_group(group, update, watch), strict=True):
                own.append(rollout)  # the detector's batch: its reward is recorded, never trained on
        consumed = [member.buffer[schedule.key(update)] for member in group.members]
        for key in schedule.release_after(update, cfg.updates):  # one schedule for all members
            for member in group.members:
                member.buffer.pop(key, None)
        joined = group.join_rollouts(consumed)  # the members' batches as row blocks, group ids kept apart
        with watch("policy_forward"):
            logp, entropy = group.policy.score(joined)
        with watch("other"):  # 3. advantages (per group, so the same numbers as each member's alone)
            advantages = member_advantages(group, joined)
        with_metrics = is_due(update, cfg.metrics_every, cfg.updates)  # metrics=False only when skipped
        with watch("other"):  # 4. TokenBatch: built and validated once, one block per member
            whole = token_batch(joined, logp, entropy, advantages, update)
            if needs_proximal(group):  # decoupled PPO: log π_prox of the consumed batches (offpolicylab.proximal)
                whole = whole.replace(prox_logp=proximal_logp(group, schedule, update, cfg.updates, logp))
            batches = group.token_batches(whole, consumed, with_metrics)
        with watch("objective"):  # 5. objective
            outs = objective_outputs(group, whole, batches, with_metrics)
        # 6. step
        with watch("policy_backward"):
            group.optimizer.zero_grad(set_to_none=True)
            (outs[0].loss if len(outs) == 1 else sum(out.loss for out in outs)).backward()
            grad_norms = group.clip_gradients(cfg.grad_clip)
        with watch("other"):
            rows = update_rows(update, outs, grad_norms, batches, fresh, group.members, whole)
        finite = [math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"]) for row in rows]
        if any(finite):  # a member with a non-finite step stops below; its slice of the stack is left behind
            with watch("policy_backward"):
                group.optimizer.step()
        labels = [f"[seed {m.config.seed}] " if len(statuses) > 1 else "" for m in group.members]
        if progress == "lines":  # before the evaluation, which can take as long as an update on an LLM
            for label, row in zip(labels, rows, strict=True):
                _log(label + progress_line(row, cfg.updates, time.perf_counter() - tick))
        # 7. diagnostics
        due = evaluate_due(group, update, rows, finite, watch, labels if progress == "lines" else None)
        stopped = []
        for position, (member, run, row, batch, out, ok, evaluated) in enumerate(zip(
                group.members, group.runs, rows, batches, outs, finite, due, strict=True)):
            if not evaluated:
                row.update(not_evaluated)
            if record_update(member, run, update, row, batch, out, ok, (tick, clock), watch):
                statuses[active[position]] = "collapsed"
                stopped.append(position)
            elif (update + 1) % cfg.checkpoint_every == 0 or update + 1 == cfg.updates:
                with watch("checkpoint"):
                    run.save_checkpoint(checkpoint_state(member, update + 1))
        if stopped:
            kept = [position for position in range(len(group)) if position not in stopped]
            if not kept:
                break
            group = group.keep(kept)
            active = [active[position] for position in kept]
    for position, member in zip(active, group.members, strict=True):
        if statuses[position] is None:
            statuses[position] = "collapsed" if member.detector.collapsed_at >= 0 else "completed"
    return [status or "completed" for status in statuses]


def objective_outputs(group: SeedGroup, whole: TokenBatch, batches: list[TokenBatch],
                      metrics: bool) -> list[LossOutput]:
    """Each member's objective output on its block ``batches[i]`` of the group's batch ``whole``.  Consecutive
    members with the same row-wise, stateless objective (batched seeds of one configuration) share one call over
    their rows (:meth:`Objective.call_blocks`, bit for bit each member's own call); the others call their own."""
    outs: list[LossOutput] = []
    for start, stop in group.objective_runs(batches, metrics):
        objective = group.members[start].objective
        if stop - start == 1:
            objective.update(batches[start])
            outs.append(objective(batches[start]) if metrics else objective(batches[start], metrics=False))
            continue
        rows = batches[start].batch_size
        part = whole if stop - start == len(batches) else \
            whole.rows(slice(start * rows, stop * rows), whole.group_ids[start * rows:stop * rows])
        summaries = [batch._summary for batch in batches[start:stop]] if metrics else None
        outs.extend(objective.call_blocks(part, stop - start, summaries, metrics=metrics))  # type: ignore[arg-type]
    return outs


def evaluate_due(group: SeedGroup, update: int, rows: list[dict[str, Any]], finite: list[bool], watch: Stopwatch,
                 labels: list[str] | None) -> list[bool]:
    """Evaluate the members whose step was finite when evaluation is due (all at once when all are), adding the
    numbers to their rows; which members were evaluated.  ``labels``: log each evaluation line with its label."""
    cfg = group.members[0].config
    due = [ok and is_due(update, cfg.eval_every, cfg.updates) for ok in finite]
    if not any(due):
        return due
    with watch("eval"):
        tick = time.perf_counter()
        results = (evaluate_group(group, update) if all(due) else
                   [evaluate(m, update) if ok else {} for m, ok in zip(group.members, due, strict=True)])
        for index, (row, result) in enumerate(zip(rows, results, strict=True)):
            row.update(result)
            if due[index] and labels is not None:
                _log(labels[index] + eval_line(row, time.perf_counter() - tick))
    return due


def update_rows(update: int, outs: list[LossOutput], grad_norms: list[Tensor], batches: list[TokenBatch],
                fresh: list[list[Rollout]], members: list[Parts], whole: TokenBatch) -> list[dict[str, Any]]:
    """The metrics row of each member's update before evaluation: the update, the step's numbers (one host
    transfer for all members; ``whole``, the members' batches joined, gives their batch numbers at once) and the
    current policy's reward."""
    values = scalars_of([(out.loss, norm, batch, out.metrics)
                         for out, norm, batch in zip(outs, grad_norms, batches, strict=True)], whole)
    return [{"update": update, **numbers,
             "reward_current": current_reward(own, update, member.schedule.other_share == 0)}
            for numbers, own, member in zip(values, fresh, members, strict=True)]


def record_update(parts: Parts, run: RunDir, update: int, row: dict[str, Any], batch: TokenBatch, out: LossOutput,
                  finite: bool, clocks: tuple[float, float], watch: Stopwatch) -> bool:
    """7-8: collapse detection, the metrics row, events and samples of one run's update; whether the run stops
    here (a non-finite step, or a collapse with ``stop_on_collapse``)."""
    cfg, (tick, clock) = parts.config, clocks
    with watch("other"):
        now = time.perf_counter()
        row.update(time_update_s=now - tick, time_elapsed_s=now - clock)
        reason = (parts.detector.non_finite(update) if not finite else
                  parts.detector.observe(update, detector_reward(row, parts.schedule), row.get("kl_k3"),
                                         row["grad_norm"]))
        # 8. run directory
        run.append_metrics(row)
        if not finite:
            run.event("non_finite_loss", update, loss=row["loss"], grad_norm=row["grad_norm"])
        if reason is not None:
            run.event("collapse", update, reason=reason)
        if cfg.sample_every and update % cfg.sample_every == 0:
            run.write_samples(update, histogram_samples(batch, out.token_mask, cfg.seed, update))
    return not finite or (reason is not None and cfg.stop_on_collapse)


# ================================================================================================ building
def build(config: TrainConfig) -> Parts:
    """World, policy, objective, schedule and optimizer of ``config``; any bad name or value raises
    ``ValueError``."""
    from offpolicylab.policies import make_policy
    from offpolicylab.worlds import make_world

    config, _ = config.with_defaults()
    schedule = parse_schedule(config.schedule)
    objective = get_objective(config.objective, **config.objective_params)
    world = make_world(config.world, **config.world_params)
    check_memory(config, world)
    torch.manual_seed(config.seed)
    policy = make_policy(config.policy, world, **config.policy_params)
    config, memory_plan = plan_memory(config, world, policy)
    enumerable = _enumerable(world)
    keep_initial = schedule.other_share > 0 or enumerable or tracks_kl_init(config)
    frozen = _clone(policy) if keep_initial else None
    return Parts(
        config=config, world=world, policy=policy, objective=objective, schedule=schedule,
        optimizer=make_optimizer(config, policy.trainable_parameters()),
        generator=torch.Generator().manual_seed(config.seed),
        detector=CollapseDetector(margin=config.collapse_margin, gain_fraction=config.collapse_gain_fraction,
                                  factor=config.collapse_spike,
                                  window=config.collapse_window),
        advantage=advantage_used(config, objective),
        frozen_initial=frozen, enumerable=enumerable, memory_plan=memory_plan,
    )


def advantage_used(config: TrainConfig, objective: Objective) -> str:
    """The advantage estimator a run uses: ``config.advantage``, or for ``auto`` the objective's paper's choice."""
    return objective.advantage if config.advantage == "auto" else config.advantage


def check_memory(config: TrainConfig, world: World) -> None:
    """Refuse a batch that cannot fit in this machine's memory, before anything is allocated.

    A lower bound: the rollout of one update alone holds, per response token, its id (8 bytes), mask, behaviour
    log-prob, current log-prob and entropy (4 bytes each), i.e. rows × T × 24 bytes with rows = prompts_per_update ×
    group_size and T the longest response; it is compared with the physical memory.  A policy that knows its own
    scoring memory (the hf policy: activations and full-vocabulary logits) adds its check in :func:`plan_memory`."""
    rows = config.prompts_per_update * config.group_size
    tokens = rows * int(world.max_response_len)
    need = tokens * 24
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > total:
        raise ValueError(f"prompts_per_update × group_size = {rows:,} responses ({tokens:,} tokens) need at least "
                         f"{need / 2**30:,.1f} GiB but this machine has {total / 2**30:,.1f} GiB; valid: a smaller "
                         "prompts_per_update or group_size")


def plan_memory(config: TrainConfig, world: World, policy: Policy) -> tuple[TrainConfig, str | None]:
    """(config with the policy's memory plan for scoring one update's batch recorded in ``policy_params``, the plan
    as text); unchanged for policies without ``plan_scoring``.

    The hf policy chooses the scoring options the user left unset (micro-batch, recompute) from the memory
    available, or refuses a batch that cannot fit (``ValueError``); recording them in config.json makes a resume
    score exactly as the original run did."""
    plan_scoring = getattr(policy, "plan_scoring", None)
    if plan_scoring is None:
        return config, None
    rows = config.prompts_per_update * config.group_size
    longest = getattr(world, "longest_prompt_tokens", None)
    plan = plan_scoring(rows, int(longest() if longest else getattr(world, "max_prompt_tokens", 0)))
    return replace(config, policy_params={**config.policy_params, **plan.params()}), plan.describe()


def with_stored_plan(config: TrainConfig, stored: dict[str, Any]) -> TrainConfig:
    """``config`` with the memory plan a run recorded in its config.json (``stored``) for the policy options that
    ``config`` leaves unset, so that a resume scores as the original run did whatever memory is free now."""
    from offpolicylab.policies.hf import PLANNED_PARAMS

    if stored.get("policy") != config.policy:
        return config
    planned = {k: v for k, v in stored.get("policy_params", {}).items()
               if k in PLANNED_PARAMS and k not in config.policy_params}
    return replace(config, policy_params={**config.policy_params, **planned}) if planned else config


def make_optimizer(config: TrainConfig, params: Any) -> torch.optim.Optimizer:
    params = list(params)
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=config.lr)
    return torch.optim.SGD(params, lr=config.lr)


def open_run(run: RunDir, parts: Parts, resume: bool) -> int:
    """Create the run directory (fresh run) or restore the checkpoint (resume); returns the first update to do."""
    resolved = resolved_config(parts)
    if not resume:
        run.create(resolved)
        return 0
    stored = run.read_config()
    if stored != resolved:
        changed = sorted(k for k in set(stored) | set(resolved) if stored.get(k) != resolved.get(k))
        raise RunError(f"--resume with a different configuration ({', '.join(changed)} differ from "
                       f"{run.config_path}); valid: the same options as the original run")
    previous = run.read_summary()
    if previous is not None and previous.get("status") != "failed":
        raise RunError(f"run {run.path} already finished with status {previous.get('status')!r}")
    state = run.load_checkpoint() if run.checkpoint_path.exists() else None
    if state is None:  # killed before the first checkpoint: start over
        run.truncate_metrics(0)
        start = 0
    else:
        start = checked_next_update(run, state, parts.config)
        restore_state(parts, state)
        run.truncate_metrics(start, state)
    if previous is not None:  # a failed run (e.g. a full disk) continues from its last good checkpoint
        run.summary_path.unlink()
    run.event("resume", start, **({} if state else {"note": "no checkpoint yet, restarting"}))
    return start


def checked_next_update(run: RunDir, state: dict[str, Any], config: TrainConfig) -> int:
    """The checkpoint's update counter, which must be an integer in 1 … updates at a checkpoint boundary
    (a multiple of ``checkpoint_every``, or ``updates``)."""
    value = state["next_update"]
    value = int(value) if isinstance(value, torch.Tensor) and value.numel() == 1 else value
    at_boundary = isinstance(value, int) and (value % config.checkpoint_every == 0 or value == config.updates)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= config.updates or not at_boundary:
        raise RunError(f"corrupt checkpoint {run.checkpoint_path} (update counter {value!r}; valid: a multiple of "
                       f"checkpoint_every={config.checkpoint_every} in 1..{config.updates})")
    return value


def resolved_config(parts: Parts) -> dict[str, Any]:
    """The config as stored in config.json (:func:`resolve_config`)."""
    return resolve_config(parts.config, parts.objective)


def resolve_config(config: TrainConfig, objective: Objective | None = None) -> dict[str, Any]:
    """config.json of a run of ``config``: its fields, with the objective's parameters (defaults included) filled in
    from ``objective`` (built from the config when not given), ``advantage`` resolved to the estimator used, and the
    world's and the policy's given parameters as their validated values; a bad name or parameter raises
    ``ValueError``."""
    from offpolicylab.policies import POLICIES
    from offpolicylab.worlds import WORLDS

    objective = objective or get_objective(config.objective, **config.objective_params)
    config, _ = config.with_defaults()
    resolved = config.to_dict()
    resolved["objective_params"] = dict(objective.config)
    resolved["advantage"] = advantage_used(config, objective)
    resolved["world_params"] = WORLDS.resolve(config.world, config.world_params, fill_defaults=False)
    resolved["policy_params"] = POLICIES.resolve(config.policy, config.policy_params, fill_defaults=False)
    return json.loads(json.dumps(resolved))


# ================================================================================================ rollouts
def generate(parts: Parts, version: int, watch: Stopwatch) -> Rollout:
    """One batch of one run (:func:`generate_group` of a group of one)."""
    return generate_group(SeedGroup.single(parts, None), version, watch)[0]  # type: ignore[arg-type]


def generate_group(group: SeedGroup, version: int, watch: Stopwatch) -> list[Rollout]:
    """One batch per member: ``prompts_per_update`` prompts × ``group_size`` responses with rewards and versions.
    A share ``schedule.other_share`` of the prompts is answered by the frozen initial policy (version 0).  Each
    member draws its prompts, tokens and rewards from its own generator, in the order of a separate run; a world
    with ``rowwise_reward`` (each row's reward depends on that row alone, bit for bit, and draws nothing) scores
    all members' rows in one call."""
    members, policies = group.members, (group.policy, group.frozen)
    cfg, schedule = members[0].config, members[0].schedule
    n_other = round(schedule.other_share * cfg.prompts_per_update)
    joined_rewards = len(members) > 1 and getattr(members[0].world, "rowwise_reward", False)
    pieces: list[list[Rollout]] = [[] for _ in members]
    for policy, count, tag in ((policies[0], cfg.prompts_per_update - n_other, version),
                               (policies[1], n_other, INITIAL_VERSION)):
        if count == 0:
            continue
        prompts = group.join_prompts([member.world.sample_prompts(count, member.generator) for member in members])
        with watch("policy_forward"):
            rollout = policy.sample(prompts, cfg.group_size, cfg.temperature, group.generators)
            if cfg.recompute_behavior_logp:
                rollout = recompute_behavior_logp(policy, rollout)
        device = rollout.response_ids.device
        rollout = rollout.with_(version=torch.full((len(rollout),), tag, dtype=torch.long, device=device))
        if joined_rewards:  # every member's rows in one call: each row's reward is its own, bit for bit
            with watch("other"):
                rewards = members[0].world.reward(rollout.prompt_index, rollout.response_ids, rollout.response_mask)
            rollout = rollout.with_(rewards=rewards.to(torch.float32))
        for own, block in zip(pieces, group.split_rollout(rollout), strict=True):
            own.append(block)
    batches = []
    for member, own in zip(members, pieces, strict=True):
        rollout = own[0] if len(own) == 1 else Rollout.concat(own)
        if not joined_rewards:
            with watch("other"):
                rewards = member.world.reward(rollout.prompt_index, rollout.response_ids, rollout.response_mask,
                                              generator=member.generator)
            rollout = rollout.with_(rewards=rewards.to(torch.float32))
        batches.append(rollout)
    return batches


def recompute_behavior_logp(policy: Policy, rollout: Rollout) -> Rollout:
    """behavior_logp ← log π(y_t | x, y_<t) from the policy's training forward (``score``, no grad), as verl's
    recompute of old_log_prob; the sampler's numbers become ``sampler_logp`` (its own ``sampler_logp`` when it
    reported one).  The objective's log-ratio logp − behavior_logp then measures staleness alone and
    behavior_logp − sampler_logp the sampler/trainer numeric mismatch (Yao et al. 2025, "Your efficient RL framework
    secretly brings you off-policy RL training")."""
    with torch.no_grad():
        logp, _ = policy.score(rollout)
    sampler = rollout.sampler_logp if rollout.sampler_logp is not None else rollout.behavior_logp
    return rollout.with_(behavior_logp=logp.detach() * rollout.response_mask, sampler_logp=sampler)


def group_advantages(rewards: Tensor, group_ids: Tensor, std_norm: bool, eps: float = 1e-6) -> Tensor:
    """A_i = r_i − r̄_{g(i)}  (÷ (σ_{g(i)} + eps) when ``std_norm``; σ is the population std of the group)."""
    groups = int(group_ids.max()) + 1
    zeros = rewards.new_zeros(groups)
    count = zeros.index_add(0, group_ids, torch.ones_like(rewards))
    mean = zeros.index_add(0, group_ids, rewards) / count
    centered = rewards - mean[group_ids]
    if not std_norm:
        return centered
    var = zeros.index_add(0, group_ids, centered**2) / count
    return centered / (var.sqrt()[group_ids] + eps)


def member_advantages(group: SeedGroup, joined: Rollout) -> Tensor:
    """:func:`group_advantages` of the group's ``joined`` batch, each member's block with its own estimator (one
    call when the members agree; per group, so block s holds the numbers of member s alone)."""
    kinds = [member.advantage for member in group.members]
    if len(set(kinds)) == 1:
        return group_advantages(joined.rewards, joined.group_ids, kinds[0] == "std")
    each = {kind: group.split(group_advantages(joined.rewards, joined.group_ids, kind == "std")) for kind in set(kinds)}
    return torch.cat([each[kind][index] for index, kind in enumerate(kinds)])


def token_batch(rollout: Rollout, logp: Tensor, entropy: Tensor, advantages: Tensor, update: int) -> TokenBatch:
    """The objective's input: per-token logp (grad) and behaviour log-probs, per-sequence advantage and staleness."""
    return TokenBatch(
        logp=logp, behavior_logp=rollout.behavior_logp, advantages=advantages, mask=rollout.response_mask,
        rewards=rollout.rewards, group_ids=rollout.group_ids, sampler_logp=rollout.sampler_logp, entropy=entropy,
        staleness=(update - rollout.version).to(torch.float32),
    )


# ================================================================================================ diagnostics
def scalars(loss: Tensor, grad_norm: Tensor, batch: TokenBatch, metrics: dict[str, Tensor]) -> dict[str, float]:
    """The per-update numbers, converted to Python floats with a single host transfer."""
    return scalars_of([(loss, grad_norm, batch, metrics)])[0]


def scalars_of(steps: list[tuple[Tensor, Tensor, TokenBatch, dict[str, Tensor]]],
               whole: TokenBatch | None = None) -> list[dict[str, float]]:
    """:func:`scalars` of several runs' updates (batched seeds), with a single host transfer for all of them;
    ``whole``: the runs' batches joined row-wise (each step's batch a row block of it), whose per-block reward and
    staleness numbers are then computed for all runs at once (:func:`block_numbers`)."""
    blocks = block_numbers(whole, len(steps)) if whole is not None and len(steps) > 1 else [None] * len(steps)
    named = [_scalar_tensors(*step, numbers) for step, numbers in zip(steps, blocks, strict=True)]
    tensors = [v if v.dim() == 0 else v.reshape(()) for one in named for v in one.values()]
    if len({t.dtype for t in tensors}) != 1:  # mixed dtypes: widen each (float32 -> float64 is exact either way)
        tensors = [t.to(torch.float64) for t in tensors]
    values = iter(torch.stack(tensors).tolist())
    return [{key: next(values) for key in one} for one in named]


def block_numbers(batch: TokenBatch, count: int) -> list[dict[str, Tensor]]:
    """The batch numbers of :func:`_scalar_tensors` (reward mean and std, staleness mean and max, mean response
    length) of each of the ``count`` equal consecutive row blocks of ``batch``: the means and the max one reduction
    per row of a ``[count, rows]`` view, bit for bit the block's own; the standard deviation block by block (a
    row-wise ``std`` rounds differently from the block's own: 0 against 3e-8 for equal rewards)."""
    def rows(value: Tensor) -> Tensor:
        return value.reshape(count, -1)

    rewards, staleness = rows(batch.rewards), rows(batch.staleness)
    means = torch.stack([rewards.mean(1), staleness.mean(1), staleness.amax(1), rows(batch.mask.sum(-1)).mean(1)])
    return [{"reward_mean": means[0, i], "reward_std": rewards[i].std(unbiased=False), "staleness_mean": means[1, i],
             "staleness_max": means[2, i], "response_len": means[3, i]} for i in range(count)]


def _scalar_tensors(loss: Tensor, grad_norm: Tensor, batch: TokenBatch, metrics: dict[str, Tensor],
                    numbers: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
    if numbers is None:
        numbers = {"reward_mean": batch.rewards.mean(), "reward_std": batch.rewards.std(unbiased=False),
                   "staleness_mean": batch.staleness.mean(), "staleness_max": batch.staleness.max(),
                   "response_len": batch.mask.sum(-1).mean()}
    named = {
        "loss": loss.detach(), "grad_norm": grad_norm.detach(), **numbers,
        **{key: value for key, value in metrics.items() if value.numel() == 1},
    }
    if batch.sampler_logp is not None:  # trainer vs sampler numbers of the same tokens (not staleness)
        mismatch = (batch.behavior_logp - batch.sampler_logp).abs()
        named["sampler_log_ratio_abs_mean"] = stats.masked_mean(mismatch, batch.mask)
        named["sampler_log_ratio_abs_max"] = stats.masked_max(mismatch, batch.mask)
    return named


def current_reward(fresh: list[Rollout], update: int, all_current: bool = False) -> float:
    """Mean reward of the responses the current policy (version ``update``) generated at this update — its own
    reward, whatever batch the update consumes; NaN when it generated none (between stages, offline data).
    ``all_current``: every fresh row is the current policy's (no share answered by π_0), so none is filtered."""
    rewards = [r.rewards if all_current else r.rewards[r.version == update] for r in fresh]
    rewards = (rewards[0] if len(rewards) == 1 else torch.cat(rewards)) if rewards else torch.zeros(0)
    return float(rewards.mean()) if rewards.numel() else math.nan


def watches_tail(schedule: Schedule, update: int, total: int) -> bool:
    """Whether the current policy generates a batch at ``update`` only for the collapse detector: a run without an
    end would generate here, but every batch it would generate is consumed at or after ``total`` (the drained tail of
    a stale queue: the last K updates of ``stale_k:K``).  Versions never decrease with the update, so no batch that a
    later update trains on is generated after this point: drawing the extra batch from the run's own generator leaves
    every trained batch — and so the whole training — unchanged."""
    if schedule.other_share >= 1.0 or schedule.generate_at(update, total):
        return False
    return bool(schedule.generate_at(update, update + schedule.horizon + 1))


def detector_reward(row: dict[str, float], schedule: Schedule) -> float | None:
    """The reward the collapse detector observes: the current policy's (``reward_current``); None (hold) at updates
    where it generated nothing; the consumed batch's reward for the offline schedules, whose data never come from
    the current policy."""
    if schedule.kind == "offline":
        return row["reward_mean"]
    return row["reward_current"] if math.isfinite(row["reward_current"]) else None


def is_due(update: int, every: int, total: int) -> bool:
    return update % every == 0 or update == total - 1


def tracks_kl_init(config: TrainConfig) -> bool:
    """Whether evaluation estimates KL(π‖π_0) from its samples: ``eval_kl_init`` on, or auto and not the hf policy
    (an LLM's frozen copy would double its memory unless asked for)."""
    return config.eval_kl_init == "on" or (config.eval_kl_init == "auto" and config.policy != "hf")


def eval_columns(parts: Parts) -> list[str]:
    columns = ["eval_reward_sampled", "eval_reward_se", "eval_reward_greedy"]
    if tracks_kl_init(parts.config):
        columns += ["eval_kl_init_k1", "eval_kl_init_k3"]
    if parts.enumerable:
        columns += ["exact_return", "exact_kl_init"]
    return columns


def evaluate(parts: Parts, update: int) -> dict[str, float]:
    """Monte-Carlo J: the mean reward of ``eval_samples`` sampled responses per prompt of ``world.eval_prompts()``
    and its standard error (:func:`stats.stratified_standard_error`, prompts as strata); the reward of greedy
    responses; the sampled KL(π‖π_0) (:func:`kl_to_initial`) when tracked; exact J(π) and KL(π‖π_0) when the world
    can enumerate its responses.  Uses its own generator, so evaluation never shifts the training randomness."""
    return evaluate_group(SeedGroup.single(parts, None), update)[0]  # type: ignore[arg-type]


def evaluate_group(group: SeedGroup, update: int) -> list[dict[str, float]]:
    """:func:`evaluate` of every member, each with its own evaluation generator, the members' sampling, greedy
    decoding, π_0 scoring and enumeration done as one batch of row blocks."""
    members = group.members
    cfg, world, policy = members[0].config, members[0].world, group.policy
    gens = [torch.Generator().manual_seed(m.config.seed * 1_000_003 + update) for m in members]
    prompts = group.join_prompts([m.world.eval_prompts() for m in members])
    sampled = policy.sample(prompts, cfg.eval_samples, cfg.temperature, gens[0] if len(gens) == 1 else gens)
    outs = []
    for member, own, gen in zip(members, group.split_rollout(sampled), gens, strict=True):
        rewards = _rewards(member.world, own, gen)
        outs.append({"eval_reward_sampled": float(rewards.mean()),
                     "eval_reward_se": float(stats.stratified_standard_error(rewards, own.group_ids)),
                     "eval_reward_greedy": math.nan})
    if isinstance(policy, GreedyPolicy):
        for out, member, own, gen in zip(outs, members, group.split_rollout(policy.greedy(prompts)), gens,
                                         strict=True):
            out["eval_reward_greedy"] = float(_rewards(member.world, own, gen).mean())
    if tracks_kl_init(cfg):
        with torch.no_grad():
            initial_logp = group.split(group.frozen.score(sampled)[0])
        for out, own, logp in zip(outs, group.split_rollout(sampled), initial_logp, strict=True):
            out.update(kl_from_scores(logp, own))
    if members[0].enumerable:
        enumeration = world.enumeration
        logp = group.split(sequence_logprobs(policy, group.join_prompts([enumeration.prompts] * len(members)),
                                             enumeration.ids, enumeration.mask, 1.0, world.vocab_size))
        for out, member, own in zip(outs, members, logp, strict=True):
            out.update(exact_diagnostics(member, own))
    return outs


def kl_to_initial(initial: Policy, sampled: Rollout) -> dict[str, float]:
    """Per-token estimates of KL(π‖π_0) from responses sampled by π (Schulman's k1 and k3 with
    δ = log π_0(y_t) − log π(y_t), :func:`stats.ratio_summary`): k1 = E[−δ], k3 = E[e^δ − 1 − δ] ≥ 0, token means.
    log π is the sampler's ``behavior_logp``; π_0 scores the same tokens (one forward, no grad), at the sampling
    temperature, so the KL is between the tempered distributions."""
    with torch.no_grad():
        initial_logp, _ = initial.score(sampled)
    return kl_from_scores(initial_logp, sampled)


def kl_from_scores(initial_logp: Tensor, sampled: Rollout) -> dict[str, float]:
    """:func:`kl_to_initial` from π_0's log-probs ``initial_logp`` of the sampled tokens."""
    delta = initial_logp.detach().to(sampled.behavior_logp.dtype) - sampled.behavior_logp
    k1, k3 = stats.kl_estimates(delta, sampled.response_mask)
    return {"eval_kl_init_k1": float(k1), "eval_kl_init_k3": float(k3)}


def exact_diagnostics(parts: Parts, logp: Tensor | None = None) -> dict[str, float]:
    """J(π) = E_x Σ_y π(y|x) R(x, y) and KL(π‖π_0) = E_x Σ_y π(y|x)(log π − log π_0) by enumeration, scoring π once
    (``logp``: log π(y|x) [N, M] when already computed; π_0's log-probs are computed once per run and cached)."""
    enumeration = parts.world.enumeration
    logp = enumeration.logprobs(parts.policy) if logp is None else logp
    if parts.initial_logprobs is None:
        parts.initial_logprobs = enumeration.logprobs(parts.frozen_initial)
    return {"exact_return": enumeration.return_of(logp), "exact_kl_init": kl_divergence(logp, parts.initial_logprobs)}


def exact_optimum(world: World) -> dict[str, float]:
    return {"optimal_return": float(world.optimal_return())} if isinstance(world, ExactWorld) else {}


def histogram_samples(batch: TokenBatch, kept: Tensor | None, seed: int, update: int) -> dict[str, np.ndarray]:
    """Valid-token samples (≤ MAX_SAMPLE_TOKENS, subsampled without replacement by a generator of its own) of log r,
    advantage, entropy and kept (1 = the token carried gradient), plus per-sequence log ρ and staleness."""
    valid = batch.mask > 0
    log_ratio = batch.log_ratio.detach()
    columns = {
        "log_ratio": log_ratio[valid], "advantage": batch.advantages[valid],
        "entropy": (batch.entropy if batch.entropy is not None else torch.zeros_like(log_ratio))[valid],
        "kept": (kept if kept is not None else batch.mask)[valid],
    }
    arrays = {key: value.detach().cpu().numpy().astype(np.float32) for key, value in columns.items()}
    count = arrays["log_ratio"].shape[0]
    if count > MAX_SAMPLE_TOKENS:
        pick = np.sort(np.random.default_rng([seed, update]).choice(count, MAX_SAMPLE_TOKENS, replace=False))
        arrays = {key: value[pick] for key, value in arrays.items()}
    arrays["seq_log_ratio"] = stats.sequence_log_ratio(log_ratio, batch.mask).cpu().numpy().astype(np.float32)
    arrays["staleness"] = batch.staleness.cpu().numpy().astype(np.float32)
    return arrays


# ================================================================================================ checkpoints
def checkpoint_state(parts: Parts, next_update: int) -> dict[str, Any]:
    """Everything needed to continue bit for bit: weights, optimizer, objective state, RNGs, the buffer of pending
    rollouts, collapse detector and the update counter (tensors and plain containers only)."""
    return {
        "next_update": next_update,
        "policy": parts.policy.state_dict(),
        "optimizer": parts.optimizer.state_dict(),
        "objective": parts.objective.state_dict(),
        "generator": parts.generator.get_state(),
        "torch_rng": torch.get_rng_state() if parts.torch_rng is None else parts.torch_rng,
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],  # dropout on a GPU
        "buffer": pack_buffer(parts.buffer),
        "detector": parts.detector.state_dict(),
    }


def restore_state(parts: Parts, state: dict[str, Any]) -> None:
    try:
        parts.policy.load_state_dict(state["policy"])
        parts.optimizer.load_state_dict(state["optimizer"])
        parts.objective.load_state_dict(state["objective"])
        parts.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        if parts.torch_rng is not None:
            parts.torch_rng = state["torch_rng"]
        if state.get("cuda_rng") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        parts.buffer = unpack_buffer(state["buffer"], device=_policy_device(parts.policy))
        parts.detector.load_state_dict(state["detector"])
    except (KeyError, RuntimeError, ValueError, TypeError) as exc:
        raise RunError(f"corrupt checkpoint: it does not match this run ({type(exc).__name__}: "
                       f"{str(exc).splitlines()[0][:120] if str(exc) else ''})") from None


_PROMPT_FIELDS = ("prompt_ids", "prompt_mask")  # left-padded
_RESPONSE_FIELDS = ("response_ids", "response_mask", "behavior_logp", "sampler_logp")  # right-padded
_ROW_FIELDS = ("group_ids", "prompt_index", "rewards", "version")


def pack_buffer(buffer: dict[int, Rollout]) -> dict[str, Tensor]:
    """The pending rollouts as a handful of concatenated tensors (``torch.save`` pays a fixed cost per tensor, so one
    tensor per field rather than one per field and rollout); :func:`unpack_buffer` inverts it exactly."""
    if not buffer:
        return {}
    rollouts = list(buffer.values())
    pw = max(r.prompt_ids.shape[1] for r in rollouts)
    rw = max(r.response_ids.shape[1] for r in rollouts)
    packed = {
        "keys": torch.tensor(list(buffer), dtype=torch.long),
        "rows": torch.tensor([len(r) for r in rollouts], dtype=torch.long),
        "prompt_width": torch.tensor([r.prompt_ids.shape[1] for r in rollouts], dtype=torch.long),
        "response_width": torch.tensor([r.response_ids.shape[1] for r in rollouts], dtype=torch.long),
        "temperature": torch.tensor([r.temperature for r in rollouts], dtype=torch.float64),
    }
    for name in _PROMPT_FIELDS + _RESPONSE_FIELDS + _ROW_FIELDS:
        values = [getattr(r, name) for r in rollouts]
        if any(v is None for v in values):
            continue
        if name in _PROMPT_FIELDS:
            values = [torch.nn.functional.pad(v, (pw - v.shape[1], 0)) for v in values]
        elif name in _RESPONSE_FIELDS:
            values = [torch.nn.functional.pad(v, (0, rw - v.shape[1])) for v in values]
        packed[name] = torch.cat(values)
    return packed


def _policy_device(policy: Policy) -> torch.device:
    """Where the policy's parameters live (checkpoints are loaded on the CPU)."""
    params = list(policy.trainable_parameters())
    return params[0].device if params else torch.device("cpu")


def unpack_buffer(packed: dict[str, Tensor], device: torch.device | str = "cpu") -> dict[int, Rollout]:
    if not packed:
        return {}
    buffer: dict[int, Rollout] = {}
    start = 0
    for i, key in enumerate(packed["keys"].tolist()):
        stop = start + int(packed["rows"][i])
        pw, rw = int(packed["prompt_width"][i]), int(packed["response_width"][i])
        fields_: dict[str, Any] = {}
        for name in _PROMPT_FIELDS + _RESPONSE_FIELDS + _ROW_FIELDS:
            if name not in packed:
                continue
            value = packed[name][start:stop]
            if name in _PROMPT_FIELDS:
                value = value[:, value.shape[1] - pw:]
            elif name in _RESPONSE_FIELDS:
                value = value[:, :rw]
            fields_[name] = value.to(device, copy=True)
        buffer[int(key)] = Rollout(temperature=float(packed["temperature"][i]), **fields_)
        start = stop
    return buffer


# ================================================================================================ small helpers
class Stopwatch:
    """Wall-clock seconds per named section: ``with watch("policy_forward"): ...`` (sections do not nest).

    ``synchronize`` is called when a section starts and ends (default: ``torch.cuda.synchronize`` when CUDA is
    available, else nothing), so that GPU work queued in a section is charged to it rather than to the next one."""

    def __init__(self, synchronize: Any = "auto") -> None:
        self.seconds: dict[str, float] = {}
        if synchronize == "auto":
            synchronize = torch.cuda.synchronize if torch.cuda.is_available() else None
        self.synchronize = synchronize

    def __call__(self, name: str) -> _Section:
        return _Section(self.seconds, name, self.synchronize)


class _Section:
    """One timed ``with`` block of a :class:`Stopwatch` (a plain class: cheaper to enter than a contextmanager)."""

    __slots__ = ("name", "seconds", "start", "synchronize")

    def __init__(self, seconds: dict[str, float], name: str, synchronize: Any = None) -> None:
        self.seconds, self.name, self.start, self.synchronize = seconds, name, 0.0, synchronize

    def __enter__(self) -> None:
        if self.synchronize is not None:
            self.synchronize()
        self.start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        if self.synchronize is not None:
            self.synchronize()
        self.seconds[self.name] = self.seconds.get(self.name, 0.0) + (time.perf_counter() - self.start)


def _enumerable(world: World) -> bool:
    if not isinstance(world, ExactWorld):
        return False
    return world.vocab_size ** world.max_response_len <= MAX_ENUMERATION


def _clone(policy: Policy) -> Policy:
    return policy.clone() if isinstance(policy, ClonablePolicy) else copy.deepcopy(policy)


def _rewards(world: World, rollout: Rollout, gen: torch.Generator) -> Tensor:
    rewards = world.reward(rollout.prompt_index, rollout.response_ids, rollout.response_mask, generator=gen)
    return rewards.float().cpu()


def describe_defaults(config: TrainConfig, memory_plan: str | None = None) -> str:
    """One line naming the run, the defaults that depend on its policy (those it did not set) and the policy's
    memory plan."""
    resolved, filled = config.with_defaults()
    text = f"offpolicylab: {resolved.world} / {resolved.policy} / {resolved.objective} / {resolved.schedule}"
    if filled:
        text += f"; defaults for policy {resolved.policy}: " + ", ".join(f"{k}={v:g}" for k, v in filled.items())
    if memory_plan:
        text += f"; scoring: {memory_plan}"
    return text


PROGRESS_COLUMNS = ("reward_mean", "loss", "grad_norm", "response_len")


def progress_line(row: dict[str, Any], total: int, seconds: float) -> str:
    """``update 3/30  reward_mean 0.125  loss …  12.3 s``: the main training numbers of an update."""
    parts = [f"update {row['update'] + 1}/{total}"]
    parts += [f"{key} {row[key]:.4g}" for key in PROGRESS_COLUMNS if key in row]
    return "  ".join([*parts, f"{seconds:.1f} s"])


def eval_line(row: dict[str, Any], seconds: float) -> str:
    """``  eval  eval_reward_sampled 0.1  eval_reward_greedy 0.05  8.0 s``: the evaluation numbers of an update."""
    parts = [f"{key} {value:.4g}" for key, value in row.items()
             if key.startswith(("eval_", "exact_")) and value is not None and not math.isnan(value)]
    return "  ".join(["  eval", *parts, f"{seconds:.1f} s"])


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _progress(updates: range, total: int, start: int, enabled: bool | str) -> Any:
    if enabled not in (True, "bar"):
        return updates
    from tqdm.auto import tqdm

    return tqdm(updates, total=total, initial=start, unit="upd", dynamic_ncols=True, leave=False)
