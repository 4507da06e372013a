"""The update of a :class:`~offpolicylab.batched.stack.Stack`: the phases of :func:`offpolicylab.trainer.run_updates`
for every member, with sampling, scoring, the backward pass and the optimizer step done once for the stack.

Each member's batch, advantages, objective call, metrics row, evaluation numbers, run directory and checkpoint are
its own (the trainer's phase functions applied to its row block), so its run directory is the one its separate run
writes — equal within float tolerance (docs/design.md, "Batched seeds", lists the tolerances and the tests).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from offpolicylab.batched.stack import Stack
from offpolicylab.contracts import GreedyPolicy, Prompts, Rollout
from offpolicylab.profiling import Stopwatch
from offpolicylab.progress import Progress, update_warnings
from offpolicylab.reference import reference_logp
from offpolicylab.resume import tail_key
from offpolicylab.trainer import (
    Step,
    advantages_of,
    batches_due,
    checkpoint_state,
    compute_loss,
    eval_columns,
    eval_generator,
    evaluate,
    exact_diagnostics,
    final_status,
    greedy_reward,
    is_checkpoint_due,
    is_due,
    is_finite,
    kl_from_scores,
    proximal_of,
    record,
    sampled_numbers,
    take,
    token_batch,
    tracks_kl_init,
    update_rows,
)
from offpolicylab.worlds.exact import sequence_logprobs


def run_stack(stack: Stack, start: int, watch: Stopwatch, progress: bool | str) -> list[str]:
    """Updates ``start … updates − 1`` of every member of ``stack``; each member's final status.  A member that
    stops (non-finite step, or a collapse with ``stop_on_collapse``) leaves the stack; the others go on."""
    cfg = stack.runs[0].config
    statuses: list[str | None] = [None] * len(stack)
    active = list(range(len(stack)))  # the original index of each member still in the stack
    clock = time.perf_counter()
    view = Progress(progress, cfg.updates, start)  # the console (progress.py)
    for update in range(start, cfg.updates):
        tick = time.perf_counter()
        fresh = collect(stack, update, watch)                                      # 1. schedule → rollouts
        rollouts = [take(run, update) for run in stack.runs]
        joined = Rollout.concat(rollouts)
        with watch("policy_forward"):                                              # 2. TokenBatch
            logp, entropy = stack.policy.score(joined)
        with watch("other"):
            advantages = [advantages_of(run, rollout) for run, rollout in zip(stack.runs, rollouts, strict=True)]
            proximal = [proximal_of(run, own, update) for run, own in zip(stack.runs, stack.split(logp), strict=True)]
            prox_logp = None if all(p is None for p in proximal) else torch.cat(
                [own.detach() if p is None else p for p, own in zip(proximal, stack.split(logp), strict=True)])
            whole = token_batch(joined, logp, entropy, torch.cat(advantages), update, prox_logp)
            reference = reference_logp(stack.reference, joined, [run.objective for run in stack.runs])  # KL penalty
            batches = (whole if reference is None else whole.replace(ref_logp=reference)).split(len(stack))
        with watch("objective"):                                                   # 3. loss
            outputs = [compute_loss(run, batch, update) for run, batch in zip(stack.runs, batches, strict=True)]
        with watch("policy_backward"):                                             # 4. step
            stack.optimizer.zero_grad(set_to_none=True)
            torch.stack([output.loss for output in outputs]).sum().backward()
            norms = stack.clip_gradients(cfg.grad_clip)
        steps = [Step(*parts) for parts in zip(batches, outputs, norms, fresh, strict=True)]
        rows = update_rows(stack.runs, update, steps)
        finite = [is_finite(row) for row in rows]
        if any(finite):  # a member with a non-finite step stops below; its slice of the stack is left behind
            with watch("policy_backward"):
                stack.optimizer.step()
        labels = [f"[seed {run.config.seed}] " for run in stack.runs]
        with watch("eval"):                                                        # 5. evaluation
            due = [ok and is_due(update, cfg.eval_every, cfg.updates) for ok in finite]
            for row, numbers in zip(rows, evaluate_due(stack, update, due), strict=True):
                row.update(numbers)
        stopped = []                                                               # 6. run directories
        for index, (run, directory, row, step, ok) in enumerate(
                zip(stack.runs, stack.directories, rows, steps, finite, strict=True)):
            if record(run, directory, update, row, step, ok, (tick, clock), watch):
                statuses[active[index]] = "collapsed"
                stopped.append(index)
            elif is_checkpoint_due(cfg, update):
                with watch("checkpoint"):
                    directory.save_checkpoint(checkpoint_state(run, update + 1, stack.member_optimizer(index),
                                                               stack.rng_states[index]))
        view.update(rows, labels, update_warnings(rows, [run.detector.collapsed_at for run in stack.runs],
                                                    [run.alarm for run in stack.runs]))
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


def collect(stack: Stack, update: int, watch: Stopwatch) -> list[list[Rollout]]:
    """:func:`offpolicylab.trainer.collect` of every member (one schedule: the members' batches are due together),
    each batch sampled for all members at once; each member's fresh rollouts."""
    keys, tail = batches_due(stack.runs[0], update)
    generated = [stack.generate(update, watch) for _ in range(len(keys) + tail)]
    fresh = [[batch[index] for batch in generated] for index in range(len(stack))]
    key = tail_key(stack.runs[0].schedule, update) if tail else None
    for run, own in zip(stack.runs, fresh, strict=True):
        run.buffer.update(zip(keys, own, strict=False))
        if key is not None:  # trained on if the run is extended (offpolicylab.trainer.collect)
            run.buffer[key] = own[-1]
    return fresh


def evaluate_due(stack: Stack, update: int, due: list[bool]) -> list[dict[str, Any]]:
    """Each member's evaluation numbers where ``due`` (all members at once when all are due, else each alone),
    empty columns where not."""
    if all(due):
        return evaluate_stack(stack, update)
    return [evaluate(run, update) if ok else dict.fromkeys(eval_columns(run))
            for run, ok in zip(stack.runs, due, strict=True)]


def evaluate_stack(stack: Stack, update: int) -> list[dict[str, float]]:
    """:func:`offpolicylab.trainer.evaluate` of every member, each with its own evaluation generator, the members'
    sampling, greedy decoding, π_0 scoring and enumeration done by the stacked policies."""
    runs, cfg = stack.runs, stack.runs[0].config
    generators = [eval_generator(run.config, update) for run in runs]
    prompts = Prompts.concat([run.world.eval_prompts() for run in runs])
    sampled = stack.policy.sample(prompts, cfg.eval_samples, cfg.temperature, generators)
    blocks = sampled.split(len(stack))
    numbers = [sampled_numbers(run, block, generator)
               for run, block, generator in zip(runs, blocks, generators, strict=True)]
    if isinstance(stack.policy, GreedyPolicy):
        greedy = stack.policy.greedy(prompts).split(len(stack))
        for own, run, block, generator in zip(numbers, runs, greedy, generators, strict=True):
            own["eval_reward_greedy"] = greedy_reward(run, block, generator)
    if tracks_kl_init(cfg):
        with torch.no_grad():
            reference_logp = stack.split(stack.reference.score(sampled)[0])
        for own, block, logp in zip(numbers, blocks, reference_logp, strict=True):
            own.update(kl_from_scores(logp, block))
    if runs[0].enumerable:
        for own, run, logp in zip(numbers, runs, enumerated_logprobs(stack), strict=True):
            own.update(exact_diagnostics(run, logp))
    return numbers


def enumerated_logprobs(stack: Stack) -> list[Tensor]:
    """log π_s(y|x) [N, M] of each member over the enumerable world's prompts × responses, scored by the stack."""
    enumeration, world = stack.runs[0].world.enumeration, stack.runs[0].world
    prompts = Prompts.concat([enumeration.prompts] * len(stack))
    return stack.split(sequence_logprobs(stack.policy, prompts, enumeration.ids, enumeration.mask, 1.0,
                                         world.vocab_size))
