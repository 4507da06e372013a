"""Pearson / Spearman with p-values against textbook formulas computed with NumPy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import betainc

from offpolicylab.diagnostics.correlation import Correlation, correlation, pearson, spearman


def _two_sided_t_pvalue(r: float, n: int) -> float:
    """p = P(|T| ≥ |t|), t = r√((n−2)/(1−r²)), T ~ t_{n−2}, via the regularized incomplete beta I_x(ν/2, 1/2)."""
    dof = n - 2
    t = r * math.sqrt(dof / (1.0 - r * r))
    return float(betainc(dof / 2.0, 0.5, dof / (dof + t * t)))


def _ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values)
    ranks = np.empty(values.size)
    ranks[order] = np.arange(1, values.size + 1)
    return ranks


def _data(seed: int, n: int = 30):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    y = 0.6 * x + rng.normal(size=n)
    return x, y


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pearson_equals_covariance_formula_and_t_pvalue(seed: int) -> None:
    x, y = _data(seed)
    xc, yc = x - x.mean(), y - y.mean()
    r = float(np.sum(xc * yc) / math.sqrt(np.sum(xc**2) * np.sum(yc**2)))
    got = pearson(torch.tensor(x), torch.tensor(y))
    assert isinstance(got, Correlation) and got.method == "pearson" and got.n == x.size
    assert got.statistic == pytest.approx(r, rel=1e-10)
    assert got.pvalue == pytest.approx(_two_sided_t_pvalue(r, x.size), rel=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_spearman_is_pearson_of_ranks(seed: int) -> None:
    x, y = _data(seed, n=25)
    y = np.exp(y)  # monotone transform: Spearman unchanged, Pearson changes
    rx, ry = _ranks(x), _ranks(y)
    d = rx - ry
    n = x.size
    rho = 1.0 - 6.0 * np.sum(d**2) / (n * (n * n - 1))  # no ties
    got = spearman(x, y)
    assert got.statistic == pytest.approx(rho, rel=1e-10)
    assert got.pvalue == pytest.approx(_two_sided_t_pvalue(rho, n), rel=1e-6)
    assert spearman(x, np.log(y)).statistic == pytest.approx(rho, rel=1e-10)


def test_mask_selects_pairs_and_bad_input_raises() -> None:
    x, y = _data(3, n=12)
    mask = np.ones(12)
    mask[:4] = 0
    x_bad = x.copy()
    x_bad[:4] = np.nan  # masked pairs may hold anything
    assert pearson(x_bad, y, mask=mask).statistic == pytest.approx(pearson(x[4:], y[4:]).statistic)
    assert pearson(x_bad, y, mask=mask).n == 8
    with pytest.raises(ValueError, match="same number"):
        pearson(x, y[:5])
    with pytest.raises(ValueError, match="finite"):
        pearson(x_bad, y)
    with pytest.raises(ValueError, match="at least 3"):
        pearson([1.0, 2.0], [3.0, 1.0])
    with pytest.raises(ValueError, match="pearson, spearman"):
        correlation(x, y, method="kendall")  # type: ignore[arg-type]


def test_constant_input_gives_nan_not_a_warning() -> None:
    got = spearman(np.ones(5), np.arange(5.0))
    assert math.isnan(got.statistic) and math.isnan(got.pvalue) and got.n == 5
