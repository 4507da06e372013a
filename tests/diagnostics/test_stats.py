"""ESS, M2, KL estimators and ratio statistics against NumPy formulas and exact enumeration."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from offpolicylab.diagnostics import stats


def _batch(seed: int, scale: float = 0.5):
    gen = torch.Generator().manual_seed(seed)
    log_ratio = torch.randn(5, 7, generator=gen, dtype=torch.float64) * scale
    mask = (torch.rand(5, 7, generator=gen, dtype=torch.float64) < 0.7).to(torch.float64)
    mask[0, 0] = 1.0
    log_ratio = torch.where(mask > 0, log_ratio, torch.full_like(log_ratio, 1e6))  # garbage padding
    return log_ratio, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ratio_stats_m2_ess_kl_equal_numpy_formulas(seed: int) -> None:
    log_ratio, mask = _batch(seed)
    delta = log_ratio.numpy()[mask.numpy() > 0]
    w = np.exp(delta)
    n = delta.size
    got = stats.ratio_summary(log_ratio, mask)
    assert got["ratio_mean"].item() == pytest.approx(w.mean(), rel=1e-12)
    assert got["ratio_max"].item() == pytest.approx(w.max(), rel=1e-12)
    assert got["log_ratio_abs_mean"].item() == pytest.approx(np.abs(delta).mean(), rel=1e-12)
    assert got["m2"].item() == pytest.approx(np.mean(delta**2), rel=1e-12)
    assert got["ess"].item() == pytest.approx(w.sum() ** 2 / (n * np.sum(w**2)), rel=1e-12)
    # the summary's ESS (from its r = 1 + expm1 Δ) and the max-rescaled one: float64 rounding apart
    assert stats.effective_sample_size(log_ratio, mask).item() == pytest.approx(got["ess"].item(), rel=1e-14)
    assert got["kl_k1"].item() == pytest.approx(np.mean(-delta), rel=1e-12)
    assert got["kl_k3"].item() == pytest.approx(np.mean(np.exp(delta) - 1.0 - delta), rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kl_estimates_alone_equal_numpy_and_the_summary_bit_for_bit(seed: int, dtype: torch.dtype) -> None:
    log_ratio, mask = _batch(seed, scale=2.0)
    log_ratio, mask = log_ratio.to(dtype), mask.to(dtype)
    delta = log_ratio.double().numpy()[mask.numpy() > 0]
    k1, k3 = stats.kl_estimates(log_ratio, mask)
    assert k1.item() == pytest.approx(np.mean(-delta), rel=1e-5 if dtype == torch.float32 else 1e-12)
    assert k3.item() == pytest.approx(np.mean(np.exp(delta) - 1.0 - delta), rel=1e-5 if dtype == torch.float32 else 1e-12)
    summary = stats.ratio_summary(log_ratio, mask)
    assert torch.equal(k1, summary["kl_k1"]) and torch.equal(k3, summary["kl_k3"])
    assert stats.kl_estimates(torch.zeros(0, 3, dtype=dtype), torch.zeros(0, 3, dtype=dtype)) == (0.0, 0.0)


def test_summary_of_an_empty_batch() -> None:
    empty = torch.zeros(0, 4)
    summary = stats.ratio_summary(empty, empty)
    assert summary["ess"] == 1.0 and summary["m2"] == 0.0


def test_ess_limits_and_extreme_log_ratios() -> None:
    mask = torch.ones(1, 8)
    assert stats.effective_sample_size(torch.full((1, 8), 0.3), mask).item() == pytest.approx(1.0)
    dominated = torch.zeros(1, 8)
    dominated[0, 3] = 50.0  # one ratio e^50 ≫ the others
    assert stats.effective_sample_size(dominated, mask).item() == pytest.approx(1 / 8, rel=1e-6)
    extreme = torch.tensor([[50.0, -50.0, 0.0, 10.0]])
    ess = stats.effective_sample_size(extreme, torch.ones(1, 4))
    assert torch.isfinite(ess) and 0.0 < ess.item() <= 1.0
    assert stats.effective_sample_size(torch.zeros(1, 3), torch.zeros(1, 3)).item() == 1.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-60.0, 60.0, allow_nan=False), min_size=1, max_size=20))
def test_kl_k3_is_non_negative_per_token_and_in_mean(values: list[float]) -> None:
    delta = torch.tensor([values], dtype=torch.float64)
    mask = torch.ones_like(delta)
    assert stats.ratio_summary(delta, mask)["kl_k3"].item() >= 0.0
    for v in values:  # each token's k3 = e^Δ − 1 − Δ ≥ 0
        single = torch.tensor([[v]], dtype=torch.float64)
        assert stats.ratio_summary(single, torch.ones_like(single))["kl_k3"].item() >= 0.0


def _exact_sample(pi_b_counts: list[int]) -> np.ndarray:
    """Actions repeated in proportion to π_b: the token mean over them IS the exact expectation under π_b."""
    return np.repeat(np.arange(len(pi_b_counts)), pi_b_counts)


@pytest.mark.parametrize("theta_seed", [0, 1, 2])
def test_kl_k1_k3_expectations_equal_exact_kl_on_a_categorical(theta_seed: int) -> None:
    counts = [2, 4, 1, 1]  # π_b = [0.25, 0.5, 0.125, 0.125], exactly representable
    pi_b = np.array(counts, dtype=np.float64) / sum(counts)
    rng = np.random.default_rng(theta_seed)
    logits = np.log(pi_b) + rng.normal(scale=0.8, size=pi_b.size)
    pi_theta = np.exp(logits - logits.max())
    pi_theta /= pi_theta.sum()
    exact_kl = float(np.sum(pi_b * np.log(pi_b / pi_theta)))  # KL(π_b ‖ π_θ)

    actions = _exact_sample(counts)
    delta = torch.tensor(np.log(pi_theta[actions]) - np.log(pi_b[actions]))[None, :]
    kl = stats.ratio_summary(delta, torch.ones_like(delta))
    assert kl["kl_k1"].item() == pytest.approx(exact_kl, rel=1e-12)
    assert kl["kl_k3"].item() == pytest.approx(exact_kl, rel=1e-12)


def test_sequence_log_ratio_and_fraction_equal_numpy() -> None:
    log_ratio, mask = _batch(5)
    lr, m = log_ratio.numpy(), mask.numpy() > 0
    got = stats.sequence_log_ratio(log_ratio, mask).numpy()
    for i in range(lr.shape[0]):
        assert got[i] == pytest.approx(lr[i][m[i]].mean() if m[i].any() else 0.0, rel=1e-12)
    selected = log_ratio > 0
    assert stats.fraction(selected, mask).item() == pytest.approx(np.mean(lr[m] > 0), rel=1e-12)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("q", [0.0, 0.5, 0.9, 0.999, 1.0])
def test_masked_quantile_matches_numpy(seed: int, q: float) -> None:
    """numpy.quantile (linear interpolation) of the valid tokens only, worked out in float64."""
    rng = np.random.default_rng(seed)
    shape = (int(rng.integers(1, 40)), int(rng.integers(1, 50)))
    values = rng.lognormal(0.0, 3.0, size=shape)
    mask = (rng.random(shape) > 0.4).astype(np.float64)
    if seed == 0:
        mask[:] = 0.0
        mask[0, 0] = 1.0  # a single valid token
    got = stats.masked_quantile(torch.from_numpy(values), torch.from_numpy(mask), q)
    expected = np.quantile(values[mask > 0], q) if mask.any() else 0.0
    assert float(got) == pytest.approx(float(expected), rel=1e-12, abs=1e-300)


def test_masked_quantile_without_valid_tokens_is_zero() -> None:
    values = torch.tensor([[3.0, 1.0]])
    assert float(stats.masked_quantile(values, torch.zeros(1, 2), 0.999)) == 0.0
    assert float(stats.masked_quantile(torch.zeros(0, 3), torch.zeros(0, 3), 0.5)) == 0.0
    with pytest.raises(ValueError, match="valid: a number in"):
        stats.masked_quantile(values, torch.ones(1, 2), 1.5)


def test_ratio_p999_is_the_tail_of_the_token_ratios() -> None:
    """ratio_p999 = numpy's 99.9th percentile of r = exp(Δ) over valid tokens (not of Δ, not of padding)."""
    rng = np.random.default_rng(7)
    delta = rng.standard_t(2, size=(64, 48)) * 0.5
    mask = (rng.random((64, 48)) > 0.1).astype(np.float32)
    summary = stats.ratio_summary(torch.from_numpy(delta).float(), torch.from_numpy(mask))
    expected = np.percentile(np.exp(delta.astype(np.float32))[mask > 0].astype(np.float64), 99.9)
    assert float(summary["ratio_p999"]) == pytest.approx(expected, rel=1e-5)
    assert float(summary["ratio_p999"]) <= float(summary["ratio_max"])
