"""Golden tests for ``rec`` (REC one-side / two-side / ring, IS and NoIS; Yao et al. 2025, arXiv:2509.24203).

Keep masks are hand-enumerated tables (not recomputed with the implementation's rule); losses and gradients come
from the hand-derived per-token forms IS: ℓ = −k·A·r, ∂ℓ/∂logp = −k·A·r and NoIS: ℓ = −k·A·logp, ∂ℓ/∂logp = −k·A,
aggregated with the independent NumPy weights of ``_golden``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.objectives._golden import (
    AGG_MODES,
    assert_finite_at_extreme_log_ratios,
    assert_padding_is_inert,
    assert_ratio_one_equals_reinforce,
    batch_data,
    expected,
    extreme_log_ratio_batch,
    random_batch,
    run,
)

# ratios chosen strictly inside each region (no boundary ties), eps = 0.2 / 0.2, ring (0.6, 2.0):
# regions: r ≤ 0.4 | 0.4 < r < 0.8 | 0.8 ≤ r ≤ 1.2 | 1.2 < r < 3.0 | r ≥ 3.0
RATIOS = np.array([0.3, 0.5, 0.9, 1.1, 1.5, 3.5])
ADVANTAGES = np.array([1.5, -0.7])  # row 0 positive, row 1 negative
KEEP = {  # hand-enumerated: rows = (A > 0, A < 0), columns = RATIOS
    "one_side": np.array([[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]]),
    "two_side": np.array([[0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 0, 0]]),
    "ring": np.array([[1, 0, 1, 1, 0, 0], [0, 0, 1, 1, 0, 1]]),
}


def _table_batch():
    logp = np.log(np.array([[0.2, 0.35, 0.5, 0.65, 0.8, 0.9], [0.15, 0.3, 0.45, 0.6, 0.7, 0.85]]))
    ratios = np.stack([RATIOS, RATIOS])
    behavior = logp - np.log(ratios)
    mask = np.ones_like(logp)
    return logp, behavior, mask, ratios


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("importance_sampling", [True, False])
@pytest.mark.parametrize("mask_kind", sorted(KEEP))
def test_rec_golden_loss_and_gradient(mask_kind: str, importance_sampling: bool, agg: str) -> None:
    logp, behavior, mask, ratios = _table_batch()
    keep = KEEP[mask_kind].astype(np.float64)
    adv = np.broadcast_to(ADVANTAGES[:, None], logp.shape)
    if importance_sampling:
        per_token, grad_token = -keep * adv * ratios, -keep * adv * ratios
    else:
        per_token, grad_token = -keep * adv * logp, -keep * adv
    want_loss, want_grad = expected(per_token, grad_token, mask, agg)

    data = batch_data(logp, behavior, ADVANTAGES, mask)
    loss, grad, out = run("rec", data, mask=mask_kind, importance_sampling=importance_sampling, agg=agg)
    assert loss == pytest.approx(want_loss, rel=1e-12, abs=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(out.token_mask.numpy(), keep)
    assert float(out.metrics["clip_frac"]) == pytest.approx(1.0 - keep.mean())
    assert float(out.metrics["mask_frac"]) == pytest.approx(1.0 - keep.mean())


def test_rec_padding_is_inert() -> None:
    """Garbage (nan / inf) on padded tokens changes neither loss nor gradient, and padding gets zero gradient."""
    logp, behavior, mask, _ = _table_batch()
    mask[:, -2:] = 0.0
    clean = batch_data(logp, behavior, ADVANTAGES, mask)
    for importance_sampling in (True, False):
        params = {"mask": "ring", "importance_sampling": importance_sampling}
        assert_padding_is_inert("rec", clean, behavior_garbage=np.inf, **params)


@pytest.mark.parametrize("agg", AGG_MODES)
def test_rec_one_side_is_has_grpo_gradient(agg: str) -> None:
    """REC-OneSide-IS keeps exactly the tokens PPO's clip leaves a gradient on, with weight r: GRPO's gradient."""
    data = random_batch(seed=3, spread=0.4)
    _, rec_grad, out = run("rec", data, mask="one_side", importance_sampling=True, eps_low=0.2, eps_high=0.28, agg=agg)
    assert 0.0 < float(out.metrics["clip_frac"]) < 1.0
    _, grpo_grad, _ = run("grpo", data, eps_low=0.2, eps_high=0.28, agg=agg)
    assert np.abs(rec_grad).sum() > 0
    np.testing.assert_allclose(rec_grad, grpo_grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("importance_sampling", [True, False])
@pytest.mark.parametrize("mask_kind", sorted(KEEP))
def test_rec_at_ratio_one_equals_reinforce(mask_kind: str, importance_sampling: bool, agg: str) -> None:
    assert_ratio_one_equals_reinforce("rec", 11, agg, mask=mask_kind, importance_sampling=importance_sampling)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("importance_sampling", [True, False])
def test_rec_finite_at_extreme_log_ratios(importance_sampling: bool, dtype: torch.dtype) -> None:
    data = extreme_log_ratio_batch(seed=5)
    for mask_kind in KEEP:
        params = {"mask": mask_kind, "importance_sampling": importance_sampling}
        assert_finite_at_extreme_log_ratios("rec", data, dtype, **params)


def test_rec_defaults_are_the_papers() -> None:
    from offpolicylab.objectives import get_objective

    obj = get_objective("rec")
    assert (obj.mask, obj.importance_sampling) == ("one_side", False)
    assert (obj.eps_low, obj.eps_high, obj.ring_low, obj.ring_high) == (0.2, 0.2, 0.6, 2.0)


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"mask": "ring", "eps_low": 0.5, "ring_low": 0.4}, "ring_low"),
        ({"mask": "ring", "eps_high": 2.5, "ring_high": 2.0}, "ring_high"),
        ({"mask": "three_side"}, "one_side, two_side, ring"),
        ({"eps_low": 1.5}, "eps_low"),
        ({"eps_high": -0.1}, "eps_high"),
        ({"importance_sampling": "maybe"}, "importance_sampling"),
    ],
)
def test_rec_rejects_inconsistent_parameters(params: dict, needle: str) -> None:
    from offpolicylab.objectives import get_objective

    with pytest.raises(ValueError, match=needle):
        get_objective("rec", **params)


def test_rec_ring_bounds_only_checked_for_ring() -> None:
    from offpolicylab.objectives import get_objective

    assert get_objective("rec", mask="one_side", eps_high=2.5).eps_high == 2.5
