"""Pure statistics of importance ratios and policies, on masked ``[B, T]`` tensors.

Every function takes ``mask`` (1 = token counts) and returns detached tensors; none calls ``.item()``.
Notation: r = exp(Δ), Δ = log r = logp − behavior_logp.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Log-ratios are clamped at this before exp: e^80 ≈ 5.5e34 < float32 max, so exp never overflows.
EXP_CLAMP = 80.0


def _masked(values: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask > 0, values, torch.zeros((), dtype=values.dtype, device=values.device))


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Σ m·x / max(Σ m, 1)."""
    return _masked(values, mask).sum() / mask.sum().clamp_min(1.0)


def masked_max(values: Tensor, mask: Tensor) -> Tensor:
    """max over tokens with m = 1 (0 when none)."""
    if values.numel() == 0:
        return values.new_zeros(())
    neg_inf = torch.full((), float("-inf"), dtype=values.dtype, device=values.device)
    top = torch.where(mask > 0, values, neg_inf).max()
    return torch.where(torch.isfinite(top), top, values.new_zeros(()))


def trust_region_mask(log_ratio: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """M2PO's trust-region tokens H = {(A > 0, r > 1) or (A < 0, r < 1)} (the tokens PPO would clip), as 0/1."""
    tr = ((advantages > 0) & (log_ratio > 0)) | ((advantages < 0) & (log_ratio < 0))
    return (tr & (mask > 0)).to(mask.dtype)


def effective_sample_size(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """ESS = (Σ w)² / (n · Σ w²), w = r over the n valid tokens; 1 for uniform ratios, → 1/n when one dominates.

    Computed with weights rescaled by max(w) (ESS is scale-free), so log-ratios of ±50 stay finite.
    Source: Kong (1992); P3O "Trust the Batch" (FeynRL).
    """
    log_ratio = log_ratio.detach()
    if log_ratio.numel() == 0:
        return log_ratio.new_ones(())
    neg_inf = torch.full((), float("-inf"), dtype=log_ratio.dtype, device=log_ratio.device)
    shifted = torch.where(mask > 0, log_ratio, neg_inf)
    top = shifted.max()
    top = torch.where(torch.isfinite(top), top, log_ratio.new_zeros(()))
    weights = torch.exp(shifted - top)
    n = mask.sum().clamp_min(1.0)
    ess = weights.sum() ** 2 / (n * (weights**2).sum()).clamp_min(torch.finfo(weights.dtype).tiny)
    return torch.where(mask.sum() > 0, ess, log_ratio.new_ones(()))


def ratio_summary(log_ratio: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """The standard ratio statistics over valid tokens, in one pass (Δ = log r, r = e^Δ):

        ratio_mean = E[r], ratio_max = max r, log_ratio_abs_mean = E|Δ|,
        m2 = E[Δ²]  (M̂2 of M2PO, "Prosperity before collapse"),  ess = (Σ r)² / (n Σ r²)  (Kong 1992),
        kl_k1 = E[−Δ], kl_k3 = E[(e^Δ − 1) − Δ]  (Schulman's estimators of KL(π_b ‖ π_θ) from samples of π_b;
        k3 is unbiased and non-negative).
    """
    delta = log_ratio.detach()
    keep = mask > 0
    count = mask.sum().clamp_min(1.0)
    zero = torch.zeros((), dtype=delta.dtype, device=delta.device)

    def mean(values: Tensor) -> Tensor:  # masked_mean with the shared test and count
        return torch.where(keep, values, zero).sum() / count

    clamped = delta.clamp(max=EXP_CLAMP)
    ratio = torch.exp(clamped)
    return {
        "ratio_mean": mean(ratio),
        "ratio_max": masked_max(ratio, mask),
        "log_ratio_abs_mean": mean(delta.abs()),
        "m2": mean(delta**2),
        "ess": effective_sample_size(delta, mask),
        "kl_k1": mean(-delta),
        "kl_k3": mean(torch.expm1(clamped) - delta),
    }


def fraction(selected: Tensor, mask: Tensor) -> Tensor:
    """Share of valid tokens where ``selected`` holds: Σ m·s / Σ m."""
    return masked_mean(selected.to(mask.dtype), mask)


def sequence_log_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """[B] log of the geometric-mean ratio ρ(τ) = exp(mean_t log r_t) (GSPO, MIS-PO); 0 for empty sequences."""
    tokens = mask.sum(dim=-1)
    return _masked(log_ratio, mask).sum(dim=-1) / tokens.clamp_min(1.0)
