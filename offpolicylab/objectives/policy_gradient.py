"""REINFORCE and GRPO / PPO clip.

Shared notation: r = exp(logp − behavior_logp), A = advantage, ℓ = per-token loss, aggregated by ``agg``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from offpolicylab.diagnostics import stats
from offpolicylab.objectives.base import Objective, Param, register
from offpolicylab.objectives.batch import TokenBatch


@register("reinforce")
class Reinforce(Objective):
    """ℓ = −A · log π_θ(a|s)  (Williams 1992).  No importance weight: on stale data this is the biased
    "NoIS" gradient whose fixed point is the 3-arm pitfall of REC (Yao et al. 2025, arXiv:2509.24203)."""

    advantage = "mean"  # group-mean baseline, no std (the REC paper's REINFORCE)

    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        return -batch.advantages * batch.logp, torch.ones_like(batch.mask), {}


def ppo_clip_loss(
    log_ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float, dual_clip: float | None = None
) -> tuple[Tensor, Tensor]:
    """ℓ = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)); with dual clip c: for A < 0, ℓ = min(ℓ, −A·c)
    (Schulman et al. 2017; dual clip: Ye et al. 2020).  Returns (ℓ, clipped) where ``clipped`` marks tokens whose
    gradient the clip removed.  ε = inf means no trust region: ℓ = −A·r."""
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    low = 1.0 - eps_low
    high = 1.0 + eps_high
    if math.isfinite(eps_low) or math.isfinite(eps_high):
        clipped_ratio = ratio.clamp(min=low if math.isfinite(eps_low) else None, max=high if math.isfinite(eps_high) else None)
    else:
        clipped_ratio = ratio
    surrogate = -advantages * clipped_ratio
    loss = torch.maximum(unclipped, surrogate)
    clipped = surrogate > unclipped
    if dual_clip is not None:
        cap = -advantages * dual_clip
        dual = (advantages < 0) & (loss > cap)
        loss = torch.where(dual, cap, loss)
        clipped = clipped | dual
    return loss, clipped


@register("grpo")
class GRPO(Objective):
    """ℓ = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)), r = exp(logp − behavior_logp); dual clip caps the A < 0
    branch at −A·c (Shao et al. 2024, DeepSeekMath; PPO: Schulman et al. 2017).  ``eps_low = eps_high = inf`` is the
    no-trust-region baseline ℓ = −A·r of "Prosperity before Collapse" (M2PO).  When ``prox_logp`` is given the
    clip acts on π_θ/π_prox and the token is weighted by π_prox/π_behavior (decoupled PPO, AReaL)."""

    params = {
        "eps_low": Param(0.2, float, low=0.0, doc="lower clip ε_low (ratio ≥ 1 − ε_low); inf = no trust region"),
        "eps_high": Param(0.2, float, low=0.0, doc="upper clip ε_high (ratio ≤ 1 + ε_high); inf = no trust region"),
        "dual_clip": Param(None, float, low=1.0, low_open=True, optional=True, doc="dual-clip constant c > 1"),
    }

    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        log_ratio = batch.log_ratio
        weight = None
        if batch.prox_logp is not None:
            log_ratio = (batch.logp - batch.prox_logp) * batch.mask
            weight = torch.exp(batch.prox_logp - batch.behavior_logp).detach()
        loss, clipped = ppo_clip_loss(log_ratio, batch.advantages, self.eps_low, self.eps_high, self.dual_clip)
        if weight is not None:
            loss = loss * weight
        return loss, (~clipped).to(batch.mask.dtype), {"clip_frac": stats.fraction(clipped, batch.mask)}
