"""Phase 3 of the update loop: evaluation every ``eval_every`` updates — the sampled reward on
``world.eval_prompts()`` with its standard error, the greedy reward, the sampled KL(π‖π₀) and, where the world is
enumerable, the exact return J(π) and KL(π‖π₀) (:func:`evaluate`).  Evaluation draws from its own generators and
never shifts the training randomness.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from offpolicylab.build import tracks_kl_init
from offpolicylab.config import TrainConfig
from offpolicylab.contracts import (
    GreedyPolicy,
    Prompts,
    Rollout,
    rewards_of,
)
from offpolicylab.diagnostics import stats
from offpolicylab.stack import Run, Stack
from offpolicylab.worlds.exact import kl_divergence, sequence_logprobs

__all__ = ["enumerated_logprobs", "eval_columns", "eval_generator", "evaluate", "evaluate_due",
           "exact_diagnostics", "greedy_reward", "kl_from_scores", "sampled_numbers"]


def eval_columns(run: Run) -> list[str]:
    columns = ["eval_reward_sampled", "eval_reward_se", "eval_reward_greedy"]
    if tracks_kl_init(run.config):
        columns += ["eval_kl_init_k1", "eval_kl_init_k3"]
    if run.enumerable:
        columns += ["exact_return", "exact_kl_init"]
    return columns


def evaluate_due(stack: Stack, update: int, due: list[bool]) -> list[dict[str, Any]]:
    """Each member's evaluation numbers where ``due`` (the whole stack at once when every member is due, else each
    due member as a stack of one), empty columns where not."""
    if all(due):
        return evaluate(stack, update)
    return [evaluate(Stack.one(run), update)[0] if ok else dict.fromkeys(eval_columns(run))
            for run, ok in zip(stack.members, due, strict=True)]


def evaluate(stack: Stack, update: int) -> list[dict[str, float]]:
    """Each member's Monte-Carlo J: the mean reward of ``eval_samples`` sampled responses per prompt of
    ``world.eval_prompts()`` and its standard error (:func:`stats.stratified_standard_error`, prompts as strata); the
    reward of greedy responses; the sampled KL(π‖π₀) (:func:`kl_from_scores`) when tracked; exact J(π) and
    KL(π‖π₀) when the world can enumerate its responses.  Each member uses its own generator
    (:func:`eval_generator`), so evaluation never shifts the training randomness; the stack's policies sample, decode
    greedily, score and enumerate for all members at once."""
    runs, cfg = stack.members, stack.config
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
    world = stack.members[0].world
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


def kl_from_scores(initial_logp: Tensor, sampled: Rollout) -> dict[str, float]:
    """Per-token estimates of KL(π‖π₀) from responses sampled by π (Schulman's k1 and k3 with
    δ = log π₀(y_t) − log π(y_t)): k1 = E[−δ], k3 = E[e^δ − 1 − δ] ≥ 0, token means.  log π is the sampler's
    ``behavior_logp``; ``initial_logp`` is π₀'s log-probs of the same tokens (one no-grad forward of the stack's
    frozen π₀, :func:`evaluate`), at the sampling temperature, so the KL is between the tempered distributions."""
    delta = initial_logp.detach().to(sampled.behavior_logp.dtype) - sampled.behavior_logp
    k1, k3 = stats.kl_estimates(delta, sampled.response_mask)
    return {"eval_kl_init_k1": float(k1), "eval_kl_init_k3": float(k3)}


def exact_diagnostics(run: Run, logp: Tensor | None = None) -> dict[str, float]:
    """J(π) = E_x Σ_y π(y|x) R(x, y) and KL(π‖π₀) = E_x Σ_y π(y|x)(log π − log π₀) by enumeration, scoring π once
    (``logp``: log π(y|x) [N, M] when already computed; π₀'s log-probs are computed once per run and cached)."""
    enumeration = run.world.enumeration
    logp = enumeration.logprobs(run.policy) if logp is None else logp
    if run.initial_logprobs is None:
        run.initial_logprobs = enumeration.logprobs(run.initial)
    return {"exact_return": enumeration.return_of(logp), "exact_kl_init": kl_divergence(logp, run.initial_logprobs)}
