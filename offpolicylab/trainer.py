"""The one update loop (docs/design.md, "One update"): a single run is a stack of one.

    schedule → rollouts → TokenBatch → objective → step → evaluation → run directory

As in vectorised RL libraries (Stable-Baselines3's ``VecEnv``, CleanRL's vector environments), :func:`run_updates`
trains a :class:`~offpolicylab.stack.Stack` of runs — one run (:func:`train`), or several seeds / objectives of one
configuration trained as one computation (:mod:`offpolicylab.batched`).  At update ``u`` (the policy's version is
``u``: it has taken ``u`` optimizer steps) it runs, in this order:

1. **collect**   the batches whose generating version is ``u`` are sampled now and buffered (:mod:`offpolicylab
                 .staleness`): ``policy.sample(prompts, G, temperature)`` records ``behavior_logp`` and
                 ``world.reward`` scores it (:func:`collect`; sampling: :mod:`offpolicylab.rollouts`).  Old weights
                 are never kept — stale data is data generated earlier, not a copy of an earlier policy.
2. **train**     the batch consumed at ``u`` is taken from the buffer (:func:`take`); ``policy.score`` gives ``logp``
                 (with grad) and ``entropy``; group-relative advantages, one per sequence
                 (:mod:`offpolicylab.objectives.advantages`): ``mean`` A_i = r_i − mean_{j∈g(i)} r_j (REC paper, Yao
                 et al. 2025) or ``std`` A_i = (r_i − r̄)/(std_{j∈g(i)} r_j + 1e-6), the Bessel-corrected std as verl
                 computes it (GRPO, Shao et al. 2024, DeepSeekMath, arXiv 2402.03300); staleness = u − version per
                 sequence (:func:`make_batch`); ``objective.update(batch)``, then ``objective(batch)`` → loss,
                 metrics; backward, global-norm gradient clipping, optimizer step — skipped, and the run stopped, when
                 its loss or gradient is not finite (:func:`train_update`).
3. **evaluate**  every ``eval_every`` updates the sampled reward on ``world.eval_prompts()`` with its standard
                 error, the greedy reward, the sampled KL(π‖π₀) and, where the world is enumerable, the exact return
                 J(π) and KL(π‖π₀) (:mod:`offpolicylab.evaluation`).
4. **record**    collapse detection (:mod:`offpolicylab.diagnostics.collapse`), the metrics row (its numbers:
                 :mod:`offpolicylab.step`), histogram samples, events (:func:`record`) and the atomic checkpoint
                 (:mod:`offpolicylab.lifecycle`, :mod:`offpolicylab.run_dir`).

:mod:`offpolicylab.build` builds the run; this module knows no concrete world or policy and asks for optional
abilities through the protocols of :mod:`offpolicylab.contracts`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from offpolicylab.build import build, with_stored_plan
from offpolicylab.config import TrainConfig
from offpolicylab.contracts import Rollout, TextPolicy
from offpolicylab.diagnostics import stats
from offpolicylab.evaluation import evaluate_due
from offpolicylab.lifecycle import (
    checkpoint_state,
    completions,
    guarded,
    open_run,
    save_adapter,
    write_summary,
)
from offpolicylab.objectives import LossOutput, Objective, TokenBatch
from offpolicylab.objectives.advantages import group_advantages
from offpolicylab.profiling import Stopwatch
from offpolicylab.progress import Progress, describe_run, log, update_warnings
from offpolicylab.proximal import proximal_logp
from offpolicylab.reference import reference_logp
from offpolicylab.resume import tail_key, watches_tail
from offpolicylab.rollouts import Collected, generate
from offpolicylab.run_dir import RunDir
from offpolicylab.samples import sample_arrays
from offpolicylab.stack import Run, Stack
from offpolicylab.step import Step, detector_reward, update_rows

__all__ = ["collect", "run_updates", "Step", "train", "train_update", "UpdateHook"]


class UpdateHook:
    """An observer of the update loop, as Stable-Baselines3's callbacks (``BaseCallback.on_step``) and Lightning's
    hooks (``on_train_batch_start`` / ``on_train_batch_end``): :func:`run_updates` calls every hook at two points of
    each update.  A hook reads what it is handed and changes nothing the loop uses (the policy's weights, the
    buffers, the generators), so a run trains with hooks exactly as without; what a hook computes (another forward,
    its own random draws from its own generator) is its own.  Subclass and override either method."""

    def on_batch(self, update: int, stack: Stack, rollouts: list[Rollout]) -> None:
        """Before the train phase of ``update``: the rollout each member of ``stack`` consumes (a :class:`Rollout`,
        prompts × G responses); the policy is still version ``update``."""

    def on_update(self, update: int, stack: Stack, steps: list[Step], rows: list[dict[str, Any]]) -> None:
        """After ``update`` is recorded: each member's :class:`Step` (its token batch ``step.batch``, the objective's
        output, the gradient norm, the consumed rollout and the member's collect phase) and its metrics row; the
        policy has taken
        the update's optimizer step."""


