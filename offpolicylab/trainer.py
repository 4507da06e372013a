"""The one update loop (docs/design.md, "One update"): a single run is a stack of one.

    schedule → rollouts → TokenBatch → objective → step → evaluation → run directory

As in vectorised RL libraries (Stable-Baselines3's ``VecEnv``, CleanRL's vector environments), :func:`run_updates`
trains a :class:`~offpolicylab.stack.Stack` of runs — one run (:func:`train`), or several seeds / objectives of one
configuration trained as one computation (:mod:`offpolicylab.batched`).  At update ``u`` (the policy's version is
``u``: it has taken ``u`` optimizer steps) it runs, in this order:

1. **collect**   the batches whose generating version is ``u`` are sampled now and buffered (:mod:`offpolicylab
                 .staleness`): ``policy.sample(prompts, G, temperature)`` records ``behavior_logp`` and
                 ``world.reward`` scores it (:func:`collect`, :func:`generate`).  Old weights are never kept — stale
                 data is data generated earlier, not a copy of an earlier policy.
2. **train**     the batch consumed at ``u`` is taken from the buffer (:func:`take`); ``policy.score`` gives ``logp``
                 (with grad) and ``entropy``; group-relative advantages, one per sequence: ``mean``
                 A_i = r_i − mean_{j∈g(i)} r_j (REC paper, Yao et al. 2025) or ``std`` A_i = (r_i − r̄)/(std_{j∈g(i)}
                 r_j + 1e-6), the Bessel-corrected std as verl computes it (GRPO, Shao et al. 2024, DeepSeekMath,
                 arXiv 2402.03300; :func:`group_advantages`); staleness = u − version per
                 sequence (:func:`make_batch`); ``objective.update(batch)``, then ``objective(batch)`` → loss,
                 metrics; backward, global-norm gradient clipping, optimizer step — skipped, and the run stopped, when
                 its loss or gradient is not finite (:func:`train_update`).
3. **evaluate**  every ``eval_every`` updates the sampled reward on ``world.eval_prompts()`` with its standard
                 error, the greedy reward, the sampled KL(π‖π_0) and, where the world is enumerable, the exact return
                 J(π) and KL(π‖π_0) (:func:`evaluate`).
4. **record**    collapse detection (:mod:`offpolicylab.diagnostics.collapse`), the metrics row, histogram samples,
                 events (:func:`record`) and the atomic checkpoint (:mod:`offpolicylab.runs`).

This module knows no concrete world or policy: it builds them through their registries and asks for optional
abilities through the protocols of :mod:`offpolicylab.contracts`.
"""

from __future__ import annotations

import contextlib
import copy
import cProfile
import json
import math
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from offpolicylab.behavior import check_correction, sample_rollout
from offpolicylab.config import TrainConfig, upgrade_config
from offpolicylab.contracts import (
    AdapterPolicy,
    ClonablePolicy,
    ExactWorld,
    GreedyPolicy,
    MemoryPlanningPolicy,
    Policy,
    Prompts,
    Rollout,
    TextPolicy,
    World,
)
from offpolicylab.diagnostics import stats
from offpolicylab.diagnostics.collapse import CollapseDetector
from offpolicylab.locations import physical_memory
from offpolicylab.objectives import LossOutput, Objective, TokenBatch, get_objective
from offpolicylab.objectives.regularization import check_entropy_gradient
from offpolicylab.policies import POLICIES, make_policy, policy_ability
from offpolicylab.profiling import LoopProfile, Stopwatch
from offpolicylab.progress import Progress, describe_run, update_warnings
from offpolicylab.proximal import proximal_logp
from offpolicylab.reference import reference_logp, uses_reference
from offpolicylab.resume import check_extension, config_changes, tail_key, watches_tail
from offpolicylab.runs import RunDir, RunError
from offpolicylab.samples import sample_arrays
from offpolicylab.stack import Run, Stack, make_optimizer
from offpolicylab.staleness import Schedule, parse_schedule
from offpolicylab.tracking import Tracker, check_installed, open_tracker, parse_report_to
from offpolicylab.worlds import WORLDS, make_world
from offpolicylab.worlds.exact import MAX_ENUMERATION, kl_divergence, sequence_logprobs

INITIAL_VERSION = 0

__all__ = ["Run", "Stack", "Stopwatch", "TrainingFailed", "build", "collect", "run_updates", "train",
           "train_update"]


class TrainingFailed(RuntimeError):
    """Training raised after the run directory was created (summary.json then says ``failed``)."""


@dataclass
class Step:
    """What one member's update computed before it is recorded: the consumed batch of all members (``joined``, one
    run each) and the member's run in it (``index``), the objective's output, the pre-clip gradient norm, the
    rollouts the current policy generated at this update, the consumed rollout (its token ids: completions.jsonl of
    a text policy) and whether the loss and gradient were finite."""

    joined: TokenBatch
    index: int
    output: LossOutput
    grad_norm: Tensor
    fresh: list[Rollout]
    rollout: Rollout
    finite: bool

    @property
    def batch(self) -> TokenBatch:
        """The member's consumed batch: its run's rows of ``joined`` (split for all members when first read)."""
        return self.joined.split()[self.index]


# ================================================================================================ the loop
def train(config: TrainConfig, run_dir: str | Path, *, resume: bool = False, progress: bool | str = False,
          stopwatch: Stopwatch | None = None, profile: bool = False) -> dict[str, Any]:
    """Train as ``config`` says, writing the run directory ``run_dir``; returns the summary.

    ``resume=True`` continues from ``run_dir``'s checkpoint (the metrics file then ends identical to an
    uninterrupted run).  Bad configuration raises ``ValueError`` before the directory is touched.  ``progress``:
    ``"bar"`` (or True) a tqdm bar on stderr, ``"lines"`` lines on stderr at most every few seconds (for logs;
    :mod:`offpolicylab.progress`), False nothing; either prints the run's settings first.  ``profile=True`` profiles
    the updates (:mod:`offpolicylab.profiling`), writes ``profile.txt`` and ``profile.pstats`` into the run directory
    and prints the section table and the top functions on stderr."""
    directory = RunDir(run_dir, fsync=config.fsync)
    if resume:  # nothing to resume: refused before the lock creates anything
        config = with_stored_plan(config, directory.read_config())
    run = build(config)
    with directory.locked():  # one writer per run directory
        start = open_run(directory, run, resume)
        if progress:
            log(describe_run(run.config, run.memory_plan))
        watch = stopwatch or Stopwatch()
        stack = Stack.one(run, directory)
        statuses = guarded(stack.directories, profile, lambda: run_updates(stack, start, watch, progress), watch,
                           start)
        return write_summary(directory, run, statuses[0])


def run_updates(stack: Stack, start: int, watch: Stopwatch, progress: bool | str) -> list[str]:
    """Updates ``start … updates − 1`` of every member of ``stack``; each member's final status (``completed``, or
    ``collapsed`` when its collapse detector fired or a step was not finite).  A member that stops (a non-finite
    step, or a collapse with ``stop_on_collapse``) leaves the stack; the others go on."""
    cfg = stack.config
    statuses: list[str | None] = [None] * len(stack)
    active = list(range(len(stack)))  # the original index of each member still in the stack
    labels = [f"[seed {run.config.seed}] " if stack.stacked else "" for run in stack.runs]
    clock = time.perf_counter()
    view = Progress(progress, cfg.updates, start)  # the console (progress.py)
    for update in range(start, cfg.updates):
        tick = time.perf_counter()
        fresh = collect(stack, update, watch)                                      # 1. collect
        steps = train_update(stack, update, fresh, watch)                          # 2. train
        rows = update_rows(stack.runs, update, steps)
        with watch("eval"):                                                        # 3. evaluate
            due = [step.finite and is_due(update, cfg.eval_every, cfg.updates) for step in steps]
            for row, numbers in zip(rows, evaluate_due(stack, update, due), strict=True):
                row.update(numbers)
        stopped = record_stack(stack, update, rows, steps, (tick, clock), watch)   # 4. record
        view.update(rows, [labels[i] for i in active],
                    update_warnings(rows, [run.detector.collapsed_at for run in stack.runs],
                                    [run.alarm for run in stack.runs]))
        save_checkpoints(stack, update, stopped, watch)
        for index in stopped:
            statuses[active[index]] = "collapsed"
        if stopped:
            kept = [index for index in range(len(stack)) if index not in stopped]
            if not kept:
                break
            stack = stack.keep(kept)
            active = [active[index] for index in kept]
    view.close()
    for index, run in zip(active, stack.runs, strict=True):
        statuses[index] = statuses[index] or final_status(run)
    return [status or "completed" for status in statuses]


