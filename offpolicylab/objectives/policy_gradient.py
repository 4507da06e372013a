"""REINFORCE and GRPO / PPO clip.

Shared notation: r = exp(logp − behavior_logp), A = advantage, ℓ = per-token loss, aggregated by ``agg``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from offpolicylab.diagnostics import stats
from offpolicylab.formulas import clip_ratio
from offpolicylab.objectives.aggregation import canonical_agg
from offpolicylab.objectives.base import Objective, Param, register
from offpolicylab.objectives.batch import TokenBatch


@register("reinforce")
class Reinforce(Objective):
    """ℓ = −A · log π_θ(a|s)  (Williams 1992).  No importance weight: on stale data this is the biased
    "NoIS" gradient whose fixed point is the 3-arm pitfall of REC (Yao et al. 2025, arXiv:2509.24203)."""


    advantage = "mean"  # group-mean baseline, no std (the REC paper's REINFORCE)
    rowwise = True

    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        return -batch.advantages * batch.logp, batch.mask, {}

    def aggregated_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]] | None:
        """``token-mean``: L = −Σ A·log π / n per run (:func:`policy_gradient_mean`); other modes: None."""
        if canonical_agg(self.agg) != "token-mean":
            return None
        return policy_gradient_mean(batch.logp, batch.advantages, batch.tokens(), batch.runs), batch.mask, {}


def policy_gradient_mean(logp: Tensor, advantages: Tensor, tokens: Tensor, blocks: int = 1) -> Tensor:
    """L = Σ (−A·log π)·m / n over each of ``blocks`` equal row blocks (n = ``tokens`` per block, [blocks]; 0-d
    for one block): REINFORCE's loss aggregated with ``token-mean``, for ``advantages`` (detached) that are 0 and a
    ``logp`` that is finite on padded tokens, as a :class:`~offpolicylab.objectives.TokenBatch`'s are (Williams 1992).

    The loss and its gradient are those of the written-out form, ``aggregate(-A * logp, m, "token-mean")``, bit for
    bit: with A = 0 on padding, (−A·log π)·m is −(A·log π) on every token (negation and the 0/1 factor are exact),
    summed in the same order, and the gradient ((g/n)·m)·(−A) is A·(−g/n).  One product and one sum forward, one
    product backward (autograd through the written-out form: three products forward, two backward)."""
    return _PolicyGradientMean.apply(logp, advantages.detach(), tokens.detach().clamp_min(1.0), blocks)


class _PolicyGradientMean(torch.autograd.Function):
    """See :func:`policy_gradient_mean` (first-order gradients only)."""

    @staticmethod
    def forward(ctx: Any, logp: Tensor, advantages: Tensor, count: Tensor, blocks: int) -> Tensor:
        ctx.save_for_backward(advantages, count)
        ctx.blocks = blocks
        return -(stats.total(advantages * logp.detach(), blocks) / count)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        advantages, count = ctx.saved_tensors
        scale = -(grad / count)  # [blocks], or 0-d for one block
        if ctx.blocks == 1:
            return advantages * scale, None, None, None
        rows = advantages.reshape(ctx.blocks, -1) * scale[:, None]
        return rows.reshape(advantages.shape), None, None, None


def straight_through(value: Tensor, logp: Tensor, coefficient: Tensor, slope: Tensor) -> Tensor:
    """A tensor with the value ``value`` and the gradient coefficient·slope w.r.t. ``logp`` (value, coefficient and
    slope detached, broadcastable to ``logp``'s shape): value + coefficient·(slope·(logp − sg(logp))) without
    computing that sum.

    This is how a loss ℓ = coefficient·f(logp) with f' = slope is differentiated without building a graph for f: no
    elementwise work forward, two products backward, in the order autograd uses for coefficient·f (upstream ·
    coefficient, then · slope), so the gradient is bit-identical to differentiating the written-out formula."""
    return _StraightThrough.apply(value, logp, coefficient, slope)


class _StraightThrough(torch.autograd.Function):
    """See :func:`straight_through` (first-order gradients only)."""

    @staticmethod
    def forward(ctx: Any, value: Tensor, logp: Tensor, coefficient: Tensor, slope: Tensor) -> Tensor:
        ctx.save_for_backward(coefficient, slope)
        ctx.shape = logp.shape
        return value.view_as(value)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, Tensor, None, None]:
        coefficient, slope = ctx.saved_tensors
        return None, (grad * coefficient * slope).expand(ctx.shape), None, None


def ratio_or_one(ratio: Tensor, dropped: Tensor, kept: Tensor) -> Tensor:
    """r on the ``kept`` tokens, 1 on the ``dropped`` ones (0/1 floats, ``kept`` = 1 − ``dropped``): exactly
    exp(kept·Δ) for r = e^Δ without a second exp — 1·r + 0 and 0·r + 1, an overflowed r of a dropped token
    (0·inf = nan) set to 1 — so no overflow leaks from tokens a loss leaves out."""
    return torch.nan_to_num(torch.addcmul(dropped, ratio, kept), nan=1.0, posinf=math.inf)


def clipped_surrogate(
    ratio: Tensor, negative: Tensor, eps_low: float, eps_high: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """PPO's clipped surrogate on detached floats (Schulman et al. 2017, arXiv:1707.06347), with −A = ``negative``:
    (−A·r, clip(r, 1−ε_low, 1+ε_high), −A·clip(r, …), ℓ = max(−A·r, −A·clip(r, …))) —
    :func:`~offpolicylab.formulas.clip_ratio` for the clip."""
    unclipped = negative * ratio
    clipped_ratio = clip_ratio(ratio, eps_low, eps_high)
    surrogate = negative * clipped_ratio
    return unclipped, clipped_ratio, surrogate, torch.maximum(unclipped, surrogate)


def dual_clip_cap(advantages: Tensor, dual_clip: float) -> Tensor:
    """−c·min(A, 0): the dual clip's cap on the A < 0 branch of PPO's loss (Ye et al. 2020, "Mastering Complex
    Control in MOBA Games with Deep Reinforcement Learning", arXiv:1912.09729), detached; 0 where A ≥ 0."""
    return advantages.detach().clamp(max=0.0) * -dual_clip


def ppo_clip_loss(
    logp: Tensor, ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float, dual_clip: float | None = None
) -> tuple[Tensor, Tensor]:
    """ℓ = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)); with dual clip c: for A < 0, ℓ = min(ℓ, −A·c)
    (Schulman et al. 2017; dual clip: Ye et al. 2020).  ε = inf means no trust region: ℓ = −A·r.

    ``ratio`` is the value of r (detached; r = exp(logp − log π_old) or a sequence ratio): the gradient w.r.t.
    ``logp`` is −A·r on the tokens ℓ = −A·r keeps and 0 where a clip set ℓ (:func:`straight_through`; the same
    gradient, bit for bit, as autograd through exp, clamp, max and the dual-clip cap).  Returns (ℓ, kept) with
    ``kept`` 1.0 on tokens whose gradient the clip kept, 0.0 on clipped ones.  Computed on detached floats (no
    boolean tensors, no ``torch.where``): on CPU these are the slow kernels."""
    ratio = ratio.detach()
    negative = -advantages.detach()
    if math.isinf(eps_low) and math.isinf(eps_high):
        unclipped = negative * ratio
        return straight_through(unclipped, logp, negative, ratio), torch.ones_like(unclipped)
    unclipped, clipped_ratio, surrogate, value = clipped_surrogate(ratio, negative, eps_low, eps_high)
    if dual_clip is not None:  # cap −A·c on A < 0; A ≥ 0 gets 0, above its ℓ = −A·min(r, 1+ε_high) ≤ 0
        value = torch.minimum(value, dual_clip_cap(advantages, dual_clip))
    kept = stats.indicator(torch.eq, value, unclipped)
    # autograd's max splits a tie −A·r = −A·clip(r) in halves, and the clip passes none of its half when r lies
    # outside [1−ε_low, 1+ε_high] (the products can tie within rounding): half the gradient there, as autograd
    tie_outside = stats.indicator(torch.eq, unclipped, surrogate) * stats.indicator(torch.ne, clipped_ratio, ratio)
    return straight_through(value, logp, negative, kept * ratio * (1.0 - 0.5 * tie_outside)), kept


@register("grpo")
class GRPO(Objective):
    """ℓ = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)), r = exp(logp − behavior_logp); dual clip caps the A < 0
    branch at −A·c (Shao et al. 2024, DeepSeekMath; PPO: Schulman et al. 2017).  ``eps_low = eps_high = inf`` is the
    no-trust-region baseline ℓ = −A·r of "Prosperity before Collapse" (M2PO).  ``prox_logp`` is ignored: the clip
    against a proximal policy is ``decoupled_ppo``."""


    params = {
        "eps_low": Param(0.2, float, low=0.0, doc="lower clip ε_low (ratio ≥ 1 − ε_low); inf = no trust region"),
        "eps_high": Param(0.2, float, low=0.0, doc="upper clip ε_high (ratio ≤ 1 + ε_high); inf = no trust region"),
        "dual_clip": Param(None, float, low=1.0, low_open=True, optional=True, doc="dual-clip constant c > 1"),
    }
    rowwise = True

    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        loss, kept = ppo_clip_loss(batch.logp, batch.ratio(), batch.advantages, self.eps_low, self.eps_high,
                                   self.dual_clip)
        return loss, kept, {"clip_frac": stats.fraction(1.0 - kept, batch.mask, batch.runs)}
