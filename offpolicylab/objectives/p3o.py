"""P3O: ESS-capped policy gradient with an ESS-weighted behaviour-KL regulariser (Fakoor, Aubry, Stranges, Smola
2026, "Trust the Batch, On- or Off-Policy: Adaptive Policy Optimization for RL Post-Training", arXiv:2605.12380;
public code: FeynRL-project/FeynRL ``algs/P3O/p3o.py``)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from offpolicylab.diagnostics import stats
from offpolicylab.diagnostics.stats import EXP_CLAMP
from offpolicylab.objectives.base import Objective, register
from offpolicylab.objectives.batch import TokenBatch


def kl_k3_behavior(log_ratio: Tensor) -> Tensor:
    """KL_k3(π_θ‖π_b) per token = Δ + exp(−Δ) − 1 with Δ = logp − behavior_logp (≥ 0, grad through logp).

    This is FeynRL's ``compute_kl_distance(logprobs, ref_logprobs=old_logprobs)``.  On tokens sampled from π_b it is
    a penalty rather than an unbiased KL estimate; its gradient (1 − e^−Δ)·∇logp pulls Δ back to 0.
    exp(−Δ) is evaluated at max(Δ, −80) so that float32 cannot overflow; below Δ = −80 only the linear term
    carries gradient (tested range: |Δ| ≤ 50 is exact)."""
    return log_ratio + torch.exp(-log_ratio.clamp(min=-EXP_CLAMP)) - 1.0


@register("p3o")
class P3O(Objective):
    """P3O (Fakoor et al. 2026, "Trust the Batch", arXiv:2605.12380), with w_t = exp(logp − behavior_logp) over the n valid tokens:

        ESS = (Σ w)² / (n·Σ w²)      (a batch constant, no gradient),
        ρ_t = clamp(w_t, 0, ESS)     (detached weight),
        ℓ_t = −sg(ρ_t)·A_t·logp_t + (1 − ESS)·KL_k3(π_θ‖π_b)_t,   KL_k3 = Δ + e^−Δ − 1.

    Normalisation: FeynRL sums ℓ over the valid tokens and (``normalize_loss=True``) divides by the token count,
    i.e. L = (1/n)·Σ_t ℓ_t — our default ``agg="token-mean"``; the other ``agg`` modes apply to ℓ unchanged.  ESS
    comes from :func:`offpolicylab.diagnostics.stats.effective_sample_size` (max-rescaled, finite at |Δ| = 50)
    instead of FeynRL's ``(Σw)²/(Σw² + 1e-8)/n``.  ESS is taken over the whole batch (FeynRL: the micro-batch, or
    all ranks).  Every valid token carries gradient (``token_mask`` = valid tokens).

    Metrics: ``ess``, ``p3o_kl_weight`` = 1 − ESS, ``clip_frac`` (share of valid tokens whose weight was capped at
    ESS), ``kl_behavior`` (token mean of KL_k3).
    """

    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        log_ratio = batch.log_ratio
        ess = batch.ess()
        weight = batch.ratio().clamp(max=math.exp(EXP_CLAMP))  # = exp(min(Δ, 80))
        rho = torch.minimum(weight, ess).clamp_min(0.0)
        kl = kl_k3_behavior(log_ratio)
        kl_weight = 1.0 - ess
        per_token = -rho * batch.advantages * batch.logp + kl_weight * kl
        metrics = {
            "ess": ess,
            "p3o_kl_weight": kl_weight,
            "clip_frac": stats.fraction(stats.indicator(torch.gt, weight, ess), batch.mask),
            "kl_behavior": kl.detach().sum() / batch.mask.sum().clamp_min(1.0),  # KL_k3(0) = 0 on padding
        }
        return per_token, torch.ones_like(batch.mask), metrics