def record_stack(stack: Stack, update: int, rows: list[dict[str, Any]], steps: list[Step],
                 clocks: tuple[float, float], watch: Stopwatch) -> list[int]:
    """Each member's :func:`record`; the indices of the members that stop here (their adapters saved)."""
    stopped = []
    for index, (run, directory, row, step) in enumerate(zip(stack.runs, stack.directories, rows, steps,
                                                            strict=True)):
        if record(run, directory, update, row, step, clocks, watch):
            stopped.append(index)
            save_adapter(run, directory)
    return stopped


def save_checkpoints(stack: Stack, update: int, stopped: list[int], watch: Stopwatch) -> None:
    """When due, the checkpoint of each member that goes on (its optimizer state is its slice of the stack's)."""
    if not is_checkpoint_due(stack.config, update):
        return
    with watch("checkpoint"):
        for index, (run, directory) in enumerate(zip(stack.runs, stack.directories, strict=True)):
            if index not in stopped:
                directory.save_checkpoint(checkpoint_state(run, update + 1, stack.member_optimizer(index),
                                                           stack.rng_state(index)))
                save_adapter(run, directory)


# ================================================================================================ 1. collect
def collect(stack: Stack, update: int, watch: Stopwatch) -> list[list[Rollout]]:
    """Generate the batches the schedule asks for at ``update`` into every member's buffer (the members' batches are
    due together: one schedule), and, in a stale queue's drained tail, one batch for the collapse detector alone,
    kept in the buffer under the key a longer run trains it as, so that ``--resume --updates N`` extends the run
    exactly (:mod:`offpolicylab.resume`); each member's rollouts generated now (with dynamic sampling: every
    rollout it sampled)."""
    keys, tail = batches_due(stack.runs[0], update)
    for run in stack.runs:
        run.sampled, run.dynamic_counts = [], [0, 0, 0]
    generated = [generate(stack, update, watch) for _ in range(len(keys) + tail)]
    fresh = [[batch[index] for batch in generated] for index in range(len(stack))]
    key = tail_key(stack.runs[0].schedule, update) if tail else None
    for run, own in zip(stack.runs, fresh, strict=True):
        run.buffer.update(zip(keys, own, strict=False))
        if key is not None:  # trained on if the run is extended
            run.buffer[key] = own[-1]
    return [run.sampled if run.config.dynamic_sampling else own for run, own in zip(stack.runs, fresh, strict=True)]


def batches_due(run: Run, update: int) -> tuple[list[int], bool]:
    """(the buffer keys of the batches generated at ``update``, whether the current policy also generates a batch
    only for the collapse detector: :func:`watches_tail`)."""
    cfg, schedule = run.config, run.schedule
    keys = list(schedule.generate_at(update, cfg.updates))
    return keys, bool(cfg.collapse_tail and not keys and watches_tail(schedule, update, cfg.updates))


def take(run: Run, update: int) -> Rollout:
    """The batch consumed at ``update``; batches the schedule never needs again leave the buffer."""
    rollout = run.buffer[run.schedule.key(update)]
    for key in run.schedule.release_after(update, run.config.updates):
        run.buffer.pop(key, None)
    return rollout


def generate(stack: Stack, version: int, watch: Stopwatch) -> list[Rollout]:
    """One batch per member: ``prompts_per_update`` prompts × ``group_size`` responses with rewards and versions
    (with ``dynamic_sampling``, which a stack of one uses: :func:`dynamic_batch`)."""
    if stack.config.dynamic_sampling:
        return [dynamic_batch(stack, version, watch)]
    return sample_batches(stack, version, watch)


def sample_batches(stack: Stack, version: int, watch: Stopwatch, shaped: bool = True) -> list[Rollout]:
    """One sampled batch per member with the world's rewards (plus the overlong punishment unless
    ``shaped=False``): the stack's policy samples every member's prompts at once, each member's rows with its own
    generator, so each member draws what its separate run draws, in the same order.  A world whose rewards are
    row-wise (:func:`rewards_joined`) scores every member's rows in one call."""
    runs, pieces = stack.runs, [[] for _ in stack.runs]
    generators = stack.generators([run.generator for run in runs])
    joined = rewards_joined(stack)
    for is_initial, count, tag in batch_sources(runs[0], version):
        prompts = Prompts.concat([run.world.sample_prompts(count, run.generator) for run in runs])
        policy = stack.initial if is_initial else stack.policy
        with watch("policy_forward"):
            rollout = stamped(sample(policy, prompts, stack.config, generators), tag)
        if joined:
            with watch("other"):
                rollout = rollout.with_(rewards=rewards_of(runs[0].world, rollout, runs[0].generator))
        for own, block in zip(pieces, rollout.split(len(stack)), strict=True):
            own.append(block)
    with watch("other"):
        return [with_rewards(run, Rollout.concat(own), shaped=shaped, scored=joined)
                for run, own in zip(runs, pieces, strict=True)]


def rewards_joined(stack: Stack) -> bool:
    """The stack's rows are scored in one reward call: several members whose world declares ``rowwise_reward`` (a
    row's reward reads that row alone and draws nothing, so each row's reward is the one its member's own call
    gives, bit for bit; the members' worlds are one configuration)."""
    return len(stack) > 1 and getattr(stack.runs[0].world, "rowwise_reward", False)


def dynamic_batch(stack: Stack, version: int, watch: Stopwatch) -> Rollout:
    """DAPO's dynamic sampling (Yu et al. 2025, arXiv:2503.14476, eq. 11: keep a group only if
    0 < |{o_i correct}| < G) for a stack of one: sample batches, keep the groups whose world rewards are not all
    equal, until ``prompts_per_update`` groups are kept or ``dynamic_sampling_max_batches`` rounds were sampled; the
    first ``prompts_per_update`` kept groups form the batch, filled when short with equal-reward groups in the order
    they were sampled.  The rewards compared are the world's, before the overlong punishment (DAPO filters on
    accuracy); the batch returned carries the punishment."""
    (run,) = stack.runs
    cfg, kept, equal = run.config, [], []
    while len(run.sampled) - run.dynamic_counts[0] < cfg.dynamic_sampling_max_batches:
        (rollout,) = sample_batches(stack, version, watch, shaped=False)
        run.sampled.append(with_overlong_penalty(run, rollout))
        varied = varied_rows(rollout.rewards, rollout.group_ids)
        kept.append(rollout.select(varied.nonzero().squeeze(1)))
        equal.append(rollout.select((~varied).nonzero().squeeze(1)))
        groups = int(rollout.group_ids.max()) + 1
        run.dynamic_counts = [run.dynamic_counts[0], run.dynamic_counts[1] + groups,
                              run.dynamic_counts[2] + group_count(kept[-1])]
        if sum(group_count(part) for part in kept) >= cfg.prompts_per_update:
            break
    rounds = len(run.sampled) - run.dynamic_counts[0]
    run.dynamic_counts[0] += rounds
    parts = [part for part in kept + equal if len(part)]
    return with_overlong_penalty(run, first_groups(Rollout.concat(parts), cfg.prompts_per_update))


