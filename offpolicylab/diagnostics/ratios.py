"""Ratio diagnostics on masked ``[B, T]`` tensors: entropy binned by |r − 1| and the PPO clip fraction.

Every function is pure, detaches its inputs and returns tensors (no ``.item()``, no host sync): they can run every
update.  Notation: Δ = log r = logp − behavior_logp, r = e^Δ, ``mask`` = 1 for tokens that count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from offpolicylab.diagnostics import stats
from offpolicylab.diagnostics.stats import EXP_CLAMP
from offpolicylab.formulas import clip_bounds, clipped

DEFAULT_ABS_DEVIATION_EDGES = torch.tensor(
    [0.0, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0], dtype=torch.float64
)
"""Default |r − 1| edges for :func:`entropy_by_ratio_deviation`; deviations above 10 land in the last bin."""


@dataclass(frozen=True)
class EntropyByDeviation:
    """Mean token entropy per |r − 1| bin: ``edges`` [K + 1] over |r − 1|, ``counts`` [K] valid tokens per bin,
    ``mean_entropy`` [K] (NaN for an empty bin).  Bins are [e_k, e_{k+1}) except the last, which is closed; values
    outside [e_0, e_K] are counted in the outermost bins."""

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
    deviation = torch.expm1(log_ratio.to(dtype).clamp(max=EXP_CLAMP)).abs()
    valid = (mask > 0) & torch.isfinite(deviation) & torch.isfinite(entropy)
    index = bin_index(torch.where(valid, deviation, torch.zeros((), dtype=dtype)), edges)
    bins = edges.numel() - 1
    weights = valid.to(dtype)
    counts = _weighted_counts(index, weights, bins)
    sums = _weighted_counts(index, torch.where(valid, entropy.to(dtype), torch.zeros((), dtype=dtype)), bins)
    mean = torch.where(counts > 0, sums / counts.clamp_min(1.0), torch.full((), float("nan"), dtype=dtype))
    return EntropyByDeviation(edges=edges, counts=counts, mean_entropy=mean)


def clip_fraction(
    log_ratio: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float
) -> Tensor:
    """Σ m·[(A > 0 ∧ r > 1 + ε_high) ∨ (A < 0 ∧ r < 1 − ε_low)] / Σ m: the share of valid tokens whose gradient the
    PPO clip removes (Schulman et al. 2017).  ε = inf never clips."""
    if not (eps_low >= 0 and eps_high >= 0):
        raise ValueError(f"eps_low and eps_high must be ≥ 0 (inf = no clip), got {eps_low}, {eps_high}")
    _check_same_shape(log_ratio=log_ratio, advantages=advantages, mask=mask)
    ratio = torch.exp(log_ratio.detach().clamp(max=EXP_CLAMP))
    return stats.fraction(clipped(ratio, advantages, *clip_bounds(eps_low, eps_high)), mask)
