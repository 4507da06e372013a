"""Building a run (:class:`~offpolicylab.stack.Run`) from a :class:`~offpolicylab.config.TrainConfig`: its world,
policy, objective, schedule, optimizer and collapse detector, after every check that can refuse the configuration —
the memory plan (:func:`check_memory`, :func:`plan_memory`), the overlong punishment's buffer, the objective's needs
— so that a bad name or value raises ``ValueError`` before any file is written.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import torch

from offpolicylab.behavior import check_correction
from offpolicylab.config import TrainConfig, overlong_limit
from offpolicylab.contracts import (
    ClonablePolicy,
    ExactWorld,
    MemoryPlanningPolicy,
    Policy,
    World,
)
from offpolicylab.diagnostics.collapse import CollapseDetector
from offpolicylab.locations import physical_memory
from offpolicylab.objectives import Objective, get_objective
from offpolicylab.objectives.regularization import check_entropy_gradient
from offpolicylab.policies import make_policy, policy_ability
from offpolicylab.reference import uses_reference
from offpolicylab.stack import Run, make_optimizer
from offpolicylab.staleness import parse_schedule
from offpolicylab.tracking import check_installed, parse_report_to
from offpolicylab.worlds import make_world
from offpolicylab.worlds.exact import MAX_ENUMERATION

__all__ = ["advantage_used", "build", "check_memory", "check_overlong", "frozen_copy", "is_enumerable",
           "plan_memory", "tracks_kl_init", "with_stored_plan"]


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
        collapse_detector=CollapseDetector(margin=config.collapse_margin,
                                           gain_fraction=config.collapse_gain_fraction, spike=config.collapse_spike,
                                           window=config.collapse_window),
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
    max_len = overlong_limit(config, world)
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
    """Whether evaluation estimates KL(π‖π₀) from its samples: ``eval_kl_init`` on, or auto and a policy kind that
    keeps a frozen copy by default (not a large model, whose copy would double its memory unless asked for)."""
    return config.eval_kl_init == "on" or (
        config.eval_kl_init == "auto" and policy_ability(config.policy, "frozen_copy", True))