def varied_rows(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """[B] bool: the row's group has rewards that are not all equal (max > min)."""
    groups = int(group_ids.max()) + 1
    high = rewards.new_full((groups,), -math.inf).scatter_reduce(0, group_ids, rewards, "amax")
    low = rewards.new_full((groups,), math.inf).scatter_reduce(0, group_ids, rewards, "amin")
    return (high > low)[group_ids]


def group_count(rollout: Rollout) -> int:
    return int(rollout.group_ids.unique().numel()) if len(rollout) else 0


def first_groups(rollout: Rollout, count: int) -> Rollout:
    """The rows of ``rollout``'s first ``count`` groups (in row order), group ids renumbered 0 … count − 1."""
    _, order = torch.unique_consecutive(rollout.group_ids, return_inverse=True)
    rows = (order < count).nonzero().squeeze(1)
    return rollout.select(rows).with_(group_ids=order[rows])


def batch_sources(run: Run, version: int) -> list[tuple[bool, int, int]]:
    """(answered by π_0, prompts, version tag) of each part of a batch: the current policy answers every prompt
    but a share ``schedule.other_share``, which the frozen initial policy π_0 answers (version 0)."""
    cfg = run.config
    other = round(run.schedule.other_share * cfg.prompts_per_update)
    parts = [(False, cfg.prompts_per_update - other, version), (True, other, INITIAL_VERSION)]
    return [part for part in parts if part[1] > 0]


def sample(policy: Policy, prompts: Any, config: TrainConfig, generator: Any) -> Rollout:
    """``policy.sample`` of ``prompts`` (``generator``: one, or one per row block of a stacked policy), with
    ``behavior_logp`` from ``config.behavior_logp``: the trainer's numbers or the sampler's
    (:func:`offpolicylab.behavior.sample_rollout`)."""
    return sample_rollout(policy, prompts, config.group_size, config.temperature, generator, config.behavior_logp)


def stamped(rollout: Rollout, version: int) -> Rollout:
    """``rollout`` with every row's generating version set to ``version``."""
    return rollout.with_(version=torch.full((len(rollout),), version, dtype=torch.long,
                                            device=rollout.response_ids.device))


def with_rewards(run: Run, rollout: Rollout, shaped: bool = True, scored: bool = False) -> Rollout:
    """``rollout`` scored by the world (the run's generator serves worlds whose rewards are random; ``scored``: its
    rewards are already the world's), plus the overlong punishment (:func:`with_overlong_penalty`) unless
    ``shaped=False``."""
    if not scored:
        rollout = rollout.with_(rewards=rewards_of(run.world, rollout, run.generator))
    return with_overlong_penalty(run, rollout) if shaped else rollout


def with_overlong_penalty(run: Run, rollout: Rollout) -> Rollout:
    """``rollout`` with :func:`overlong_penalty` of its response lengths added to its rewards (unchanged when
    ``overlong_buffer`` is 0)."""
    if not run.config.overlong_buffer:
        return rollout
    penalty = overlong_penalty(rollout.response_mask.sum(-1), *overlong_settings(run))
    return rollout.with_(rewards=rollout.rewards + penalty.to(rollout.rewards.dtype))


def overlong_settings(run: Run) -> tuple[int, int, float]:
    """(L_max, L_cache, penalty factor) of the run's overlong punishment."""
    cfg = run.config
    max_len = cfg.overlong_max_len if cfg.overlong_max_len is not None else run.world.max_response_len
    return max_len, cfg.overlong_buffer, cfg.overlong_penalty


def overlong_penalty(lengths: Tensor, max_len: int, cache: int, factor: float = 1.0) -> Tensor:
    """R_length(y) = 0 for |y| ≤ L_max − L_cache;  ((L_max − L_cache) − |y|)/L_cache · c for L_max − L_cache < |y|
    ≤ L_max;  −c for |y| > L_max — DAPO's soft overlong punishment (Yu et al. 2025, "DAPO: An Open-Source LLM
    Reinforcement Learning System at Scale", arXiv:2503.14476, eq. 13; c = 1 there, verl's penalty_factor),
    ``lengths`` = |y| the response tokens (EOS included)."""
    lengths = lengths.to(torch.float64)
    expected = max_len - cache
    ramp = torch.clamp((expected - lengths) / cache, max=0.0) if cache else torch.zeros_like(lengths)
    return torch.where(lengths > max_len, torch.full_like(ramp, -1.0), ramp) * factor


# ================================================================================================ 2. train
def train_update(stack: Stack, update: int, fresh: list[list[Rollout]], watch: Stopwatch) -> list[Step]:
    """The train phase of ``update``: each member's consumed batch scored by the stack's policy in one forward
    (:func:`make_batch`), each member's loss (:func:`compute_loss`: one call for the members of an
    :func:`objective_groups` group), one backward of Σ_s loss_s, each member's gradient clipped by its own global
    norm (:meth:`~offpolicylab.stack.Stack.clip_gradients`), and one optimizer step unless no member's loss and
    gradient are finite (a non-finite member stops; its slice is left behind)."""
    rollouts = [take(run, update) for run in stack.runs]
    joined = Rollout.concat(rollouts)
    with watch("policy_forward"):
        logp, entropy = stack.policy.score(joined)
    with watch("other"):
        whole = make_batch(stack, rollouts, joined, logp, entropy, update)
    with watch("objective"):
        outputs = [output for start, stop in objective_groups(stack.runs, whole)
                   for output in compute_loss(stack.runs[start], whole.part(start, stop), update).split(stop - start)]
    with watch("policy_backward"):
        stack.optimizer.zero_grad(set_to_none=True)
        losses = torch.stack([output.loss for output in outputs])
        scaler = getattr(stack.policy, "loss_scaler", None)
        if scaler is not None:
            return scaled_step(stack, scaler, losses, outputs, fresh, rollouts, whole)
        losses.sum().backward()
        norms = stack.clip_gradients(stack.config.grad_clip)
        finite = (torch.isfinite(losses.detach()) & torch.isfinite(torch.stack(norms))).tolist()
        if any(finite):
            stack.optimizer.step()
    return [Step(whole, index, *parts) for index, parts in enumerate(zip(outputs, norms, fresh, rollouts, finite,
                                                                         strict=True))]


def scaled_step(stack: Stack, scaler: torch.amp.GradScaler, losses: Tensor, outputs: list[LossOutput],
                fresh: list[list[Rollout]], rollouts: list[Rollout], whole: TokenBatch) -> list[Step]:
    """The backward and step of a loss-scaled (fp16) stack of one, as ``torch.amp.GradScaler`` runs them: backward of
    S · loss, gradients divided by S, clipped, the step taken only if they are finite (else skipped and S halved);
    an overflow skips the step without stopping the run, a non-finite loss stops it."""
    scaler.scale(losses.sum()).backward()
    scaler.unscale_(stack.optimizer)
    norms = stack.clip_gradients(stack.config.grad_clip)
    finite = torch.isfinite(losses.detach()).tolist()
    if all(finite):
        scaler.step(stack.optimizer)
        scaler.update()
    return [Step(whole, index, *parts) for index, parts in enumerate(zip(outputs, norms, fresh, rollouts, finite,
                                                                         strict=True))]


def objective_groups(runs: list[Run], batch: TokenBatch) -> list[tuple[int, int]]:
    """The members as consecutive groups ``[start, stop)`` whose losses one objective call computes: members with
    equal objectives (one kind, the same parameters) that join runs (:attr:`Objective.joins_runs`: each run's loss
    and metrics its own, every reduction per run), while a member's block holds at most ``stats.ROW_LIMIT`` tokens
    (so that each run's sums are its own call's, bit for bit); every other member is a group of one."""
    small = batch.logp.numel() // batch.runs <= stats.ROW_LIMIT
    groups: list[tuple[int, int]] = []
    for index, run in enumerate(runs):
        if groups and small and same_objective(runs[groups[-1][0]].objective, run.objective):
            groups[-1] = (groups[-1][0], index + 1)
        else:
            groups.append((index, index + 1))
    return groups


def same_objective(first: Objective, other: Objective) -> bool:
    """One call of ``first`` computes ``other``'s loss too: both join runs, are of one kind with the same parameters
    and response limit."""
    return (getattr(first, "joins_runs", False) and type(first) is type(other) and first.config == other.config
            and first.response_limit == other.response_limit)


def make_batch(stack: Stack, rollouts: list[Rollout], joined: Rollout, logp: Tensor, entropy: Tensor,
               update: int) -> TokenBatch:
    """The members' objective input, one run each (``TokenBatch.runs`` = S; member s's batch is its row block,
    ``.split()``): per-token ``logp`` (with grad) and ``entropy`` of the rollouts' tokens (``joined``), the behaviour
    log-probs, each member's group-relative advantages (:func:`group_advantages`, its run's estimator), each
    sequence's staleness at ``update``, log π_prox for an objective that reads it (:func:`proximal_of`) and, when an
    objective has a KL penalty, π_0's log-probs of the tokens (:func:`~offpolicylab.reference.reference_logp`)."""
    runs, own_logp = stack.runs, stack.split(logp)
    estimators = {run.advantage for run in runs}
    if len(estimators) == 1:  # the joined groups are distinct: one call computes every member's advantages
        advantages = group_advantages(joined.rewards, joined.group_ids, estimators.pop())
    else:
        advantages = torch.cat([group_advantages(rollout.rewards, rollout.group_ids, run.advantage)
                                for run, rollout in zip(runs, rollouts, strict=True)])
    proximal = [proximal_of(run, own, update) for run, own in zip(runs, own_logp, strict=True)]
    prox_logp = None if all(p is None for p in proximal) else torch.cat(
        [own.detach() if p is None else p for p, own in zip(proximal, own_logp, strict=True)])
    whole = token_batch(joined, logp, entropy, advantages, update, prox_logp, len(stack))  # S runs
    reference = reference_logp(stack.initial, joined, [run.objective for run in runs])  # the KL penalty's π_ref
    return whole if reference is None else whole.replace(ref_logp=reference)


#: The group-relative advantage estimators: name → (divide by the group's std, Bessel's correction, ε).
#: ``std`` is verl's ``compute_grpo_outcome_advantage`` (``torch.std``, unbiased, + 1e-6), ``std_trl`` TRL's GRPO
#: trainer (``nanstd``, unbiased, + 1e-4), ``std_population`` the population std (÷ n) + 1e-6.
ESTIMATORS: dict[str, tuple[bool, bool, float]] = {
    "mean": (False, False, 0.0), "std": (True, True, 1e-6), "std_trl": (True, True, 1e-4),
    "std_population": (True, False, 1e-6),
}


def group_advantages(rewards: Tensor, group_ids: Tensor, estimator: str = "std") -> Tensor:
    """A_i = r_i − r̄_{g(i)} (``mean``; the REC paper, Yao et al. 2025), or ÷ (s_{g(i)} + ε) for the std estimators
    (GRPO, Shao et al. 2024, DeepSeekMath, arXiv 2402.03300) as the engines compute it: ``std`` is verl's
    (``compute_grpo_outcome_advantage``: s = ``torch.std``, Bessel's correction s² = Σ (r − r̄)² / (n − 1),
    ε = 1e-6), ``std_trl`` TRL's (``GRPOTrainer``: ``nanstd``, also Bessel-corrected, ε = 1e-4), ``std_population``
    the population std s² = Σ (r − r̄)² / n with ε = 1e-6 (:data:`ESTIMATORS`).

    A group whose rewards are all equal (a group of one included) gets A = 0 exactly, as the formula gives (and as
    both engines give when the rewards are exactly representable): a float32 mean can miss the common value by an
    ulp (three rewards of 0.9 sum to 2.6999998), and that residue divided by s + ε ≈ 1e-6 would be an advantage of
    ≈ −0.007 for every response of the group (verl's ``torch.mean`` leaves the same residue).  For a group of one,
    where the unbiased std is undefined (TRL: NaN; verl: mean 0, std 1, A = r), A = 0: it carries no relative
    information."""
    divide, bessel, eps = ESTIMATORS[estimator]
    if rewards.numel() == 0:
        return rewards.clone()
    groups = int(group_ids.max()) + 1
    zeros = rewards.new_zeros(groups)
    count = zeros.index_add(0, group_ids, torch.ones_like(rewards))
    mean = zeros.index_add(0, group_ids, rewards) / count
    low = torch.full_like(zeros, math.inf).scatter_reduce(0, group_ids, rewards, "amin")
    high = torch.full_like(zeros, -math.inf).scatter_reduce(0, group_ids, rewards, "amax")
    centered = torch.where((low == high)[group_ids], torch.zeros_like(rewards), rewards - mean[group_ids])
    if not divide:
        return centered
    var = zeros.index_add(0, group_ids, centered**2) / ((count - 1).clamp_min(1) if bessel else count)
    return centered / (var.sqrt()[group_ids] + eps)


def proximal_of(run: Run, logp: Tensor, update: int) -> Tensor | None:
    """log π_prox of the batch consumed at ``update`` for an objective that reads it (decoupled PPO:
    :func:`offpolicylab.proximal.proximal_logp`), else None."""
    if not getattr(run.objective, "needs_prox", False):  # wrappers around an objective may not declare it
        return None
    return proximal_logp(run.objective, run.schedule, run.buffer, run.policy, update, run.config.updates, logp)


def token_batch(rollout: Rollout, logp: Tensor, entropy: Tensor, advantages: Tensor, update: int,
                prox_logp: Tensor | None = None, runs: int = 1) -> TokenBatch:
    """The :class:`TokenBatch` of ``rollout`` (``runs`` runs' rollouts joined) with the given log-probs, entropies,
    advantages (and log π_prox)."""
    return TokenBatch(
        logp=logp, behavior_logp=rollout.behavior_logp, advantages=advantages, mask=rollout.response_mask,
        rewards=rollout.rewards, group_ids=rollout.group_ids, sampler_logp=rollout.sampler_logp, entropy=entropy,
        staleness=(update - rollout.version).to(torch.float32), prox_logp=prox_logp, runs=runs,
    )


def compute_loss(run: Run, batch: TokenBatch, update: int) -> LossOutput:
    """``objective.update(batch)`` (stateful objectives), then the loss — with the metrics when they are due
    (every ``metrics_every`` updates and at the last; the loss and gradient are the same either way); for a batch of
    several runs (an :func:`objective_groups` group) each run's loss and metrics, :meth:`LossOutput.split`."""
    run.objective.update(batch)
    if is_due(update, run.config.metrics_every, run.config.updates):
        return run.objective(batch)
    return run.objective(batch, metrics=False)


def update_rows(runs: list[Run], update: int, steps: list[Step]) -> list[dict[str, Any]]:
    """The metrics row of each run's update before evaluation: the update, the step's numbers and the current
    policy's own reward (:func:`scalars`, one host transfer for all)."""
    current = [own_reward(step.fresh, update, run.schedule.other_share == 0) for run, step in zip(runs, steps,
                                                                                                   strict=True)]
    rows = [{"update": update, **own} for own in scalars(steps, current)]
    for run, step, row in zip(runs, steps, rows, strict=True):
        row.update(shaping_columns(run, step))
    return rows


def shaping_columns(run: Run, step: Step | None) -> dict[str, float]:
    """The columns of the DAPO options that are on: ``overlong_penalty`` (mean punishment in the consumed batch's
    rewards; only this column reads the step's batch), ``dynamic_rounds`` (batches sampled at this update) and
    ``dynamic_kept_frac`` (share of their groups with rewards not all equal; NaN when none was sampled)."""
    cfg, out = run.config, {}
    if cfg.overlong_buffer:
        lengths = step.batch.mask.sum(-1)
        out["overlong_penalty"] = float(overlong_penalty(lengths, *overlong_settings(run)).mean())
    if cfg.dynamic_sampling:
        rounds, groups, kept = run.dynamic_counts
        out["dynamic_rounds"] = float(rounds)
        out["dynamic_kept_frac"] = kept / groups if groups else math.nan
    return out


def record(run: Run, directory: RunDir, update: int, row: dict[str, Any], step: Step, clocks: tuple[float, float],
           watch: Stopwatch) -> bool:
    """Collapse detection, the metrics row, events and samples of one update; whether the run stops here (a
    non-finite step, or a collapse with ``stop_on_collapse``)."""
    cfg, (tick, clock), finite = run.config, clocks, step.finite
    with watch("other"):
        now = time.perf_counter()
        row.update(time_update_s=now - tick, time_elapsed_s=now - clock)
        reason = (run.detector.non_finite(update) if not finite else
                  run.detector.observe(update, detector_reward(row, run.schedule), row.get("kl_k3"),
                                       row["grad_norm"]))
        directory.append_metrics(row)
        alarm = run.warning.observe(update, row) if finite else None
        if alarm is not None:
            run.alarm = (update, alarm)
            directory.event("warning", update, detector=run.warning.name, reason=alarm)
        if not finite:
            directory.event("non_finite_loss", update, loss=row["loss"], grad_norm=row["grad_norm"])
        if reason is not None:
            directory.event("collapse", update, reason=reason)
        if cfg.sample_every and update % cfg.sample_every == 0:
            directory.write_samples(update, sample_arrays(step.batch, step.output.token_mask, cfg.seed, update))
            if isinstance(run.policy, TextPolicy):
                write_completions(directory, update, completions(run.policy, step.rollout, step.batch))
    return not finite or (reason is not None and cfg.stop_on_collapse)


def completions(policy: TextPolicy, rollout: Rollout, batch: TokenBatch) -> list[dict[str, Any]]:
    """One record per response of the consumed batch: prompt and response text, reward, advantage, staleness (updates
    since its policy generated it), the generating version and its group (prompt row)."""
    prompts = policy.decode(rollout.prompt_ids, rollout.prompt_mask)
    responses = policy.decode(rollout.response_ids, rollout.response_mask)
    advantages = batch.advantages if batch.advantages.dim() == 1 else batch.advantages[:, 0]
    numbers = zip(rollout.rewards.tolist(), advantages.detach().tolist(), batch.staleness.tolist(),
                  rollout.version.tolist(), rollout.group_ids.tolist(), strict=True)
    return [{"prompt": prompt, "response": response, "reward": short(reward), "advantage": short(advantage),
             "staleness": int(staleness), "version": version, "group": group}
            for prompt, response, (reward, advantage, staleness, version, group) in zip(prompts, responses, numbers,
                                                                                       strict=True)]


def short(value: float) -> float:
    """A float32 number as the shortest decimal that reads back as the same float32 (0.1, not 0.10000000149)."""
    return float(str(np.float32(value)))


def write_completions(directory: RunDir, update: int, records: list[dict[str, Any]]) -> Path:
    """``samples/completions_<update>.jsonl``: one JSON object per line (written whole, then renamed into place)."""
    directory.samples_dir.mkdir(exist_ok=True)
    path = directory.samples_dir / f"completions_{update:06d}.jsonl"
    staging = path.with_name(path.name + ".partial")
    staging.write_text("".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records),
                       encoding="utf-8")
    staging.replace(path)
    return path


