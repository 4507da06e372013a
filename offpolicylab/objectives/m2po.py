"""M2PO: second-moment trust region ("Prosperity before Collapse", Zheng et al. 2025; code: Infini-AI-Lab/M2PO).

Shared notation: Δ = log r = logp − behavior_logp, A = advantage, and the *trust-region tokens*
H = {(A > 0, r > 1) or (A < 0, r < 1)} — the tokens a PPO clip could act on
(:func:`offpolicylab.diagnostics.stats.trust_region_mask`).  M̂2 = (1/|H|) Σ_{t∈H} Δ_t².

Both variants find their cut with ONE sort of the H values of Δ² and one cumulative sum; there is no
token-at-a-time loop (selecting H is the one data-dependent shape).
"""

from __future__ import annotations

import torch
from torch import Tensor

from offpolicylab.diagnostics import stats
from offpolicylab.objectives.base import Objective, Param, register
from offpolicylab.objectives.batch import TokenBatch

M2PO_VARIANTS = ("mask", "cap")


def _sorted_trust_region(delta_sq: Tensor, trust_region: Tensor) -> tuple[Tensor, Tensor]:
    """Sort the H values of Δ² once (only those: the trust region is a fraction of all tokens).

    Returns float64 ``values`` v_(1) ≤ … ≤ v_(n) (n = |H|) and their cumulative sums ``prefix`` (P_k = Σ_{j≤k} v_(j)).
    """
    values = torch.sort(delta_sq.reshape(-1)[trust_region.reshape(-1) > 0]).values.to(torch.float64)
    return values, torch.cumsum(values, dim=0)


def m2po_mask(delta_sq: Tensor, trust_region: Tensor, tau: float) -> Tensor:
    """Paper variant: the H tokens to mask, [B, T] bool.

    Keep the k* smallest Δ² of H, k* = max{k : (1/k) Σ_{j≤k} Δ²_(j) ≤ τ} (k = 0 allowed), i.e. mask the H tokens
    with the largest Δ² until the mean over the rest of H is ≤ τ.  The prefix mean of an ascending sequence is
    non-decreasing in k, so the valid k form {0..k*} and k* is a count; the mask is then the threshold
    Δ² ≥ v_(k*+1).  Tokens tied exactly at the cut are all masked (the kept mean stays ≤ τ).
    """
    values, prefix = _sorted_trust_region(delta_sq, trust_region)
    ranks = torch.arange(1, values.numel() + 1, device=values.device, dtype=values.dtype)
    k_star = (prefix <= tau * ranks).sum()
    inf = torch.full((1,), float("inf"), dtype=values.dtype, device=values.device)
    threshold = torch.cat([values, inf])[k_star]
    return (trust_region > 0) & (delta_sq >= threshold.to(delta_sq.dtype))  # exact: values came from delta_sq


def m2po_cap_bound(delta_sq: Tensor, trust_region: Tensor, tau: float) -> tuple[Tensor, Tensor]:
    """Official-code variant: (τ', active) where τ' (0-dim) solves Σ_{t∈H} min(Δ_t², τ'²) = τ·|H| and ``active``
    says whether clipping is needed at all (M̂2 > τ).

    g(c) = Σ_H min(Δ², c) is piecewise linear and increasing; with ascending values v_(1..n) and prefix sums P_k,
    g(v_(k)) = P_k + (n − k)·v_(k).  Let k* = #{k ≥ 1 : g(v_(k)) ≤ τn}; then c = (τn − P_k*) / (n − k*) lies in
    [v_(k*), v_(k*+1)] and τ' = √c.  When M̂2 ≤ τ, τ' = max_H |Δ| (0 when H is empty): the tightest bound that
    clips nothing, so the logged bound stays finite.  The official ``_solve_tau_from_sorted_delta2`` returns the
    breakpoint √v_(k*) instead of the exact root (a slightly tighter bound); we solve the equation exactly.
    """
    values, prefix = _sorted_trust_region(delta_sq, trust_region)
    if values.numel() == 0:
        return delta_sq.new_zeros(()), torch.zeros((), dtype=torch.bool, device=delta_sq.device)
    n = float(values.numel())
    ranks = torch.arange(1, values.numel() + 1, device=values.device, dtype=values.dtype)
    target = tau * n
    k_star = ((prefix + (n - ranks) * values) <= target).sum()
    below = torch.cat([prefix.new_zeros(1), prefix])[k_star]
    solved = (target - below) / (n - k_star.to(values.dtype)).clamp_min(1.0)
    active = prefix[-1] > target
    cap = torch.where(active, solved, values[-1])
    return cap.sqrt().to(delta_sq.dtype), active


