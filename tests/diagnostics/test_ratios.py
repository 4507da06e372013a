"""Ratio diagnostics against independent NumPy computations on the selected (mask = 1) tokens."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from offpolicylab.diagnostics import ratios, stats


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


def test_symmetric_log_edges_are_sorted_symmetric_and_log_spaced() -> None:
    edges = ratios.symmetric_log_edges(1e-3, 10.0, per_decade=1).numpy()
    expected_positive = np.array([1e-3, 1e-2, 1e-1, 1.0, 10.0])
    np.testing.assert_allclose(edges, np.concatenate([-expected_positive[::-1], [0.0], expected_positive]))
    with pytest.raises(ValueError, match="smallest"):
        ratios.symmetric_log_edges(1.0, 0.5)
    with pytest.raises(ValueError, match="per_decade"):
        ratios.symmetric_log_edges(1e-3, 1.0, per_decade=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_signed_histogram_equals_numpy_histogram_per_sign(seed: int) -> None:
    log_ratio, advantages, mask, _ = _random_batch(seed)
    log_ratio[1, 0] = 40.0  # beyond the last edge: counted in the outermost bin
    mask[1, 0] = 1.0
    edges = ratios.symmetric_log_edges(1e-2, 3.0, per_decade=2)
    hist = ratios.signed_ratio_histogram(log_ratio, advantages, mask, edges)

    lr, adv, m, e = log_ratio.numpy(), advantages.numpy(), mask.numpy() > 0, edges.numpy()
    clipped = np.clip(lr, e[0], e[-1])
    for counts, sign in ((hist.positive, adv > 0), (hist.negative, adv < 0), (hist.zero, adv == 0)):
        expected, _ = np.histogram(clipped[m & sign], bins=e)
        np.testing.assert_array_equal(counts.numpy(), expected)
    assert hist.total.sum().item() == m.sum()
    np.testing.assert_allclose(hist.ratio_edges.numpy(), np.exp(e))


def test_signed_histogram_bin_boundaries_follow_numpy() -> None:
    edges = torch.tensor([-1.0, 0.0, 1.0, 2.0], dtype=torch.float64)
    values = torch.tensor([[-1.0, 0.0, 1.0, 2.0, -5.0, 0.5]], dtype=torch.float64)
    hist = ratios.signed_ratio_histogram(values, torch.ones_like(values), torch.ones_like(values), edges)
    # [-1,0) gets -1 and the clamped -5; [0,1) gets 0 and 0.5; [1,2] (closed) gets 1 and 2.
    np.testing.assert_array_equal(hist.positive.numpy(), [2, 2, 2])
    np.testing.assert_array_equal(hist.negative.numpy(), [0, 0, 0])


def test_signed_histogram_default_edges_and_detached() -> None:
    log_ratio = torch.zeros(2, 3, requires_grad=True)
    hist = ratios.signed_ratio_histogram(log_ratio * 1.0, torch.ones(2, 3), torch.ones(2, 3))
    assert not hist.positive.requires_grad
    middle = (hist.log_edges.numel() - 1) // 2  # the bin [0, smallest)
    assert hist.positive[middle].item() == 6 and hist.positive.sum().item() == 6


def test_histogram_rejects_bad_edges_and_shapes() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="increasing"):
        ratios.signed_ratio_histogram(x, x, torch.ones(2, 3), [0.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="shape"):
        ratios.signed_ratio_histogram(x, torch.zeros(3, 2), torch.ones(2, 3))


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


def test_sequence_geometric_mean_ratio_equals_numpy() -> None:
    log_ratio, _, mask, _ = _random_batch(3)
    rho = ratios.sequence_geometric_mean_ratio(log_ratio, mask).numpy()
    lr, m = log_ratio.numpy(), mask.numpy() > 0
    for i in range(lr.shape[0]):
        expected = np.prod(np.exp(lr[i][m[i]])) ** (1.0 / m[i].sum()) if m[i].any() else 1.0
        assert rho[i] == pytest.approx(expected, rel=1e-10)
    extreme = ratios.sequence_geometric_mean_ratio(torch.full((2, 4), 500.0), torch.ones(2, 4))
    assert torch.isfinite(extreme).all()


def test_clip_fraction_and_mask_fraction() -> None:
    log_ratio = torch.log(torch.tensor([[1.5, 0.5, 1.1, 0.7], [1.3, 0.9, 2.0, 0.1]]))
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0], [1.0, -1.0, 0.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    # eps 0.2: clipped = (A>0, r>1.2): 1.5, 1.3;  (A<0, r<0.8): 0.7.  The 0.1 token is padding.
    frac = ratios.clip_fraction(log_ratio, advantages, mask, 0.2, 0.2)
    assert frac.item() == pytest.approx(3 / 7)
    assert ratios.clip_fraction(log_ratio, advantages, mask, math.inf, math.inf).item() == 0.0
    with pytest.raises(ValueError, match="eps_low"):
        ratios.clip_fraction(log_ratio, advantages, mask, -0.1, 0.2)
    token_mask = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
    assert ratios.mask_fraction(token_mask, mask).item() == pytest.approx(2 / 7)
    assert ratios.mask_fraction(token_mask, torch.zeros(2, 4)).item() == 0.0


def test_trust_region_second_moment_equals_numpy() -> None:
    log_ratio, advantages, mask, _ = _random_batch(4)
    lr, adv, m = log_ratio.numpy(), advantages.numpy(), mask.numpy() > 0
    region = m & (((adv > 0) & (lr > 0)) | ((adv < 0) & (lr < 0)))
    expected = np.mean(lr[region] ** 2)
    got = ratios.trust_region_second_moment(log_ratio, advantages, mask)
    assert got.item() == pytest.approx(expected, rel=1e-12)
    # All tokens: stats.second_moment.
    assert stats.second_moment(log_ratio, mask).item() == pytest.approx(np.mean(lr[m] ** 2), rel=1e-12)