ADAPTER_DIR = "adapter"


def save_adapter(run: Run, directory: RunDir) -> None:
    """``RUN/adapter``: the policy's adapter in its library's own format (hf: a peft folder), replaced whole at
    every checkpoint and when the run ends (staged and swapped inside ``checkpoint/``); nothing for other policies."""
    if not isinstance(run.policy, AdapterPolicy):
        return
    folder = directory.checkpoint_path.parent
    staging, old, final = folder / "adapter.staging", folder / "adapter.old", directory.path / ADAPTER_DIR
    for leftover in (staging, old):
        shutil.rmtree(leftover, ignore_errors=True)
    folder.mkdir(exist_ok=True)
    run.policy.save_adapter(staging)
    if final.exists():
        final.rename(old)
    staging.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def is_checkpoint_due(config: TrainConfig, update: int) -> bool:
    return (update + 1) % config.checkpoint_every == 0 or update + 1 == config.updates


def final_status(run: Run) -> str:
    return "collapsed" if run.detector.collapsed_at >= 0 else "completed"


def guarded(directories: list[RunDir], profile: bool, updates: Any, watch: Stopwatch, start: int) -> list[str]:
    """``updates()`` (the statuses of a loop over the runs writing ``directories``), profiled when asked; a
    failure is recorded in every directory and raised as :class:`TrainingFailed`; the directories are closed."""
    try:
        if not profile:
            return updates()
        profiler, clock = cProfile.Profile(), time.perf_counter()
        profiler.enable()
        try:
            statuses = updates()
        finally:
            profiler.disable()
        done = len(directories[0].read_metrics()) - start
        loop = LoopProfile(done, time.perf_counter() - clock, dict(watch.seconds), profiler)
        for directory in directories:
            directory.write_profile(loop.report(), loop.stats_bytes())
        log(loop.short() + f"\n(full profile: {', '.join(str(d.profile_path) for d in directories)})")
        return statuses
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        for directory in directories:
            record_failure(directory, error)
        raise TrainingFailed(f"run {', '.join(str(d.path) for d in directories)} failed: {error}") from exc
    finally:
        for directory in directories:
            with contextlib.suppress(OSError):  # closing flushes; a full disk already failed the run
                directory.close()