def train(config: TrainConfig, run_dir: str | Path, *, resume: bool = False, progress: bool | str = False,
          profile: bool = False, hooks: Sequence[UpdateHook] = ()) -> dict[str, Any]:
    """Train as ``config`` says, writing the run directory ``run_dir``; returns the summary.

    ``resume=True`` continues from ``run_dir``'s checkpoint (the metrics file then ends identical to an
    uninterrupted run).  Bad configuration raises ``ValueError`` before the directory is touched.  ``progress``:
    ``"bar"`` (or True) a tqdm bar on stderr, ``"lines"`` lines on stderr at most every few seconds (for logs;
    :mod:`offpolicylab.progress`), False nothing; either prints the run's settings first.  ``profile=True`` profiles
    the updates (:mod:`offpolicylab.profiling`), writes ``profile.txt`` and ``profile.pstats`` into the run directory
    and prints the section table and the top functions on stderr.  ``hooks`` observe every update
    (:class:`UpdateHook`)."""
    directory = RunDir(run_dir, fsync=config.fsync)
    if resume:  # nothing to resume: refused before the lock creates anything
        config = with_stored_plan(config, directory.read_config())
    run = build(config)
    with directory.locked():  # one writer per run directory
        start = open_run(directory, run, resume)
        if progress:
            log(describe_run(run.config, run.memory_plan))
        watch = Stopwatch()
        stack = Stack.one(run, directory)
        statuses = guarded(stack.directories, profile, lambda: run_updates(stack, start, watch, progress, hooks),
                           watch, start)
        return write_summary(directory, run, statuses[0])


def member_label(run: Run, directory: RunDir | None) -> str:
    """The console prefix of a stacked member's lines and warnings, and of a run's warnings when it prints no
    progress of its own (a sweep's cell): its run directory's name (``[seed=1] ``, ``[objective=m2po__seed=0] ``),
    which names the run among seeds and objectives; ``[seed S] `` without one."""
    return f"[{directory.path.name}] " if directory is not None else f"[seed {run.config.seed}] "


def run_updates(stack: Stack, start: int, watch: Stopwatch, progress: bool | str,
                hooks: Sequence[UpdateHook] = ()) -> list[str]:
    """Updates ``start … updates − 1`` of every member of ``stack``; each member's final status (``completed``, or
    ``collapsed`` when its collapse detector fired or a step was not finite).  A member that stops (a non-finite
    step, or a collapse with ``stop_on_collapse``) leaves the stack; the others go on.  ``hooks`` observe each
    update (:class:`UpdateHook`)."""
    cfg = stack.config
    statuses: list[str | None] = [None] * len(stack)
    active = list(range(len(stack)))  # the original index of each member still in the stack
    labels = [member_label(run, directory) if stack.stacked or not progress else ""  # a sweep's cell: named too
              for run, directory in zip(stack.members, stack.directories, strict=True)]
    clock = time.perf_counter()
    view = Progress(progress, cfg.updates, start)  # the console (progress.py)
    for update in range(start, cfg.updates):
        tick = time.perf_counter()
        collected = collect(stack, update, watch)                                  # 1. collect
        rollouts = [take(run, update) for run in stack.members]
        for hook in hooks:
            hook.on_batch(update, stack, rollouts)
        steps = train_update(stack, update, rollouts, collected, watch)            # 2. train
        rows = update_rows(stack.members, update, steps)
        with watch("eval"):                                                        # 3. evaluate
            due = [step.finite and is_due(update, cfg.eval_every, cfg.updates) for step in steps]
            for row, numbers in zip(rows, evaluate_due(stack, update, due), strict=True):
                row.update(numbers)
        stopped = record_stack(stack, update, rows, steps, (tick, clock), watch)   # 4. record
        for hook in hooks:
            hook.on_update(update, stack, steps, rows)
        view.update(rows, [labels[i] for i in active],
                    update_warnings(rows, [run.collapse_detector.collapsed_at for run in stack.members],
                                    [run.last_warning for run in stack.members]))
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
    for index, run in zip(active, stack.members, strict=True):
        statuses[index] = statuses[index] or final_status(run)
    return [status or "completed" for status in statuses]


