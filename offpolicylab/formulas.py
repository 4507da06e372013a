"""The formulas several layers share, each written once: Schulman's k3 KL estimator, Kish's effective sample size and
the PPO clip's bounds.  Pure tensor functions, no state; every module that computes one of them imports it from here.

Notation: δ = log r = log p(x) − log q(x) for a token x sampled from q, r = p(x)/q(x); A = advantage.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

#: The one clamp of the k3 estimator: its exponent is capped at 80 (e^80 ≈ 5.5e34 < float32's largest, 3.4e38), so
#: e^δ never overflows, and nothing else is clamped.
EXP_CLAMP = 80.0


def k3(log_ratio: Tensor, cap: float | None = EXP_CLAMP, out: Tensor | None = None,
       expm1: Tensor | None = None) -> Tensor:
    """k3 = (r − 1) − log r = e^δ − 1 − δ ≥ 0 per token, δ = ``log_ratio`` = log p(x) − log q(x), x ~ q: the
    unbiased, low-variance estimator of KL(q ‖ p) (J. Schulman 2020, "Approximating KL divergence",
    joschu.net/blog/kl-approx.html).  Computed as expm1(min(δ, cap)) − δ: expm1 keeps k3 ≈ δ²/2 near δ = 0, which
    e^δ − 1 loses to float32 rounding of e^δ (at δ = 1e-4 it is 5e-9, the rounding error of e^δ 6e-8).

    The clamp: ``cap`` = :data:`EXP_CLAMP` bounds only the exponent, which changes no value float32 can hold (it
    would overflow past δ ≈ 88.7).  The engines clamp more: verl's ``kl_penalty`` ``low_var_kl`` clamps δ to
    [−20, 20] and k3 to [−10, 10], OpenRLHF δ to [−10, 10]; TRL and AReaL clamp nothing.  A clamp on δ changes the
    estimator and removes its gradient exactly on the tokens that moved furthest (δ = −30: 19 instead of 29, slope
    0 instead of 1), so ours does not.  An engine's own clamp of the log-ratio is the caller's (verl's rollout
    correction clamps δ to ±20 before all its estimators and passes the clamped δ); ``cap=None`` is no clamp at all
    (AReaL's code: an infinite δ gives nan, as there).  ``out``: a buffer for the result (no allocation), which may
    not need gradient.  ``expm1``: :func:`capped_expm1` of the same arguments when the caller already has it (it may
    be ``out``)."""
    term = capped_expm1(log_ratio, cap, out) if expm1 is None else expm1
    return torch.sub(term, log_ratio, out=out)


def capped_expm1(log_ratio: Tensor, cap: float | None = EXP_CLAMP, out: Tensor | None = None) -> Tensor:
    """r − 1 = e^min(δ, cap) − 1 per token, as expm1 (full relative precision near δ = 0): the term :func:`k3`
    subtracts δ from, and the ratio r = e^min(δ, cap) (its capped value) as 1 + it.  ``cap`` and ``out``: as
    :func:`k3`'s."""
    exponent = log_ratio if cap is None else torch.clamp(log_ratio, max=cap, out=out)
    return torch.expm1(exponent, out=out)


def kish_ess(weights: Tensor, count: Tensor | float, *, overwrite: bool = False) -> Tensor:
    """(Σ w)² / (n·Σ w²) over the last dimension: Kish's effective sample size n_eff = (Σ w)² / Σ w² (L. Kish 1965,
    "Survey Sampling") as a share of the n = ``count`` samples, 1 for equal weights and 1/n when one weight
    dominates.  ``weights`` ≥ 0, 0 on padding; 0 when every weight is 0 (no effective sample).  ``overwrite``: the
    squares are written into ``weights`` (a scratch buffer the caller no longer needs; no allocation)."""
    total = weights.sum(-1)
    square = (weights.mul_(weights) if overwrite else weights * weights).sum(-1)
    return kish_ess_of_sums(total, square, count)


def kish_ess_of_sums(total: Tensor, square: Tensor, count: Tensor | float) -> Tensor:
    """:func:`kish_ess` from its sums: (Σ w)² / (n·Σ w²) with ``total`` = Σ w, ``square`` = Σ w² (any positive
    scale of the weights gives the same value); 0 when Σ w² = 0."""
    return total ** 2 / (count * square).clamp_min(torch.finfo(square.dtype).tiny)


def clip_bounds(eps_low: float, eps_high: float) -> tuple[float, float]:
    """The PPO clip's ratio bounds (1 − ε_low, 1 + ε_high) (Schulman et al. 2017, "Proximal Policy Optimization
    Algorithms", arXiv:1707.06347; an asymmetric ε: DAPO's clip-higher); an infinite ε is an infinite bound, no
    bound on that side."""
    return 1.0 - eps_low, 1.0 + eps_high


def clip_ratio(ratio: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """clip(r, 1 − ε_low, 1 + ε_high) (:func:`clip_bounds`); ``ratio`` itself when both ε are infinite."""
    low, high = clip_bounds(eps_low, eps_high)
    return ratio if math.isinf(low) and math.isinf(high) else ratio.clamp(min=low, max=high)


def clipped(value: Tensor, advantages: Tensor, low: Tensor | float, high: Tensor | float) -> Tensor:
    """(A > 0 ∧ x > high) ∨ (A < 0 ∧ x < low), boolean: the tokens whose gradient the PPO clip removes, with x the
    ratio and [low, high] = [1 − ε_low, 1 + ε_high], or x the log-ratio and its bounds in log space."""
    return ((advantages > 0) & (value > high)) | ((advantages < 0) & (value < low))
