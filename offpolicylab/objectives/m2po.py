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

from offpolicylab import formulas
from offpolicylab.diagnostics import stats
from offpolicylab.objectives.base import Objective, Param, register
from offpolicylab.objectives.batch import TokenBatch
from offpolicylab.objectives.policy_gradient import ratio_or_one, straight_through

M2PO_VARIANTS = ("mask", "cap")


class SortedTrustRegion:
    """The H values of Δ² in ascending order, v_(1) ≤ … ≤ v_(n) (n = |H|), with their prefix sums P_k = Σ_{j≤k} v_(j),
    sorting only the tail above τ.

    Both variants' cut k* lies at or above n_s = #{v < τ}: every prefix of values below τ has mean < τ (mask) and
    g(v_(k)) = P_k + (n − k)·v_(k) ≤ n·v_(k) < τn (cap).  So the n_s small values are only summed (S = P_{n_s}) and
    just the n − n_s tail values are sorted, typically a small share of H; P_{n_s + j} = S + Σ_{i≤j} tail_(i).
    Float64 throughout; S is summed in a different order than one running sum over all of H, which can move
    P_k by float64 rounding only (k* changes only if some P_k/k lies within ~1e-16 relative of τ).
    """

    def __init__(self, delta_sq: Tensor, trust_region: Tensor, tau: float) -> None:
        """``delta_sq`` ≥ 0 and ``trust_region`` (0/1 floats) are [B, T]; only the tail is gathered."""
        in_tail = trust_region * stats.indicator(torch.ge, delta_sq, tau)
        small = trust_region - in_tail  # 0/1: H values < τ
        self.small_values = delta_sq * small  # exact: the values or 0
        self.n_small = small.sum().to(torch.float64)
        self.small_sum = self.small_values.sum(dtype=torch.float64)
        self.tail = torch.sort(delta_sq[in_tail > 0]).values.to(torch.float64)  # to float64: exact and monotone
        self.prefix = self.small_sum + torch.cumsum(self.tail, dim=0)  # P_{n_s + j}, j = 1 … n − n_s
        self.ranks = self.n_small + torch.arange(1, self.tail.numel() + 1, device=self.tail.device,
                                                 dtype=self.tail.dtype)

    @property
    def n(self) -> int:
        """|H| (read on the host: only the cap variant needs it)."""
        return int(self.n_small) + self.tail.numel()

    @property
    def small_max(self) -> Tensor:
        """The largest H value below τ (0 when there is none)."""
        return self.small_values.max().to(torch.float64) if self.small_values.numel() else self.small_sum


def m2po_mask(delta_sq: Tensor, trust_region: Tensor, tau: float, runs: int = 1) -> Tensor:
    """Paper variant: the H tokens to mask, [B, T] as 0/1 floats.

    Keep the k* smallest Δ² of H, k* = max{k : (1/k) Σ_{j≤k} Δ²_(j) ≤ τ} (k = 0 allowed), i.e. mask the H tokens
    with the largest Δ² until the mean over the rest of H is ≤ τ.  The prefix mean of an ascending sequence is
    non-decreasing in k, so the valid k form {0..k*} and k* is a count; the mask is then the threshold
    Δ² ≥ v_(k*+1).  Tokens tied exactly at the cut are all masked (the kept mean stays ≤ τ).  Only the values ≥ τ
    are sorted (:class:`SortedTrustRegion`).  With ``runs`` > 1 the rows are
    that many runs' equal consecutive blocks, each cut at its own k* (:func:`m2po_mask_runs`).
    """
    if runs > 1:
        return m2po_mask_runs(delta_sq, trust_region, tau, runs)
    region = SortedTrustRegion(delta_sq, trust_region, tau)
    cut = (region.prefix <= tau * region.ranks).sum()  # k* − n_s
    inf = torch.full((1,), float("inf"), dtype=torch.float64, device=delta_sq.device)
    threshold = torch.cat([region.tail, inf])[cut]
    return trust_region * stats.indicator(torch.ge, delta_sq, threshold.to(delta_sq.dtype))  # exact: from delta_sq


def m2po_mask_runs(delta_sq: Tensor, trust_region: Tensor, tau: float, runs: int) -> Tensor:
    """:func:`m2po_mask` of each of ``runs`` equal consecutive row blocks, in one pass, each block's cut its own
    call's: per block (a row of [runs, N]) the sum S of its H values < τ, its tail of H values ≥ τ sorted ascending
    (the other entries keyed +inf sort after it), the prefix sums P_{n_s + j} = S + Σ_{i≤j} tail_(i) (a cumulative
    sum reads only the entries before it, so the +inf after the tail change none of them) and k* − n_s = #{j ≤ n −
    n_s : P_{n_s + j} ≤ τ·(n_s + j)}; the mask is Δ² ≥ the block's v_(k*+1) (+inf when none)."""
    values, region = delta_sq.reshape(runs, -1), trust_region.reshape(runs, -1)
    in_tail = region * stats.indicator(torch.ge, values, tau)
    small = region - in_tail
    small_sum = (values * small).sum(-1, dtype=torch.float64)[:, None]
    inf = torch.full((), float("inf"), dtype=values.dtype, device=values.device)
    tail = torch.sort(torch.where(in_tail > 0, values, inf), dim=-1).values.to(torch.float64)
    positions = torch.arange(1, tail.shape[-1] + 1, device=tail.device, dtype=tail.dtype)
    prefix = small_sum + torch.cumsum(tail, dim=-1)
    ranks = small.sum(-1).to(torch.float64)[:, None] + positions
    inside = positions <= in_tail.sum(-1).to(torch.float64)[:, None]
    cut = ((prefix <= tau * ranks) & inside).sum(-1, keepdim=True)
    threshold = torch.cat([tail, torch.full_like(tail[:, :1], float("inf"))], dim=-1).gather(-1, cut)
    return (region * stats.indicator(torch.ge, values, threshold.to(values.dtype))).reshape(delta_sq.shape)


