"""Phase 1 of the update loop (:func:`offpolicylab.trainer.collect`): sampling rollouts.

A rollout is ``prompts_per_update`` prompts × ``group_size`` responses of a policy, with behaviour log-probs
(:func:`offpolicylab.behavior.sample_rollout`), the world's rewards (:func:`~offpolicylab.contracts.rewards_of`, the one reward call),
generating versions and, with DAPO's options (Yu et al. 2025, arXiv:2503.14476), the soft overlong punishment
(:func:`overlong_penalty`) and dynamic sampling (:func:`dynamic_rollout`).  A stack's members sample as one
computation, each with its own generator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from offpolicylab.behavior import sample_rollout
from offpolicylab.config import TrainConfig, overlong_limit
from offpolicylab.contracts import Policy, Prompts, Rollout, rewards_of
from offpolicylab.objectives.advantages import group_min_max
from offpolicylab.profiling import Stopwatch
from offpolicylab.stack import Run, Stack

__all__ = ["Collected", "dynamic_rollout", "first_groups", "generate", "group_count", "INITIAL_VERSION",
           "overlong_penalty", "overlong_settings", "rewards_joined", "rollout_sources", "sample",
           "sample_rollouts", "stamped", "varied_rows", "with_overlong_penalty", "with_rewards"]


INITIAL_VERSION = 0


@dataclass
class Collected:
    """One member's collect phase at one update (scratch of that update, never kept on the run): the rollouts the
    current policy generated (``fresh``; with dynamic sampling every rollout it sampled, the groups not kept
    included) and DAPO's dynamic-sampling counts — the ``rounds`` sampled, the ``groups`` they held and the groups
    ``kept`` (rewards not all equal)."""

    fresh: list[Rollout] = field(default_factory=list)
    rounds: int = 0
    groups: int = 0
    kept: int = 0


def generate(stack: Stack, version: int, watch: Stopwatch, collected: list[Collected]) -> list[Rollout]:
    """One rollout per member: ``prompts_per_update`` prompts × ``group_size`` responses with rewards and versions
    (with ``dynamic_sampling``, which only a stack of one runs — :meth:`Stack.of` refuses it —:
    :func:`dynamic_rollout`, counted in ``collected``)."""
    if stack.config.dynamic_sampling:
        return [dynamic_rollout(stack, version, watch, *collected)]
    return sample_rollouts(stack, version, watch)


def sample_rollouts(stack: Stack, version: int, watch: Stopwatch, shaped: bool = True) -> list[Rollout]:
    """One sampled rollout per member with the world's rewards (plus the overlong punishment unless
    ``shaped=False``): the stack's policy samples every member's prompts at once, each member's rows with its own
    generator, so each member draws what its separate run draws, in the same order.  A world whose rewards are
    row-wise (:func:`rewards_joined`) scores every member's rows in one call."""
    runs, pieces = stack.members, [[] for _ in stack.members]
    generators = stack.generators([run.generator for run in runs])
    joined = rewards_joined(stack)
    for is_initial, count, tag in rollout_sources(runs[0], version):
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
    return len(stack) > 1 and getattr(stack.members[0].world, "rowwise_reward", False)


def dynamic_rollout(stack: Stack, version: int, watch: Stopwatch, collected: Collected) -> Rollout:
    """DAPO's dynamic sampling (Yu et al. 2025, arXiv:2503.14476, eq. 11: keep a group only if
    0 < |{o_i correct}| < G) for a stack of one: sample rollouts, keep the groups whose world rewards are not all
    equal, until ``prompts_per_update`` groups are kept or ``dynamic_sampling_max_batches`` rounds were sampled; the
    first ``prompts_per_update`` kept groups form the rollout, filled when short with equal-reward groups in the order
    they were sampled.  The rewards compared are the world's, before the overlong punishment (DAPO filters on
    accuracy); the batch returned carries the punishment.  Every rollout sampled and the counts go to
    ``collected``."""
    (run,) = stack.members
    cfg, kept, equal = run.config, [], []
    for _ in range(cfg.dynamic_sampling_max_batches):
        (rollout,) = sample_rollouts(stack, version, watch, shaped=False)
        collected.fresh.append(with_overlong_penalty(run, rollout))
        collected.rounds += 1
        varied = varied_rows(rollout.rewards, rollout.group_ids)
        kept.append(rollout.select(varied.nonzero().squeeze(1)))
        equal.append(rollout.select((~varied).nonzero().squeeze(1)))
        collected.groups += int(rollout.group_ids.max()) + 1
        collected.kept += group_count(kept[-1])
        if sum(group_count(part) for part in kept) >= cfg.prompts_per_update:
            break
    parts = [part for part in kept + equal if len(part)]
    return with_overlong_penalty(run, first_groups(Rollout.concat(parts), cfg.prompts_per_update))


def varied_rows(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """[B] bool: the row's group has rewards that are not all equal (max > min)."""
    low, high = group_min_max(rewards, group_ids)
    return (high > low)[group_ids]


def group_count(rollout: Rollout) -> int:
    return int(rollout.group_ids.unique().numel()) if len(rollout) else 0


def first_groups(rollout: Rollout, count: int) -> Rollout:
    """The rows of ``rollout``'s first ``count`` groups (in row order), group ids renumbered 0 … count − 1."""
    _, order = torch.unique_consecutive(rollout.group_ids, return_inverse=True)
    rows = (order < count).nonzero().squeeze(1)
    return rollout.select(rows).with_(group_ids=order[rows])


def rollout_sources(run: Run, version: int) -> list[tuple[bool, int, int]]:
    """(answered by π₀, prompts, version tag) of each part of a rollout: the current policy answers every prompt
    but a share ``schedule.other_share``, which the frozen initial policy π₀ answers (version 0)."""
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
    return overlong_limit(cfg, run.world), cfg.overlong_buffer, cfg.overlong_penalty


def overlong_penalty(lengths: Tensor, max_len: int, cache: int, factor: float = 1.0) -> Tensor:
    """R_length(y) = 0 for |y| ≤ L_max − L_cache;  ((L_max − L_cache) − |y|)/L_cache · c for L_max − L_cache < |y|
    ≤ L_max;  −c for |y| > L_max — DAPO's soft overlong punishment (Yu et al. 2025, "DAPO: An Open-Source LLM
    Reinforcement Learning System at Scale", arXiv:2503.14476, eq. 13; c = 1 there, verl's penalty_factor),
    ``lengths`` = |y| the response tokens (EOS included)."""
    lengths = lengths.to(torch.float64)
    expected = max_len - cache
    ramp = torch.clamp((expected - lengths) / cache, max=0.0) if cache else torch.zeros_like(lengths)
    return torch.where(lengths > max_len, torch.full_like(ramp, -1.0), ramp) * factor