def write_summary(directory: RunDir, run: Run, status: str) -> dict[str, Any]:
    return directory.write_summary(status, collapse_update=run.detector.collapsed_at, **exact_optimum(run.world))


def record_failure(directory: RunDir, error: str) -> None:
    """The ``failed`` event and summary, as far as they can be written (on a full disk they may not be)."""
    with contextlib.suppress(OSError):
        directory.event("failed", -1, error=error)
    with contextlib.suppress(OSError):
        directory.write_summary("failed", error=error)


# ================================================================================================ building
def build(config: TrainConfig) -> Run:
    """World, policy, objective, schedule and optimizer of ``config``; any bad name or value raises
    ``ValueError``."""
    config, _ = config.with_defaults()
    schedule = parse_schedule(config.schedule)
    objective = get_objective(config.objective, **config.objective_params)
    world = make_world(config.world, **config.world_params)
    objective.response_limit = world.max_response_len  # dr_grpo's constant when agg_norm is none
    check_memory(config, world)
    check_overlong(config, world)
    torch.manual_seed(config.seed)
    policy = make_policy(config.policy, world, **config.policy_params)
    config, memory_plan = plan_memory(config, world, policy)
    enumerable = is_enumerable(world)
    keep_initial = schedule.other_share > 0 or enumerable or tracks_kl_init(config) or uses_reference([objective])
    check_entropy_gradient(objective, policy)
    check_correction(objective, policy, config.behavior_logp)
    check_installed(parse_report_to(config.report_to))  # a missing tracker library: refused before any file
    return Run(
        config=config, world=world, policy=policy, objective=objective, schedule=schedule,
        optimizer=make_optimizer(config, policy.trainable_parameters()),
        generator=torch.Generator().manual_seed(config.seed),
        detector=CollapseDetector(margin=config.collapse_margin, gain_fraction=config.collapse_gain_fraction,
                                  spike=config.collapse_spike, window=config.collapse_window),
        advantage=advantage_used(config, objective),
        initial=frozen_copy(policy) if keep_initial else None, enumerable=enumerable, memory_plan=memory_plan,
    )