def record_stack(stack: Stack, update: int, rows: list[dict[str, Any]], steps: list[Step],
                 clocks: tuple[float, float], watch: Stopwatch) -> list[int]:
    """Each member's :func:`record`; the indices of the members that stop here (their adapters saved)."""
    stopped = []
    for index, (run, directory, row, step) in enumerate(zip(stack.members, stack.directories, rows, steps,
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
        for index, (run, directory) in enumerate(zip(stack.members, stack.directories, strict=True)):
            if index not in stopped:
                directory.save_checkpoint(checkpoint_state(run, update + 1, stack.member_optimizer(index),
                                                           stack.rng_state(index)))
                save_adapter(run, directory)


def collect(stack: Stack, update: int, watch: Stopwatch) -> list[Collected]:
    """Generate the batches the schedule asks for at ``update`` into every member's buffer (the members' batches are
    due together: one schedule), and, in a stale queue's drained tail, one batch for the collapse detector alone,
    kept in the buffer under the key a longer run trains it as, so that ``--resume --updates N`` extends the run
    exactly (:mod:`offpolicylab.resume`); each member's collect phase: the rollouts generated now (with dynamic
    sampling: every rollout it sampled) and the dynamic-sampling counts."""
    keys, tail = rollouts_due(stack.members[0], update)
    collected = [Collected() for _ in stack.members]
    generated = [generate(stack, update, watch, collected) for _ in range(len(keys) + tail)]
    key = tail_key(stack.members[0].schedule, update) if tail else None
    for index, (run, one) in enumerate(zip(stack.members, collected, strict=True)):
        own = [batch[index] for batch in generated]
        run.buffer.update(zip(keys, own, strict=False))
        if key is not None:  # trained on if the run is extended
            run.buffer[key] = own[-1]
        if not run.config.dynamic_sampling:
            one.fresh = own
    return collected


def rollouts_due(run: Run, update: int) -> tuple[list[int], bool]:
    """(the buffer keys of the rollouts generated at ``update``, whether the current policy also generates one
    only for the collapse detector: :func:`~offpolicylab.resume.watches_tail`)."""
    cfg, schedule = run.config, run.schedule
    keys = list(schedule.generate_at(update, cfg.updates))
    return keys, bool(cfg.collapse_tail and not keys and watches_tail(schedule, update, cfg.updates))


def take(run: Run, update: int) -> Rollout:
    """The batch consumed at ``update``; batches the schedule never needs again leave the buffer."""
    rollout = run.buffer[run.schedule.key(update)]
    for key in run.schedule.release_after(update, run.config.updates):
        run.buffer.pop(key, None)
    return rollout


def train_update(stack: Stack, update: int, rollouts: list[Rollout], collected: list[Collected],
                 watch: Stopwatch) -> list[Step]:
    """The train phase of ``update``: each member's consumed rollout (``rollouts``, :func:`take`) scored by the stack's policy in one forward
    (:func:`make_batch`), each member's loss (:func:`compute_loss`: one call for the members of an
    :func:`objective_groups` group), one backward of Σ_s loss_s, each member's gradient clipped by its own global
    norm (:meth:`~offpolicylab.stack.Stack.clip_gradients`), and one optimizer step unless no member's loss and
    gradient are finite (a non-finite member stops; its slice is left behind)."""
    joined = Rollout.concat(rollouts)
    with watch("policy_forward"):
        logp, entropy = stack.policy.score(joined)
    with watch("other"):
        whole = make_batch(stack, rollouts, joined, logp, entropy, update)
    with watch("objective"):
        outputs = [output for start, stop in objective_groups(stack.members, whole)
                   for output in compute_loss(stack.members[start], whole.part(start, stop), update).split(stop - start)]
    with watch("policy_backward"):
        stack.optimizer.zero_grad(set_to_none=True)
        losses = torch.stack([output.loss for output in outputs])
        scaler = getattr(stack.policy, "loss_scaler", None)
        if scaler is not None:
            return scaled_step(stack, scaler, losses, outputs, collected, rollouts, whole)
        losses.sum().backward()
        norms = stack.clip_gradients(stack.config.grad_clip)
        finite = (torch.isfinite(losses.detach()) & torch.isfinite(torch.stack(norms))).tolist()
        if any(finite):
            stack.optimizer.step()
    return [Step(whole, index, *parts) for index, parts in enumerate(zip(outputs, norms, collected, rollouts, finite,
                                                                         strict=True))]


def scaled_step(stack: Stack, scaler: torch.amp.GradScaler, losses: Tensor, outputs: list[LossOutput],
                collected: list[Collected], rollouts: list[Rollout], whole: TokenBatch) -> list[Step]:
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
    return [Step(whole, index, *parts) for index, parts in enumerate(zip(outputs, norms, collected, rollouts, finite,
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
    log-probs, each member's group-relative advantages (its run's estimator:
    :func:`~offpolicylab.objectives.advantages.group_advantages`), each sequence's staleness at ``update``, log π_prox
    for an objective that reads it (:func:`proximal_of`) and, when an objective has a KL penalty, π₀'s log-probs of
    the tokens (:func:`~offpolicylab.reference.reference_logp`)."""
    runs, own_logp = stack.members, stack.split(logp)
    estimators = {run.advantage for run in runs}
    if len(estimators) == 1:  # the joined groups are distinct: one call computes every member's advantages
        advantages = group_advantages(joined.rewards, joined.group_ids, estimators.pop())
    else:
        advantages = torch.cat([group_advantages(rollout.rewards, rollout.group_ids, run.advantage)
                                for run, rollout in zip(runs, rollouts, strict=True)])
    proximal = [proximal_of(run, own, update) for run, own in zip(runs, own_logp, strict=True)]
    prox_logp = None if all(p is None for p in proximal) else torch.cat(
        [own.detach() if p is None else p for p, own in zip(proximal, own_logp, strict=True)])
    whole = rollout_token_batch(joined, logp, entropy, advantages, update, prox_logp, len(stack))  # S runs
    reference = reference_logp(stack.initial, joined, [run.objective for run in runs])  # the KL penalty's π_ref
    return whole if reference is None else whole.replace(ref_logp=reference)


def proximal_of(run: Run, logp: Tensor, update: int) -> Tensor | None:
    """log π_prox of the batch consumed at ``update`` for an objective that reads it (decoupled PPO:
    :func:`offpolicylab.proximal.proximal_logp`), else None."""
    if not getattr(run.objective, "needs_prox", False):  # wrappers around an objective may not declare it
        return None
    return proximal_logp(run.objective, run.schedule, run.buffer, run.policy, update, run.config.updates, logp)


def rollout_token_batch(rollout: Rollout, logp: Tensor, entropy: Tensor, advantages: Tensor, update: int,
                prox_logp: Tensor | None = None, runs: int = 1) -> TokenBatch:
    """The :class:`~offpolicylab.objectives.TokenBatch` of ``rollout`` (``runs`` runs' rollouts joined) with the given
    log-probs, entropies, advantages (and log π_prox)."""
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


def record(run: Run, directory: RunDir, update: int, row: dict[str, Any], step: Step, clocks: tuple[float, float],
           watch: Stopwatch) -> bool:
    """Collapse detection, the metrics row, events and samples of one update; whether the run stops here (a
    non-finite step, or a collapse with ``stop_on_collapse``)."""
    cfg, (tick, clock), finite = run.config, clocks, step.finite
    with watch("other"):
        now = time.perf_counter()
        row.update(time_update_s=now - tick, time_elapsed_s=now - clock)
        reason = (run.collapse_detector.non_finite(update) if not finite else
                  run.collapse_detector.observe(update, detector_reward(row, run.schedule), row.get("kl_k3"),
                                       row["grad_norm"]))
        directory.append_metrics(row)
        alarm = run.early_warning.observe(update, row) if finite else None
        if alarm is not None:
            run.last_warning = (update, alarm)
            directory.event("warning", update, detector=run.early_warning.name, reason=alarm)
        if not finite:
            directory.event("non_finite_loss", update, loss=row["loss"], grad_norm=row["grad_norm"])
        if reason is not None:
            directory.event("collapse", update, reason=reason)
        if cfg.sample_every and update % cfg.sample_every == 0:
            directory.write_samples(update, sample_arrays(step.batch, step.output.token_mask, cfg.seed, update))
            if isinstance(run.policy, TextPolicy):
                directory.write_completions(update, completions(run.policy, step.rollout, step.batch))
    return not finite or (reason is not None and cfg.stop_on_collapse)


def is_checkpoint_due(config: TrainConfig, update: int) -> bool:
    return (update + 1) % config.checkpoint_every == 0 or update + 1 == config.updates


def final_status(run: Run) -> str:
    return "collapsed" if run.collapse_detector.collapsed_at >= 0 else "completed"


def is_due(update: int, every: int, total: int) -> bool:
    return update % every == 0 or update == total - 1
