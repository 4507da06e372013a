"""Where an update's behaviour log-prob comes from: the sampling engine's numbers or the trainer's.

Every objective's ratio is r_t = π_θ(y_t) / π_b(y_t) with log π_b = ``behavior_logp``.  When the engine that sampled
the tokens computes differently from the trainer (a reduced ``sampler_precision``, ``sampler_noise_std``, or an
external engine such as vLLM), there are two candidates for log π_b, and RL frameworks offer both (verl recomputes
``old_log_prob`` with the actor by default and can use the rollout's log-probs instead; TRL's
``vllm_importance_sampling_correction`` keeps the engine's numbers for truncated IS):

- ``trainer``: log π_b = the trainer's own forward of the tokens (fp32, no grad).  The ratio then measures
  staleness alone; the engine's numbers stay in ``sampler_logp``, where only TIS (``tis_cap``: Yao et al. 2025,
  "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training", blog post) sees them.
- ``sampler``: log π_b = the engine's numbers.  The numeric mismatch then enters every ratio — the off-policy data
  of the P3O paper's FP8 rollouts (Fakoor et al. 2026, arXiv:2605.12380), which its ESS cap and MIS-PO's
  trajectory filter act on; ``sampler_logp`` holds the same numbers.
- ``auto``: each policy's default — ``trainer`` for the toy policies (their rollouts carry the policy's own
  numbers at no extra cost), ``sampler`` for ``hf`` (a recompute costs one forward per batch).

``sampler_logp`` is kept in every case (absent only when the engine computes exactly as the trainer does).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch

from offpolicylab.config import BEHAVIOR_SOURCES
from offpolicylab.contracts import Policy, Prompts, Rollout
from offpolicylab.policies.autoregressive import AutoregressivePolicy


def sample_rollout(policy: Policy, prompts: Prompts, group_size: int, temperature: float,
                   generator: torch.Generator | Sequence[torch.Generator] | None, source: str) -> Rollout:
    """``policy.sample(prompts, group_size, temperature, generator)`` with ``behavior_logp`` from ``source``
    (:func:`resolve_behavior`); a toy policy whose numbers ``source`` does not use skips computing them.  A policy
    with ``logp_micro_batch = m > 0`` whose behaviour numbers are the trainer's has them recomputed right after
    generation by its scoring forward in micro-batches of m rows (:func:`recompute_behavior_logp`), as verl's actor
    recomputes ``old_log_prob``; the rollout, stored in the stale queue, carries them."""
    micro_batch = int(getattr(policy, "logp_micro_batch", 0) or 0)
    if micro_batch and behavior_source(policy, source) == "trainer":
        rollout = policy.sample(prompts, group_size, temperature, generator, policy_logp=False)
        return recompute_behavior_logp(policy, rollout, micro_batch)
    if source == "sampler" and isinstance(policy, AutoregressivePolicy):
        rollout = policy.sample(prompts, group_size, temperature, generator, policy_logp=False)
    else:
        rollout = policy.sample(prompts, group_size, temperature, generator)
    return resolve_behavior(policy, rollout, source)


def behavior_source(policy: Policy, source: str) -> str:
    """``trainer`` or ``sampler``: the source ``source`` (``auto`` resolved: the toy policies' own numbers, an ``hf``
    policy's sampler's)."""
    if source != "auto":
        return source
    return "trainer" if isinstance(policy, AutoregressivePolicy) else "sampler"


def check_correction(objective: Any, policy: Policy, source: str) -> None:
    """Refuse a mismatch correction (``tis_cap`` or ``correction``) when the behaviour log-probs are the sampler's:
    the correction weighs π_b / π_sampler, which ``behavior_logp = sampler`` makes 1 on every token, so the run would
    train uncorrected without saying so."""
    corrected = getattr(objective, "tis_cap", None) is not None or getattr(objective, "correction", None)
    if corrected and behavior_source(policy, source) == "sampler":
        via = " (behavior_logp=auto is sampler for this policy)" if source == "auto" else ""
        raise ValueError(f"objective {objective.name!r} corrects the trainer/sampler mismatch, but behavior_logp is "
                         f"the sampler's{via}: the correction's ratio π_b/π_sampler would be 1 on every token; "
                         "valid: behavior_logp=trainer (the engines' recompute of the old log-probs), or no "
                         "tis_cap / correction")


def resolve_behavior(policy: Policy, rollout: Rollout, source: str) -> Rollout:
    """``rollout`` with ``behavior_logp`` taken from ``source`` (``auto``, ``trainer``, ``sampler``; module
    docstring).  A toy policy's rollout carries its own numbers in ``behavior_logp`` and the engine's in
    ``sampler_logp``; an ``hf`` rollout carries its sampler's numbers in both (``sampler_logp`` only when the
    sampler's precision differs from the trainer's)."""
    if source not in BEHAVIOR_SOURCES:
        raise ValueError(f"behavior_logp must be one of {', '.join(BEHAVIOR_SOURCES)}, got {source!r}")
    own = isinstance(policy, AutoregressivePolicy)
    if behavior_source(policy, source) == "sampler":
        if rollout.sampler_logp is None:  # the engine computed exactly the numbers behavior_logp holds
            return rollout
        return rollout.with_(behavior_logp=rollout.sampler_logp.clone())
    return rollout if own else recompute_behavior_logp(policy, rollout)


def recompute_behavior_logp(policy: Policy, rollout: Rollout, micro_batch: int = 0) -> Rollout:
    """behavior_logp ← log π(y_t | x, y_<t) from the policy's training forward (``score``, no grad), as verl's
    recompute of old_log_prob — in consecutive micro-batches of ``micro_batch`` rows (0: one forward of every row),
    its ``log_prob_micro_batch_size``, with the kernels a policy picks for them (``recompute_kernels``: a
    transformer's ``recompute_split_k``); the sampler's numbers become ``sampler_logp`` (its own ``sampler_logp`` when it
    reported one).  The objective's log-ratio logp − behavior_logp then measures staleness alone and
    behavior_logp − sampler_logp the sampler/trainer numeric mismatch (Yao et al. 2025, "Your efficient RL framework
    secretly brings you off-policy RL training")."""
    rows = len(rollout)
    step = micro_batch if 0 < micro_batch < rows else rows
    kernels = getattr(policy, "recompute_kernels", contextlib.nullcontext) if micro_batch > 0 else contextlib.nullcontext
    with torch.no_grad(), kernels():
        parts = [policy.score(rollout if step == rows else rollout.select(torch.arange(start, min(start + step, rows))))
                 [0] for start in range(0, rows, step)]
    logp = parts[0] if len(parts) == 1 else torch.cat(parts)
    sampler = rollout.sampler_logp if rollout.sampler_logp is not None else rollout.behavior_logp
    return rollout.with_(behavior_logp=logp.detach() * rollout.response_mask, sampler_logp=sampler)
