"""`stats.ratio_summary` (the fused pass objectives use) equals the separate statistics it replaces, bit for bit."""

import numpy as np
import pytest
import torch

from offpolicylab.diagnostics import stats


def _separate(log_ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    out = stats.ratio_stats(log_ratio, mask)
    out["m2"] = stats.second_moment(log_ratio, mask)
    out["ess"] = stats.effective_sample_size(log_ratio, mask)
    kl = stats.kl_estimators(log_ratio, mask)
    out["kl_k1"], out["kl_k3"] = kl["kl_k1"], kl["kl_k3"]
    return out


@pytest.mark.parametrize("seed", range(20))
def test_fused_summary_equals_separate_functions(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    shape = (int(torch.randint(1, 6, (1,), generator=gen)), int(torch.randint(1, 9, (1,), generator=gen)))
    log_ratio = torch.randn(shape, generator=gen) * (0.1 if seed % 2 else 20.0)
    mask = (torch.rand(shape, generator=gen) > 0.3).float()
    if seed % 5 == 0:
        mask.zero_()  # no valid token at all
    fused = stats.ratio_summary(log_ratio, mask)
    separate = _separate(log_ratio, mask)
    assert set(separate) <= set(fused)
    for key, value in separate.items():
        assert torch.equal(fused[key], value), key


def test_fused_summary_on_empty_batch() -> None:
    empty = torch.zeros(0, 4)
    fused = stats.ratio_summary(empty, empty)
    assert fused["ess"] == 1.0 and fused["m2"] == 0.0


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