def advantage_used(config: TrainConfig, objective: Objective) -> str:
    """The advantage estimator a run uses: ``config.advantage``, or for ``auto`` the objective's paper's choice."""
    return objective.advantage if config.advantage == "auto" else config.advantage


def check_memory(config: TrainConfig, world: World, runs: int = 1) -> None:
    """Refuse a batch that cannot fit in this machine's memory, before anything is allocated.

    A lower bound: the rollout of one update alone holds, per response token, its id (8 bytes), mask, behaviour
    log-prob, current log-prob and entropy (4 bytes each), i.e. runs × rows × T × 24 bytes with rows =
    prompts_per_update × group_size, T the longest response and ``runs`` the runs trained as one computation; it is
    compared with the physical memory.  A policy that plans its own scoring memory adds its check in
    :func:`plan_memory`."""
    rows = config.prompts_per_update * config.group_size * runs
    tokens = rows * int(world.max_response_len)
    need = tokens * 24
    total = physical_memory()
    if config.eval_samples is not None:  # the evaluation samples eval_samples responses per held-out prompt
        eval_rows = len(world.eval_prompts()) * config.eval_samples * runs
        eval_need = eval_rows * int(world.max_response_len) * 24
        if eval_need > total:
            raise ValueError(f"eval_samples={config.eval_samples:,} × {eval_rows // (config.eval_samples * runs):,} "
                             f"evaluation prompts{f' × {runs} seeds' if runs > 1 else ''} = {eval_rows:,} responses "
                             f"need at least {eval_need / 2**30:,.1f} GiB but this machine has "
                             f"{total / 2**30:,.1f} GiB; valid: a smaller eval_samples")
    if need > total:
        what = f"{runs} seeds × " if runs > 1 else ""
        raise ValueError(f"{what}prompts_per_update × group_size = {rows:,} responses ({tokens:,} tokens) need at "
                         f"least {need / 2**30:,.1f} GiB but this machine has {total / 2**30:,.1f} GiB; valid: a "
                         f"smaller prompts_per_update or group_size{' or fewer seeds' if runs > 1 else ''}")


def plan_memory(config: TrainConfig, world: World, policy: Policy) -> tuple[TrainConfig, str | None]:
    """(config with the policy's memory plan for scoring one update's batch recorded in ``policy_params``, the plan
    as text); unchanged for policies that do not plan (:class:`~offpolicylab.contracts.MemoryPlanningPolicy`).

    Recording the plan in config.json makes a resume score exactly as the original run did."""
    if not isinstance(policy, MemoryPlanningPolicy):
        return config, None
    rows = config.prompts_per_update * config.group_size
    longest = getattr(world, "longest_prompt_tokens", None)
    plan = policy.plan_scoring(rows, int(longest() if longest else getattr(world, "max_prompt_tokens", 0)))
    return replace(config, policy_params={**config.policy_params, **plan.params()}), plan.describe()


def with_stored_plan(config: TrainConfig, stored: dict[str, Any]) -> TrainConfig:
    """``config`` with the memory plan a run recorded in its config.json (``stored``) for the policy options that
    ``config`` leaves unset, so that a resume scores as the original run did whatever memory is free now."""
    if stored.get("policy") != config.policy:
        return config
    names = policy_ability(config.policy, "planned_params", ())
    planned = {k: v for k, v in stored.get("policy_params", {}).items()
               if k in names and k not in config.policy_params}
    return replace(config, policy_params={**config.policy_params, **planned}) if planned else config


def check_overlong(config: TrainConfig, world: World) -> None:
    """``ValueError`` unless the overlong punishment's buffer fits in its L_max (DAPO: 4096 of 20480 tokens)."""
    max_len = config.overlong_max_len if config.overlong_max_len is not None else world.max_response_len
    if config.overlong_buffer > max_len:
        raise ValueError(f"overlong_buffer={config.overlong_buffer} exceeds the overlong punishment's L_max={max_len} "
                         f"(overlong_max_len, default the world's max_response_len); valid: overlong_buffer <= "
                         f"{max_len}")


def is_enumerable(world: World) -> bool:
    if not isinstance(world, ExactWorld):
        return False
    return world.vocab_size ** world.max_response_len <= MAX_ENUMERATION


def frozen_copy(policy: Policy) -> Policy:
    return policy.clone() if isinstance(policy, ClonablePolicy) else copy.deepcopy(policy)


def tracks_kl_init(config: TrainConfig) -> bool:
    """Whether evaluation estimates KL(π‖π_0) from its samples: ``eval_kl_init`` on, or auto and a policy kind that
    keeps a frozen copy by default (not a large model, whose copy would double its memory unless asked for)."""
    return config.eval_kl_init == "on" or (
        config.eval_kl_init == "auto" and policy_ability(config.policy, "frozen_copy", True))


# ================================================================================================ run directory
def open_run(directory: RunDir, run: Run, resume: bool, tracker: Tracker | None | bool = True) -> int:
    """Create the run directory (fresh run) or restore the checkpoint (resume); returns the first update to do.
    The run's trackers (``--report-to``) are opened first, before any file is written, unless ``tracker`` gives
    them already opened (:func:`open_trackers`; None: no tracker)."""
    if tracker is True:
        tracker = open_trackers([directory], [run], resume)[0]
    resolved = resolve_config(run.config, run.objective)
    if not resume:
        directory.create(resolved)
        directory.tracker = tracker
        return 0
    stored = directory.read_config()
    state = checked_resume(directory, resolved, run.config)
    start = 0 if state is None else int(state["next_update"])
    if state is None:  # killed before the first checkpoint: start over
        directory.truncate_metrics(0)
    else:
        restore_state(run, state)
        directory.truncate_metrics(start, state)
        replay_warning(run, directory.read_metrics())
    if directory.read_summary() is not None:  # a failed run goes on from its last checkpoint, an extended one too
        directory.summary_path.unlink()
    extended = stored["updates"] != resolved["updates"]
    if stored != resolved:  # another --updates (an extension) or --report-to: config.json says what runs now
        directory.write_config(resolved, directory.read_environment())
    directory.event("extend" if extended else "resume", start,
                    **({} if state else {"note": "no checkpoint yet, restarting"}),
                    **({"updates_before": stored["updates"]} if extended else {}))
    directory.tracker = tracker
    return start


def open_trackers(directories: list[RunDir], runs: list[Run], resume: bool) -> list[Tracker | None]:
    """The trackers of every run (``--report-to``), opened before any run file is written — after the checks
    that refuse a fresh run in a folder that holds one, or a resume — so that a tracker that cannot be opened
    leaves every run directory as it was (one line, :class:`~offpolicylab.tracking.TrackerError`).  On a failure
    the trackers already opened are closed."""
    trackers: list[Tracker | None] = []
    try:
        for directory, run in zip(directories, runs, strict=True):
            resolved = resolve_config(run.config, run.objective)
            start = 0
            if resume:
                state = checked_resume(directory, resolved, run.config)
                start = 0 if state is None else int(state["next_update"])
            elif directory.holds_run():
                directory.create(resolved)  # refuses it, naming --resume
            trackers.append(open_tracker(run.config.report_to, directory.path, resolved, start))
    except BaseException:
        for opened in trackers:
            if opened is not None:
                with contextlib.suppress(Exception):
                    opened.close({"status": "failed"})
        raise
    return trackers


