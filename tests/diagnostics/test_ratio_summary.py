"""`stats.ratio_summary` (the fused pass objectives use) equals the separate statistics it replaces, bit for bit."""

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
