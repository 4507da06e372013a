"""Correlations between per-update (or per-token) diagnostics, with p-values, e.g. "does the clip fraction track
the entropy drop?" or "does trajectory acceptance fall as M2 rises?".

Thin, validated wrappers around :func:`scipy.stats.pearsonr` and :func:`scipy.stats.spearmanr`; this runs on the
host (numpy), for analysis and plots, never inside a loss.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats as sps
from torch import Tensor

Method = Literal["pearson", "spearman"]
ArrayLike = Tensor | np.ndarray | list[float]
METHODS: tuple[str, ...] = ("pearson", "spearman")


@dataclass(frozen=True)
class Correlation:
    """A correlation coefficient (``statistic`` ∈ [−1, 1], NaN for a constant input), its two-sided ``pvalue`` for the
    null hypothesis of no correlation, the number ``n`` of pairs used and the ``method``."""

    statistic: float
    pvalue: float
    n: int
    method: str


def _as_array(values: ArrayLike) -> np.ndarray:
    if isinstance(values, Tensor):
        values = values.detach().cpu().double().numpy()
    array = np.asarray(values, dtype=np.float64)
    return array.reshape(-1)


def _paired(
    x: ArrayLike,
    y: ArrayLike,
    mask: ArrayLike | None,
) -> tuple[np.ndarray, np.ndarray]:
    x_arr, y_arr = _as_array(x), _as_array(y)
    if x_arr.shape != y_arr.shape:
        raise ValueError(f"x and y must hold the same number of values, got {x_arr.size} and {y_arr.size}")
    keep = np.ones(x_arr.shape, dtype=bool)
    if mask is not None:
        mask_arr = _as_array(mask)
        if mask_arr.shape != x_arr.shape:
            raise ValueError(f"mask must match x in size, got {mask_arr.size} and {x_arr.size}")
        keep = mask_arr > 0
    x_sel, y_sel = x_arr[keep], y_arr[keep]
    if not (np.isfinite(x_sel).all() and np.isfinite(y_sel).all()):
        raise ValueError("x and y must be finite where mask is 1 (drop NaN / inf rows first)")
    if x_sel.size < 3:
        raise ValueError(f"a correlation with a p-value needs at least 3 pairs, got {x_sel.size}")
    return x_sel, y_sel


def correlation(
    x: ArrayLike,
    y: ArrayLike,
    method: Method = "pearson",
    mask: ArrayLike | None = None,
) -> Correlation:
    """Pearson r = cov(x, y) / (σ_x σ_y) with p-value from t = r·√((n−2)/(1−r²)) ~ t_{n−2}, or Spearman ρ = Pearson r
    of the ranks (average ranks for ties), over the pairs where ``mask`` > 0 (all pairs when ``mask`` is None).
    Inputs are flattened; a constant input gives NaN statistic and p-value (scipy's ConstantInputWarning silenced).
    """
    if method not in METHODS:
        raise ValueError(f"unknown correlation method {method!r}; valid: {', '.join(METHODS)}")
    x_sel, y_sel = _paired(x, y, mask)
    if np.ptp(x_sel) == 0 or np.ptp(y_sel) == 0:
        return Correlation(statistic=float("nan"), pvalue=float("nan"), n=int(x_sel.size), method=method)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sps.ConstantInputWarning)
        result = sps.pearsonr(x_sel, y_sel) if method == "pearson" else sps.spearmanr(x_sel, y_sel)
    return Correlation(
        statistic=float(result.statistic), pvalue=float(result.pvalue), n=int(x_sel.size), method=method
    )


def pearson(x: ArrayLike, y: ArrayLike, mask: ArrayLike | None = None) -> Correlation:
    """Pearson correlation with p-value; see :func:`correlation`."""
    return correlation(x, y, "pearson", mask)


def spearman(x: ArrayLike, y: ArrayLike, mask: ArrayLike | None = None) -> Correlation:
    """Spearman rank correlation with p-value; see :func:`correlation`."""
    return correlation(x, y, "spearman", mask)