def checked_resume(directory: RunDir, resolved: dict[str, Any], config: TrainConfig) -> dict[str, Any] | None:
    """The checkpoint a resume of ``directory`` continues from (None: killed before the first one), after checking
    everything that can refuse it — the stored configuration (which may differ in ``report_to``, and in ``updates``
    when the run can be extended: :mod:`offpolicylab.resume`), the summary, the update counter — without writing."""
    stored = upgrade_config(directory.read_config())  # earlier versions' keys renamed (behavior_logp)
    changed = config_changes(stored, resolved)
    extending = changed == ["updates"]
    if changed and not extending:
        raise RunError(f"--resume with a different configuration ({', '.join(changed)} differ from "
                       f"{directory.config_path}); valid: the same options as the original run, or another "
                       "--updates")
    previous = directory.read_summary()
    if previous is not None and previous.get("status") != "failed" and not extending:
        raise RunError(f"run {directory.path} already finished with status {previous.get('status')!r}; valid: "
                       f"--updates N (more than {stored['updates']}) to extend it")
    state = None
    if directory.checkpoint_path.exists():
        state = directory.load_checkpoint()
        state["next_update"] = checked_next_update(directory, state, config, stored["updates"])
    if extending:
        recorded = len(directory.read_metrics()) if directory.metrics_path.exists() else 0
        if config.updates < recorded:  # judged against the rows recorded, not the checkpoint: nothing is dropped
            ended = (f" (it ended {previous['status']} there)" if previous is not None
                     and previous.get("status") in ("collapsed", "failed") else "")
            raise RunError(f"--updates {config.updates} is below the {recorded} updates {directory.metrics_path} "
                           f"already records{ended}; valid: --updates {recorded} or more")
        buffered = state["buffer"].get("keys", torch.zeros(0)).tolist() if state else []
        check_extension(parse_schedule(config.schedule), stored["updates"], config.updates,
                        0 if state is None else state["next_update"], config.collapse_tail, set(buffered))
    return state


def checked_next_update(directory: RunDir, state: dict[str, Any], config: TrainConfig,
                        planned: int | None = None) -> int:
    """The checkpoint's update counter, which must be an integer in 1 … updates at a checkpoint boundary
    (a multiple of ``checkpoint_every``, or ``updates``, or the ``planned`` updates of a run being extended)."""
    value = state["next_update"]
    value = int(value) if isinstance(value, torch.Tensor) and value.numel() == 1 else value
    at_boundary = isinstance(value, int) and (value % config.checkpoint_every == 0 or value in (config.updates, planned))
    last = max(config.updates, planned or 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= last or not at_boundary:
        raise RunError(f"corrupt checkpoint {directory.checkpoint_path} (update counter {value!r}; valid: a multiple "
                       f"of checkpoint_every={config.checkpoint_every} in 1..{last})")
    return value


def resolve_config(config: TrainConfig, objective: Objective | None = None) -> dict[str, Any]:
    """config.json of a run of ``config``: its fields, with the objective's parameters (defaults included) filled in
    from ``objective`` (built from the config when not given), ``advantage`` resolved to the estimator used, and the
    world's and the policy's given parameters as their validated values; a bad name or parameter raises
    ``ValueError``."""
    objective = objective or get_objective(config.objective, **config.objective_params)
    config, _ = config.with_defaults()
    resolved = config.to_dict()
    resolved["objective_params"] = dict(objective.config)
    resolved["advantage"] = advantage_used(config, objective)
    resolved["world_params"] = WORLDS.resolve(config.world, config.world_params, fill_defaults=False)
    resolved["policy_params"] = POLICIES.resolve(config.policy, config.policy_params, fill_defaults=False)
    return json.loads(json.dumps(resolved))


def checkpoint_state(run: Run, next_update: int, optimizer: dict[str, Any] | None = None,
                     torch_rng: Tensor | None = None) -> dict[str, Any]:
    """Everything needed to continue bit for bit: weights, optimizer (``optimizer``: its state dict when the run's
    optimizer is shared), objective state, RNGs (``torch_rng``: the global RNG state to record, default the
    current one), the buffer of pending rollouts, collapse detector and the update counter (tensors and plain
    containers only)."""
    return {
        "next_update": next_update,
        "policy": run.policy.state_dict(),
        "optimizer": run.optimizer.state_dict() if optimizer is None else optimizer,
        "objective": run.objective.state_dict(),
        "generator": run.generator.get_state(),
        "torch_rng": torch.get_rng_state() if torch_rng is None else torch_rng,
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],  # dropout on a GPU
        "buffer": Rollout.pack(run.buffer),
        "detector": run.detector.state_dict(),
    }


def replay_warning(run: Run, rows: list[dict[str, str]]) -> None:
    """Bring the live warning to where it was at the checkpoint: it is a function of the metrics rows recorded,
    so feeding them again (silently) restores it."""
    for row in rows:
        run.warning.observe(int(row["update"]), row)


def restore_state(run: Run, state: dict[str, Any]) -> None:
    try:
        run.policy.load_state_dict(state["policy"])
        run.optimizer.load_state_dict(state["optimizer"])
        run.objective.load_state_dict(state["objective"])
        run.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        if state.get("cuda_rng") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        run.buffer = Rollout.unpack(state["buffer"], device=policy_device(run.policy))
        run.detector.load_state_dict(state["detector"])
    except (KeyError, RuntimeError, ValueError, TypeError) as exc:
        raise RunError(f"corrupt checkpoint: it does not match this run ({type(exc).__name__}: "
                       f"{str(exc).splitlines()[0][:120] if str(exc) else ''})") from None


def policy_device(policy: Policy) -> torch.device:
    """Where the policy's parameters live (checkpoints are loaded on the CPU)."""
    params = list(policy.trainable_parameters())
    return params[0].device if params else torch.device("cpu")


# ================================================================================================ diagnostics
def scalars(steps: list[Step], current: list[Tensor]) -> list[dict[str, float]]:
    """The per-update numbers of each member's step — the loss, pre-clip gradient norm, the batch's reward,
    staleness and length (:func:`batch_columns`), the objective's scalar metrics, the sampler/trainer mismatch —
    and ``current`` (``reward_current``), as Python floats, with one host transfer for all."""
    columns = batch_columns(steps[0].joined)
    named = [step_numbers(step, reward) for step, reward in zip(steps, current, strict=True)]
    tensors = [value if value.dim() == 0 else value.reshape(()) for one in named for value in one.values()]
    parts = list(columns.values())
    if len({tensor.dtype for tensor in tensors + parts}) > 1:  # mixed dtypes: widen (float32 → float64 is exact)
        tensors, parts = ([tensor.to(torch.float64) for tensor in group] for group in (tensors, parts))
    values = iter(torch.cat([torch.stack(tensors), *parts]).tolist())
    own = [{key: next(values) for key in one} for one in named]
    shared = {name: [next(values) for _ in steps] for name in columns}
    return [{"loss": one.pop("loss"), "grad_norm": one.pop("grad_norm"),
             **{name: column[index] for name, column in shared.items()}, **one} for index, one in enumerate(own)]


def batch_columns(batch: TokenBatch) -> dict[str, Tensor]:
    """[runs] each, for every run of ``batch`` at once: reward mean and (population) std, staleness mean and max,
    mean response length — each run's value as its rows alone give it."""
    rewards, staleness = batch.rewards.reshape(batch.runs, -1), batch.staleness.reshape(batch.runs, -1)
    return {"reward_mean": rewards.mean(-1),
            "reward_std": torch.stack([row.std(unbiased=False) for row in rewards]),  # std(-1) may round otherwise
            "staleness_mean": staleness.mean(-1), "staleness_max": staleness.amax(-1),
            "response_len": batch.mask.sum(-1).reshape(batch.runs, -1).mean(-1)}


def step_numbers(step: Step, current: Tensor) -> dict[str, Tensor]:
    """The numbers :func:`scalars` reports of one member's update other than :func:`batch_columns`, as tensors."""
    named = {"loss": step.output.loss.detach(), "grad_norm": step.grad_norm.detach(),
             **{key: value for key, value in step.output.metrics.items() if value.numel() == 1}}
    if step.joined.sampler_logp is not None:  # trainer vs sampler numbers of the same tokens (not staleness)
        batch = step.batch
        mismatch = (batch.behavior_logp - batch.sampler_logp).abs()
        named["sampler_log_ratio_abs_mean"] = stats.masked_mean(mismatch, batch.mask)
        named["sampler_log_ratio_abs_max"] = stats.masked_max(mismatch, batch.mask)
    named["reward_current"] = current
    return named


