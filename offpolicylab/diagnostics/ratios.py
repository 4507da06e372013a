"""Ratio diagnostics on masked ``[B, T]`` tensors: histograms split by advantage sign, entropy binned by |r − 1|,
sequence geometric-mean ratios, clip / mask fractions and trust-region M2.

Every function is pure, detaches its inputs and returns tensors (no ``.item()``, no host sync): they can run every
update.  Notation: Δ = log r = logp − behavior_logp, r = e^Δ, ``mask`` = 1 for tokens that count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from offpolicylab.diagnostics import stats

_EXP_CLAMP = 80.0  # e^80 ≈ 5.5e34 < float32 max: exp of a clamped log-ratio never overflows


def symmetric_log_edges(smallest: float = 1e-3, largest: float = 10.0, per_decade: int = 1) -> Tensor:
    """Bin edges over Δ = log r that are log-spaced in |Δ| and symmetric around r = 1:
    ``[−largest, …, −smallest, 0, smallest, …, largest]`` with ``per_decade`` edges per factor of 10 in |Δ|.

    This is the binning of the M2PO ratio plots (Prosperity before Collapse, 2025): fine bins near r = 1 where most
    tokens sit, coarse bins in the tails; 0 is an edge so that r < 1 and r > 1 never share a bin.
    """
    if not (0.0 < smallest < largest) or not math.isfinite(largest):
        raise ValueError(f"need 0 < smallest < largest < inf, got smallest={smallest}, largest={largest}")
    if per_decade < 1:
        raise ValueError(f"per_decade must be an int ≥ 1, got {per_decade}")
    decades = math.log10(largest / smallest)
    count = max(1, math.ceil(decades * per_decade - 1e-9))
    positive = torch.logspace(math.log10(smallest), math.log10(largest), count + 1, dtype=torch.float64)
    return torch.cat([-positive.flip(0), torch.zeros(1, dtype=torch.float64), positive])


DEFAULT_LOG_EDGES = symmetric_log_edges(1e-3, 10.0, per_decade=2)
"""Default Δ edges: ±{1e-3, 3.2e-3, 1e-2, …, 3.2, 10} and 0 (19 edges, 18 bins); |Δ| > 10 lands in the outermost bins."""

DEFAULT_ABS_DEVIATION_EDGES = torch.tensor(
    [0.0, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0], dtype=torch.float64
)
"""Default |r − 1| edges for :func:`entropy_by_ratio_deviation`; deviations above 10 land in the last bin."""


@dataclass(frozen=True)
class SignedRatioHistogram:
    """Token counts of Δ = log r per bin, split by advantage sign.

    ``log_edges`` [K + 1] are edges over Δ (``ratio_edges`` = e^edges); ``positive`` / ``negative`` / ``zero`` [K]
    count the valid tokens with A > 0 / A < 0 / A = 0.  Bins are [e_k, e_{k+1}) except the last, which is closed
    (as ``numpy.histogram``); values outside [e_0, e_K] are counted in the outermost bins.
    """

    log_edges: Tensor
    positive: Tensor
    negative: Tensor
    zero: Tensor

    @property
    def ratio_edges(self) -> Tensor:
        return torch.exp(self.log_edges)

    @property
    def total(self) -> Tensor:
        return self.positive + self.negative + self.zero


@dataclass(frozen=True)
class EntropyByDeviation:
    """Mean token entropy per |r − 1| bin: ``edges`` [K + 1] over |r − 1|, ``counts`` [K] valid tokens per bin,
    ``mean_entropy`` [K] (NaN for an empty bin).  Bins as in :class:`SignedRatioHistogram`."""

    edges: Tensor
    counts: Tensor
    mean_entropy: Tensor


def _as_edges(edges: Tensor | Sequence[float], dtype: torch.dtype, device: torch.device) -> Tensor:
    edges = torch.as_tensor(edges, dtype=torch.float64).to(device=device, dtype=dtype)
    if edges.dim() != 1 or edges.numel() < 2:
        raise ValueError(
            f"bin edges must be a 1-D sequence of at least 2 values, got shape {tuple(edges.shape)}"
        )
    if not torch.isfinite(edges).all() or not (edges[1:] > edges[:-1]).all():
        raise ValueError("bin edges must be finite and strictly increasing")
    return edges


def bin_index(values: Tensor, edges: Tensor) -> Tensor:
    """Index k of the bin [e_k, e_{k+1}) holding each value, the last bin closed, values outside the edges clamped
    into the outermost bins (int64, same shape as ``values``)."""
    inner = edges[1:-1].contiguous()
    return torch.bucketize(values.contiguous(), inner, right=True)


def _weighted_counts(index: Tensor, weights: Tensor, bins: int) -> Tensor:
    counts = torch.zeros(bins, dtype=weights.dtype, device=weights.device)
    return counts.scatter_add_(0, index.reshape(-1), weights.reshape(-1))


def _check_same_shape(**tensors: Tensor) -> None:
    shapes = {name: tuple(value.shape) for name, value in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"tensors must share one [B, T] shape, got {shapes}")


def signed_ratio_histogram(
    log_ratio: Tensor, advantages: Tensor, mask: Tensor, log_edges: Tensor | Sequence[float] | None = None
) -> SignedRatioHistogram:
    """counts_k^± = Σ_t m_t · 1(A_t ≷ 0) · 1(Δ_t ∈ bin k), Δ = log r, over the edges ``log_edges`` on Δ
    (default :data:`DEFAULT_LOG_EDGES`, M2PO-style log-spaced bins around r = 1; Prosperity before Collapse, 2025).

    Tokens whose advantage is positive are the ones PPO clips at r > 1 + ε_high and negatives at r < 1 − ε_low, so the
    split shows which side of the trust region a stale batch pushes against.
    """
    _check_same_shape(log_ratio=log_ratio, advantages=advantages, mask=mask)
    log_ratio = log_ratio.detach()
    dtype = log_ratio.dtype if torch.is_floating_point(log_ratio) else torch.float32
    edges = _as_edges(DEFAULT_LOG_EDGES if log_edges is None else log_edges, dtype, log_ratio.device)
    valid = (mask > 0) & ~torch.isnan(log_ratio)
    index = bin_index(torch.nan_to_num(log_ratio.to(dtype), nan=0.0), edges)
    bins = edges.numel() - 1
    advantages = advantages.detach()

    def count(selected: Tensor) -> Tensor:
        return _weighted_counts(index, (valid & selected).to(dtype), bins)

    return SignedRatioHistogram(
        log_edges=edges,
        positive=count(advantages > 0),
        negative=count(advantages < 0),
        zero=count(advantages == 0),
    )


def entropy_by_ratio_deviation(
    log_ratio: Tensor, entropy: Tensor, mask: Tensor, edges: Tensor | Sequence[float] | None = None
) -> EntropyByDeviation:
    """H̄_k = Σ_t m_t·H_t·1(|r_t − 1| ∈ bin k) / Σ_t m_t·1(|r_t − 1| ∈ bin k): mean token entropy per |r − 1| bin
    (default :data:`DEFAULT_ABS_DEVIATION_EDGES`).  Shows whether the tokens an objective clips or masks (large
    |r − 1|) are the high-entropy "forking" tokens (M2PO, Prosperity before Collapse; Wang et al. 2025,
    "Beyond the 80/20 rule")."""
    _check_same_shape(log_ratio=log_ratio, entropy=entropy, mask=mask)
    log_ratio = log_ratio.detach()
    entropy = entropy.detach()
    dtype = entropy.dtype if torch.is_floating_point(entropy) else torch.float32
    edges = _as_edges(DEFAULT_ABS_DEVIATION_EDGES if edges is None else edges, dtype, log_ratio.device)
    deviation = torch.expm1(log_ratio.to(dtype).clamp(max=_EXP_CLAMP)).abs()
    valid = (mask > 0) & torch.isfinite(deviation) & torch.isfinite(entropy)
    index = bin_index(torch.where(valid, deviation, torch.zeros((), dtype=dtype)), edges)
    bins = edges.numel() - 1
    weights = valid.to(dtype)
    counts = _weighted_counts(index, weights, bins)
    sums = _weighted_counts(index, torch.where(valid, entropy.to(dtype), torch.zeros((), dtype=dtype)), bins)
    mean = torch.where(counts > 0, sums / counts.clamp_min(1.0), torch.full((), float("nan"), dtype=dtype))
    return EntropyByDeviation(edges=edges, counts=counts, mean_entropy=mean)


def sequence_geometric_mean_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """[B] ρ(τ) = exp((1/|τ|) Σ_t m_t Δ_t), the geometric-mean ratio of each sequence (GSPO, Zheng et al. 2025;
    MIS-PO trajectory acceptance); 1 for a sequence with no valid token.  Δ is clamped at ±80 before exp."""
    mean_log = stats.sequence_log_ratio(log_ratio.detach(), mask)
    return torch.exp(mean_log.clamp(-_EXP_CLAMP, _EXP_CLAMP))


def clip_fraction(
    log_ratio: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float
) -> Tensor:
    """Σ m·[(A > 0 ∧ r > 1 + ε_high) ∨ (A < 0 ∧ r < 1 − ε_low)] / Σ m: the share of valid tokens whose gradient the
    PPO clip removes (Schulman et al. 2017).  ε = inf never clips."""
    if not (eps_low >= 0 and eps_high >= 0):
        raise ValueError(f"eps_low and eps_high must be ≥ 0 (inf = no clip), got {eps_low}, {eps_high}")
    _check_same_shape(log_ratio=log_ratio, advantages=advantages, mask=mask)
    ratio = torch.exp(log_ratio.detach().clamp(max=_EXP_CLAMP))
    above = (advantages > 0) & (ratio > 1.0 + eps_high)
    below = (advantages < 0) & (ratio < 1.0 - eps_low)
    return stats.fraction(above | below, mask)


def mask_fraction(token_mask: Tensor, mask: Tensor) -> Tensor:
    """1 − Σ m·k / Σ m: the share of valid tokens (``mask``) that an objective's ``token_mask`` k removed from the
    gradient (0 when there is no valid token)."""
    _check_same_shape(token_mask=token_mask, mask=mask)
    kept = torch.where(mask > 0, token_mask.detach().to(mask.dtype), torch.zeros((), dtype=mask.dtype))
    total = mask.sum()
    return torch.where(total > 0, 1.0 - kept.sum() / total.clamp_min(1.0), torch.zeros((), dtype=mask.dtype))


def trust_region_second_moment(log_ratio: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """M̂2_H = mean over H of Δ², H = {(A > 0, r > 1) or (A < 0, r < 1)} (M2PO, Prosperity before Collapse, 2025);
    0 when H is empty."""
    _check_same_shape(log_ratio=log_ratio, advantages=advantages, mask=mask)
    region = stats.trust_region_mask(log_ratio.detach(), advantages.detach(), mask)
    return stats.second_moment(log_ratio, region)
