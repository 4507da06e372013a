"""The shared formulas of ``offpolicylab.formulas``, each against values worked by hand from its paper's equation."""

from __future__ import annotations

import math

import pytest
import torch

from offpolicylab.formulas import (
    EXP_CLAMP,
    capped_expm1,
    clip_bounds,
    clip_ratio,
    clipped,
    k3,
    kish_ess,
    kish_ess_of_sums,
)


def test_k3_is_schulmans_r_minus_1_minus_log_r() -> None:
    """k3 = (r − 1) − log r (Schulman 2020): r = 2 → 1 − ln 2, r = ½ → ln 2 − ½, r = 1 → 0; near r = 1 it is
    δ²/2 + δ³/6 (Taylor), kept in float32; the exponent is capped at 80 only; no cap lets +inf through as nan."""
    ratios = torch.tensor([2.0, 0.5, 1.0], dtype=torch.float64)
    expected = [1.0 - math.log(2.0), math.log(2.0) - 0.5, 0.0]
    assert k3(ratios.log()).tolist() == pytest.approx(expected, rel=1e-15, abs=0.0)
    small = torch.tensor([1e-4])  # float32; e^δ − 1 − δ there would be all rounding error (ulp of e^δ: 1.2e-7)
    delta = float(small)
    assert float(k3(small)) == pytest.approx(delta**2 / 2 + delta**3 / 6, rel=1e-3)
    beyond = torch.tensor([100.0], dtype=torch.float64)
    assert float(k3(beyond)) == math.exp(EXP_CLAMP) - 1.0 - 100.0
    assert math.isnan(float(k3(torch.tensor([math.inf]), cap=None)))
    buffer = torch.empty(3, dtype=torch.float64)
    assert k3(ratios.log(), out=buffer) is buffer and buffer.tolist() == k3(ratios.log()).tolist()


def test_kish_ess_is_sum_squared_over_n_sum_of_squares() -> None:
    """(Σw)² / (n·Σw²) (Kish 1965): w = 1, 2, 3 and a padded 0 over n = 3 → 36 / (3·14) = 6/7; equal weights → 1;
    one weight of four → 1/4; all weights 0 → 0; per row of a [rows, N] tensor."""
    weights = torch.tensor([[1.0, 2.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0], [0.0, 7.0, 0.0, 0.0], [0.0] * 4],
                           dtype=torch.float64)
    counts = torch.tensor([3.0, 4.0, 4.0, 4.0], dtype=torch.float64)
    assert kish_ess(weights, counts).tolist() == pytest.approx([6 / 7, 1.0, 0.25, 0.0], rel=1e-15)


def test_k3_from_a_given_expm1_and_the_ratio_from_it() -> None:
    """capped_expm1 = e^min(δ, 80) − 1 by hand (δ = ln 2 → 1, δ = 0 → 0, δ = 100 → e^80 − 1); k3 from it given (in
    the same buffer, as the ratio summary does) equals k3 computed alone, bit for bit; 1 + it is the capped ratio."""
    delta = torch.tensor([math.log(2.0), 0.0, -1.0, 100.0], dtype=torch.float64)
    term = capped_expm1(delta)
    assert term.tolist() == pytest.approx([1.0, 0.0, math.exp(-1.0) - 1.0, math.exp(EXP_CLAMP) - 1.0], rel=1e-15)
    buffer = capped_expm1(delta, out=torch.empty_like(delta))
    assert torch.equal(k3(delta, out=buffer, expm1=buffer), k3(delta))
    assert (1.0 + term).tolist() == pytest.approx([2.0, 1.0, math.exp(-1.0), math.exp(EXP_CLAMP)], rel=1e-15)


def test_kish_ess_of_sums_is_kish_ess_and_scale_free() -> None:
    """(Σw)² / (n·Σw²) from the sums: w = 1, 2, 3 over n = 3 → 36 / (3·14) = 6/7, the same from the means (n = 1) and
    from 1000·w; 0 when Σw² = 0."""
    sums = torch.tensor([6.0, 0.0], dtype=torch.float64)
    squares = torch.tensor([14.0, 0.0], dtype=torch.float64)
    assert kish_ess_of_sums(sums, squares, 3.0).tolist() == pytest.approx([6 / 7, 0.0], rel=1e-15)
    assert float(kish_ess_of_sums(sums[0] / 3, squares[0] / 3, 1.0)) == pytest.approx(6 / 7, rel=1e-15)
    assert float(kish_ess_of_sums(1e3 * sums[0], 1e6 * squares[0], 3.0)) == pytest.approx(6 / 7, rel=1e-15)


def test_ppo_clip_bounds_clip_and_clipped_tokens() -> None:
    """Bounds 1 − ε_low, 1 + ε_high (PPO, Schulman et al. 2017): ε = (0.2, 0.28) → (0.8, 1.28); clip(0.5, 1, 1.5) →
    (0.8, 1, 1.28); ε = inf is no bound; the clip removes the gradient of (A > 0, r > 1.28) and (A < 0, r < 0.8)
    only."""
    assert clip_bounds(0.2, 0.28) == pytest.approx((0.8, 1.28))
    assert clip_bounds(math.inf, 0.28)[0] == -math.inf
    ratio = torch.tensor([0.5, 1.0, 1.5], dtype=torch.float64)
    assert clip_ratio(ratio, 0.2, 0.28).tolist() == pytest.approx([0.8, 1.0, 1.28])
    assert clip_ratio(ratio, math.inf, 0.28).tolist() == pytest.approx([0.5, 1.0, 1.28])
    assert clip_ratio(ratio, math.inf, math.inf) is ratio
    r = torch.tensor([1.5, 0.5, 0.5, 1.5, 1.1, 0.9])
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0, 1.0, -1.0])
    assert clipped(r, advantages, 0.8, 1.28).tolist() == [True, False, True, False, False, False]
