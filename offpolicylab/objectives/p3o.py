"""P3O: ESS-capped policy gradient with an ESS-weighted behaviour-KL regulariser (Fakoor, Aubry, Stranges, Smola
2026, "Trust the Batch, On- or Off-Policy: Adaptive Policy Optimization for RL Post-Training", arXiv:2605.12380;
public code: FeynRL-project/FeynRL ``algs/P3O/p3o.py``)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from offpolicylab.diagnostics import stats
from offpolicylab.formulas import EXP_CLAMP, capped_expm1, k3
from offpolicylab.objectives.base import Objective, register
from offpolicylab.objectives.batch import TokenBatch


@register("p3o")
class P3O(Objective):
    """P3O (Fakoor et al. 2026, "Trust the Batch", arXiv:2605.12380), with w_t = exp(logp − behavior_logp) over the n valid tokens:

        ESS = (Σ w)² / (n·Σ w²)      (a batch constant, no gradient),
        ρ_t = clamp(w_t, 0, ESS)     (detached weight),
        ℓ_t = −sg(ρ_t)·A_t·logp_t + (1 − ESS)·KL_k3(π_θ‖π_b)_t,   KL_k3 = Δ + e^−Δ − 1.

    (:func:`offpolicylab.formulas.k3` of −Δ; FeynRL's ``compute_kl_distance(logprobs, ref_logprobs=old_logprobs)``).
    On tokens sampled from π_b it is a penalty rather than an unbiased KL estimate; its gradient (1 − e^−Δ)·∇logp
    pulls Δ back to 0.  e^−Δ is capped at e^80 (k3's one clamp): below Δ = −80 only the linear term carries gradient.

    Normalisation: FeynRL sums ℓ over the valid tokens and (``normalize_loss=True``) divides by the token count,
    i.e. L = (1/n)·Σ_t ℓ_t — our default ``agg="token-mean"``; the other ``agg`` modes apply to ℓ unchanged.  ESS
    comes from :func:`offpolicylab.diagnostics.stats.effective_sample_size` (max-rescaled, finite at |Δ| = 50)
    instead of FeynRL's ``(Σw)²/(Σw² + 1e-8)/n``.  ESS is taken over the whole batch (FeynRL: the micro-batch, or
    all ranks).  Every valid token carries gradient (``token_mask`` = valid tokens).

    Metrics: ``ess``, ``p3o_kl_weight`` = 1 − ESS, ``clip_frac`` (share of valid tokens whose weight was capped at
    ESS), ``kl_behavior`` (token mean of KL_k3).
    """

    rowwise = True  # ESS and the metrics per run (TokenBatch.ess, TokenBatch.total)

    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        delta, ess = batch.delta(), batch.ess()
        kl_weight = 1.0 - ess
        ess_rows, kl_weight_rows = batch.per_row(ess), batch.per_row(kl_weight)  # each row its run's
        rho = torch.minimum(batch.ratio(), ess_rows)  # = clamp(min(w, e^80), 0, ESS): w ≥ 0 and ESS ≤ 1 < e^80
        coefficient = -rho * batch.advantages
        term = capped_expm1(-delta)  # e^min(−Δ, 80) − 1, shared by k3 and its slope
        kl = k3(-delta, expm1=term)
        value = coefficient * batch.logp.detach() + kl_weight_rows * kl
        # d e^−Δ/dΔ = −e^−Δ where the cap passes, e^−Δ as autograd's expm1 derivative writes it: expm1(·) + 1
        slope = (term + 1.0) * stats.indicator(torch.ge, delta, -EXP_CLAMP)
        metrics = {
            "ess": ess,
            "p3o_kl_weight": kl_weight,
            "clip_frac": stats.fraction(stats.indicator(torch.gt, batch.ratio(), ess_rows), batch.mask, batch.runs),
            "kl_behavior": batch.total(kl) / batch.tokens().clamp_min(1.0),  # KL_k3(0) = 0 on padding
        }
        return _p3o_gradient(value, batch.logp, coefficient, kl_weight_rows, slope), batch.mask, metrics


def _p3o_gradient(value: Tensor, logp: Tensor, coefficient: Tensor, kl_weight: Tensor, slope: Tensor) -> Tensor:
    """ℓ with the value ``value`` and P3O's gradient w.r.t. ``logp`` (everything else detached):

        ∂ℓ/∂logp = coefficient + kl_weight·(1 − slope),   coefficient = −ρ·A,  slope = e^−Δ·1[Δ ≥ −80]

    computed from the upstream gradient g as autograd computes it for the written-out formula with
    :func:`~offpolicylab.formulas.k3` (g·coefficient, and g·kl_weight through the k3 term's two paths, added), so the gradient is bit for bit autograd's — without a graph
    of the clamp, exp and sums forward (see :func:`~offpolicylab.objectives.policy_gradient.straight_through`)."""
    return _P3OGradient.apply(value, logp, coefficient, kl_weight, slope)


class _P3OGradient(torch.autograd.Function):
    """See :func:`_p3o_gradient` (first-order gradients only)."""

    @staticmethod
    def forward(ctx: Any, value: Tensor, logp: Tensor, coefficient: Tensor, kl_weight: Tensor,
                slope: Tensor) -> Tensor:
        ctx.save_for_backward(coefficient, kl_weight, slope)
        return value.view_as(value)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, Tensor, None, None, None]:
        coefficient, kl_weight, slope = ctx.saved_tensors
        kl_grad = grad * kl_weight
        return None, grad * coefficient + (kl_grad - kl_grad * slope), None, None, None
