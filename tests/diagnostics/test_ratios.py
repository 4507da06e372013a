"""Ratio diagnostics against independent NumPy computations on the selected (mask = 1) tokens."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from offpolicylab.diagnostics import ratios


def _random_batch(seed: int, batch: int = 6, length: int = 9, scale: float = 0.7):
    gen = torch.Generator().manual_seed(seed)
    log_ratio = torch.randn(batch, length, generator=gen, dtype=torch.float64) * scale
    advantages = torch.randn(batch, 1, generator=gen, dtype=torch.float64).expand(batch, length).clone()
    advantages[0] = 0.0  # one zero-advantage sequence
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(torch.float64)
    mask[-1] = 0.0  # one empty sequence
    entropy = torch.rand(batch, length, generator=gen, dtype=torch.float64) * 3.0
    # Padding holds garbage: the diagnostics must ignore it.
    log_ratio = torch.where(mask > 0, log_ratio, torch.full_like(log_ratio, 1e6))
    entropy = torch.where(mask > 0, entropy, torch.full_like(entropy, float("nan")))
    return log_ratio, advantages, mask, entropy


@pytest.mark.parametrize("seed", [0, 1])
def test_entropy_by_ratio_deviation_equals_numpy_bin_means(seed: int) -> None:
    log_ratio, _, mask, entropy = _random_batch(seed, scale=1.5)
    edges = np.array([0.0, 0.05, 0.2, 0.5, 1.0, 2.0])
    result = ratios.entropy_by_ratio_deviation(log_ratio, entropy, mask, edges)

    m = mask.numpy() > 0
    dev = np.abs(np.exp(log_ratio.numpy()[m]) - 1.0)
    ent = entropy.numpy()[m]
    which = np.clip(np.digitize(dev, edges[1:-1], right=False), 0, len(edges) - 2)
    for k in range(len(edges) - 1):
        chosen = ent[which == k]
        assert result.counts[k].item() == chosen.size
        if chosen.size:
            assert result.mean_entropy[k].item() == pytest.approx(chosen.mean(), rel=1e-12)
        else:
            assert math.isnan(result.mean_entropy[k].item())
    assert result.counts.sum().item() == m.sum()


def test_clip_fraction() -> None:
    log_ratio = torch.log(torch.tensor([[1.5, 0.5, 1.1, 0.7], [1.3, 0.9, 2.0, 0.1]]))
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0], [1.0, -1.0, 0.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    # eps 0.2: clipped = (A>0, r>1.2): 1.5, 1.3;  (A<0, r<0.8): 0.7.  The 0.1 token is padding.
    frac = ratios.clip_fraction(log_ratio, advantages, mask, 0.2, 0.2)
    assert frac.item() == pytest.approx(3 / 7)
    assert ratios.clip_fraction(log_ratio, advantages, mask, math.inf, math.inf).item() == 0.0
    with pytest.raises(ValueError, match="eps_low"):
        ratios.clip_fraction(log_ratio, advantages, mask, -0.1, 0.2)