@register("m2po")
class M2PO(Objective):
    """M2PO (Zheng et al. 2025, "Prosperity before Collapse: How Far Can Off-Policy RL Reach with Stale Data on
    LLMs?"), on the trust-region tokens H = {(A>0, r>1) or (A<0, r<1)} with M̂2 = mean_H Δ²:

    - ``variant="mask"`` (paper): mask the H tokens with the largest Δ² until mean_{H kept} Δ² ≤ τ;
      ℓ = −A·r on kept tokens, 0 on masked ones, averaged over *all* tokens (the masked ones stay in the
      denominator of ``agg``).  No ratio clipping.
    - ``variant="cap"`` (official code, ``compute_m2po_policy_loss``): solve Σ_H min(Δ², τ'²) = τ·|H| and apply
      ℓ = max(−A·r, −A·clip(r, e^−τ', e^τ')) (clipped tokens get no gradient); no clipping when M̂2 ≤ τ.  The
      official code's optional ``miniclip_low/high`` floor on the clip range is not set by its launch scripts and
      is left out here.

    Metrics: ``m2_tr`` (M̂2 over H), ``m2_tr_after`` (over the kept H tokens for ``mask``; mean_H min(Δ², τ'²) for
    ``cap``), ``tr_frac`` (|H| / valid tokens), ``mask_frac`` or ``clip_frac``, and ``m2po_bound`` (τ') for ``cap``.
    """

    params = {
        "tau": Param(0.04, float, low=0.0, low_open=True, doc="second-moment budget τ on trust-region tokens"),
        "variant": Param("mask", str, choices=M2PO_VARIANTS, doc="mask (paper) or cap (official code)"),
    }

    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        log_ratio = batch.log_ratio
        delta = log_ratio.detach()
        trust_region = stats.trust_region_mask(delta, batch.advantages, batch.mask)
        delta_sq = delta**2
        metrics = {
            "m2_tr": stats.masked_mean(delta_sq, trust_region),
            "tr_frac": stats.fraction(trust_region > 0, batch.mask),
        }
        if self.variant == "mask":
            return self._mask_loss(batch, log_ratio, delta_sq, trust_region, metrics)
        return self._cap_loss(batch, log_ratio, delta_sq, trust_region, metrics)

    def _mask_loss(
        self, batch: TokenBatch, log_ratio: Tensor, delta_sq: Tensor, trust_region: Tensor, metrics: dict[str, Tensor]
    ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        masked = m2po_mask(delta_sq, trust_region, self.tau)
        keep = ~masked
        ratio = torch.exp(torch.where(keep, log_ratio, torch.zeros_like(log_ratio)))
        per_token = torch.where(keep, -batch.advantages * ratio, torch.zeros_like(ratio))
        metrics["m2_tr_after"] = stats.masked_mean(delta_sq, trust_region * keep)
        return per_token, keep.to(batch.mask.dtype), metrics

    def _cap_loss(
        self, batch: TokenBatch, log_ratio: Tensor, delta_sq: Tensor, trust_region: Tensor, metrics: dict[str, Tensor]
    ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        bound, active = m2po_cap_bound(delta_sq, trust_region, self.tau)
        delta = log_ratio.detach()
        advantages = batch.advantages
        clipped = ((advantages > 0) & (delta > bound)) | ((advantages < 0) & (delta < -bound))
        clipped = clipped & (batch.mask > 0) & active
        ratio = torch.exp(torch.where(clipped, torch.zeros_like(log_ratio), log_ratio))
        clipped_ratio = torch.exp(delta.clamp(min=-bound, max=bound))
        per_token = torch.where(clipped, -advantages * clipped_ratio, -advantages * ratio)
        metrics["m2_tr_after"] = stats.masked_mean(torch.minimum(delta_sq, bound**2), trust_region)
        metrics["clip_frac"] = stats.fraction(clipped, batch.mask)
        metrics["m2po_bound"] = bound
        return per_token, (~clipped).to(batch.mask.dtype), metrics