def current_reward(fresh: list[Rollout], update: int, all_current: bool = False) -> float:
    """Mean reward of the responses the current policy (version ``update``) generated at this update — its own
    reward, whatever batch the update consumes; NaN when it generated none (between stages, offline data).
    ``all_current``: every fresh row is the current policy's (no share answered by π_0), so none is filtered."""
    return float(own_reward(fresh, update, all_current))


def own_reward(fresh: list[Rollout], update: int, all_current: bool = False) -> Tensor:
    """:func:`current_reward` as a 0-d tensor (no host sync)."""
    rewards = [r.rewards if all_current else r.rewards[r.version == update] for r in fresh]
    rewards = torch.cat(rewards) if len(rewards) > 1 else rewards[0] if rewards else torch.zeros(0)
    return rewards.mean() if rewards.numel() else torch.full((), math.nan, dtype=rewards.dtype)


def detector_reward(row: dict[str, float], schedule: Schedule) -> float | None:
    """The reward the collapse detector observes: the current policy's (``reward_current``); None (hold) at updates
    where it generated nothing; the consumed batch's reward for the offline schedules, whose data never come from
    the current policy."""
    if schedule.kind == "offline":
        return row["reward_mean"]
    return row["reward_current"] if math.isfinite(row["reward_current"]) else None


def is_due(update: int, every: int, total: int) -> bool:
    return update % every == 0 or update == total - 1


def eval_columns(run: Run) -> list[str]:
    columns = ["eval_reward_sampled", "eval_reward_se", "eval_reward_greedy"]
    if tracks_kl_init(run.config):
        columns += ["eval_kl_init_k1", "eval_kl_init_k3"]
    if run.enumerable:
        columns += ["exact_return", "exact_kl_init"]
    return columns


# ================================================================================================ 3. evaluate
def evaluate_due(stack: Stack, update: int, due: list[bool]) -> list[dict[str, Any]]:
    """Each member's evaluation numbers where ``due`` (the whole stack at once when every member is due, else each
    due member as a stack of one), empty columns where not."""
    if all(due):
        return evaluate(stack, update)
    return [evaluate(Stack.one(run), update)[0] if ok else dict.fromkeys(eval_columns(run))
            for run, ok in zip(stack.runs, due, strict=True)]


def evaluate(stack: Stack, update: int) -> list[dict[str, float]]:
    """Each member's Monte-Carlo J: the mean reward of ``eval_samples`` sampled responses per prompt of
    ``world.eval_prompts()`` and its standard error (:func:`stats.stratified_standard_error`, prompts as strata); the
    reward of greedy responses; the sampled KL(π‖π_0) (:func:`kl_from_scores`) when tracked; exact J(π) and
    KL(π‖π_0) when the world can enumerate its responses.  Each member uses its own generator
    (:func:`eval_generator`), so evaluation never shifts the training randomness; the stack's policies sample, decode
    greedily, score and enumerate for all members at once."""
    runs, cfg = stack.runs, stack.config
    generators = [eval_generator(run.config, update) for run in runs]
    prompts = Prompts.concat([run.world.eval_prompts() for run in runs])
    sampled = stack.policy.sample(prompts, cfg.eval_samples, cfg.temperature, stack.generators(generators))
    blocks = sampled.split(len(stack))
    numbers = [sampled_numbers(run, block, generator)
               for run, block, generator in zip(runs, blocks, generators, strict=True)]
    if isinstance(stack.policy, GreedyPolicy):
        greedy = stack.policy.greedy(prompts).split(len(stack))
        for own, run, block, generator in zip(numbers, runs, greedy, generators, strict=True):
            own["eval_reward_greedy"] = greedy_reward(run, block, generator)
    if tracks_kl_init(cfg):
        with torch.no_grad():
            initial_logp = stack.split(stack.initial.score(sampled)[0])
        for own, block, logp in zip(numbers, blocks, initial_logp, strict=True):
            own.update(kl_from_scores(logp, block))
    if runs[0].enumerable:
        for own, run, logp in zip(numbers, runs, enumerated_logprobs(stack), strict=True):
            own.update(exact_diagnostics(run, logp))
    return numbers


def enumerated_logprobs(stack: Stack) -> list[Tensor]:
    """log π_s(y|x) [N, M] of each member over the enumerable world's prompts × responses, scored by the stack."""
    world = stack.runs[0].world
    enumeration = world.enumeration
    prompts = Prompts.concat([enumeration.prompts] * len(stack))
    return stack.split(sequence_logprobs(stack.policy, prompts, enumeration.ids, enumeration.mask, 1.0,
                                         world.vocab_size))


def eval_generator(config: TrainConfig, update: int) -> torch.Generator:
    """The evaluation's own generator at ``update`` (seed × 1,000,003 + update)."""
    return torch.Generator().manual_seed(config.seed * 1_000_003 + update)


def sampled_numbers(run: Run, sampled: Rollout, generator: torch.Generator) -> dict[str, float]:
    """The mean reward of the sampled evaluation responses and its standard error (greedy reward NaN until set)."""
    rewards = rewards_of(run.world, sampled, generator)
    return {"eval_reward_sampled": float(rewards.mean()),
            "eval_reward_se": float(stats.stratified_standard_error(rewards, sampled.group_ids)),
            "eval_reward_greedy": math.nan}


def greedy_reward(run: Run, greedy: Rollout, generator: torch.Generator) -> float:
    return float(rewards_of(run.world, greedy, generator).mean())


def kl_to_initial(initial: Policy, sampled: Rollout) -> dict[str, float]:
    """Per-token estimates of KL(π‖π_0) from responses sampled by π (Schulman's k1 and k3 with
    δ = log π_0(y_t) − log π(y_t)): k1 = E[−δ], k3 = E[e^δ − 1 − δ] ≥ 0, token means.  log π is the sampler's
    ``behavior_logp``; π_0 scores the same tokens (one forward, no grad), at the sampling temperature, so the KL is
    between the tempered distributions."""
    with torch.no_grad():
        initial_logp, _ = initial.score(sampled)
    return kl_from_scores(initial_logp, sampled)


def kl_from_scores(initial_logp: Tensor, sampled: Rollout) -> dict[str, float]:
    """:func:`kl_to_initial` from π_0's log-probs ``initial_logp`` of the sampled tokens."""
    delta = initial_logp.detach().to(sampled.behavior_logp.dtype) - sampled.behavior_logp
    k1, k3 = stats.kl_estimates(delta, sampled.response_mask)
    return {"eval_kl_init_k1": float(k1), "eval_kl_init_k3": float(k3)}


def exact_diagnostics(run: Run, logp: Tensor | None = None) -> dict[str, float]:
    """J(π) = E_x Σ_y π(y|x) R(x, y) and KL(π‖π_0) = E_x Σ_y π(y|x)(log π − log π_0) by enumeration, scoring π once
    (``logp``: log π(y|x) [N, M] when already computed; π_0's log-probs are computed once per run and cached)."""
    enumeration = run.world.enumeration
    logp = enumeration.logprobs(run.policy) if logp is None else logp
    if run.initial_logprobs is None:
        run.initial_logprobs = enumeration.logprobs(run.initial)
    return {"exact_return": enumeration.return_of(logp), "exact_kl_init": kl_divergence(logp, run.initial_logprobs)}


def exact_optimum(world: World) -> dict[str, float]:
    return {"optimal_return": float(world.optimal_return())} if isinstance(world, ExactWorld) else {}


def rewards_of(world: World, rollout: Rollout, generator: torch.Generator) -> Tensor:
    """The world's rewards [B] of ``rollout``'s responses as float32 (``generator`` serves worlds whose rewards are
    random): the one reward call of training batches and evaluation."""
    rewards = world.reward(rollout.prompt_index, rollout.response_ids, rollout.response_mask, generator=generator)
    return rewards.to(torch.float32)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