def m2po_cap_bound(delta_sq: Tensor, trust_region: Tensor, tau: float) -> tuple[Tensor, Tensor]:
    """Official-code variant: (τ', active) where τ' (0-dim) solves Σ_{t∈H} min(Δ_t², τ'²) = τ·|H| and ``active``
    says whether clipping is needed at all (M̂2 > τ).

    g(c) = Σ_H min(Δ², c) is piecewise linear and increasing; with ascending values v_(1..n) and prefix sums P_k,
    g(v_(k)) = P_k + (n − k)·v_(k).  Let k* = #{k ≥ 1 : g(v_(k)) ≤ τn}; then c = (τn − P_k*) / (n − k*) lies in
    [v_(k*), v_(k*+1)] and τ' = √c.  When M̂2 ≤ τ, τ' = max_H |Δ| (0 when H is empty): the tightest bound that
    clips nothing, so the logged bound stays finite.  The official ``_solve_tau_from_sorted_delta2`` returns the
    breakpoint √v_(k*) instead of the exact root (a slightly tighter bound); we solve the equation exactly.  Only
    the values ≥ τ are sorted (:class:`SortedTrustRegion`).
    """
    region = SortedTrustRegion(delta_sq, trust_region, tau)
    if region.n == 0:
        return delta_sq.new_zeros(()), torch.zeros((), dtype=torch.bool, device=delta_sq.device)
    n = float(region.n)
    target = tau * n
    cut = ((region.prefix + (n - region.ranks) * region.tail) <= target).sum()
    below = torch.cat([region.small_sum.reshape(1), region.prefix])[cut]  # P_k*
    solved = (target - below) / (n - (region.n_small + cut).to(torch.float64)).clamp_min(1.0)
    total = region.prefix[-1] if region.tail.numel() else region.small_sum
    largest = region.tail[-1] if region.tail.numel() else region.small_max
    active = total > target
    cap = torch.where(active, solved, largest)
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
    rowwise = True  # the mask variant's cut and metrics per run (m2po_mask_runs); see joins_runs

    @property
    def joins_runs(self) -> bool:
        """The ``mask`` variant joins runs; ``cap`` solves one bound over the whole batch."""
        return self.variant == "mask" and super().joins_runs

    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        delta = batch.delta()
        trust_region = stats.trust_region_mask(delta, batch.advantages, batch.mask)
        delta_sq = delta**2
        in_region = batch.total(trust_region)
        metrics = {
            "m2_tr": batch.total(delta_sq * trust_region) / in_region.clamp_min(1.0),
            "tr_frac": in_region / batch.total(batch.mask).clamp_min(1.0),
        }
        if self.variant == "mask":
            return self._mask_loss(batch, delta_sq, trust_region, metrics)
        return self._cap_loss(batch, batch.log_ratio, delta_sq, trust_region, metrics)

    def _mask_loss(
        self, batch: TokenBatch, delta_sq: Tensor, trust_region: Tensor, metrics: dict[str, Tensor]
    ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        masked = m2po_mask(delta_sq, trust_region, self.tau, batch.runs)
        keep = 1.0 - masked
        ratio = ratio_or_one(batch.ratio(), masked, keep)  # masked tokens get e^0: no overflow can leak nan
        negative = -batch.advantages
        per_token = straight_through(keep * (negative * ratio), batch.logp, negative, keep * ratio)
        kept_region = trust_region * keep
        metrics["m2_tr_after"] = batch.total(delta_sq * kept_region) / batch.total(kept_region).clamp_min(1.0)
        return per_token, keep, metrics

    def _cap_loss(
        self, batch: TokenBatch, log_ratio: Tensor, delta_sq: Tensor, trust_region: Tensor, metrics: dict[str, Tensor]
    ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        bound, active = m2po_cap_bound(delta_sq, trust_region, self.tau)
        delta = log_ratio.detach()
        advantages = batch.advantages
        clipped = formulas.clipped(delta, advantages, -bound, bound) & (batch.mask > 0) & active
        ratio = torch.exp(torch.where(clipped, torch.zeros_like(log_ratio), log_ratio))
        clipped_ratio = torch.exp(delta.clamp(min=-bound, max=bound))
        per_token = torch.where(clipped, -advantages * clipped_ratio, -advantages * ratio)
        metrics["m2_tr_after"] = stats.masked_mean(torch.minimum(delta_sq, bound**2), trust_region)
        metrics["clip_frac"] = stats.fraction(clipped, batch.mask)
        metrics["m2po_bound"] = bound
        return per_token, (~clipped).to(batch.mask.dtype), metrics
