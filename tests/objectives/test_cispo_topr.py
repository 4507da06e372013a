"""Golden tests for ``cispo`` (MiniMax-M1, arXiv:2506.13585) and ``topr`` (Le Roux et al. 2025, arXiv:2503.14286).

Both are ℓ = −c·A·logp with a detached weight c, so ∂ℓ/∂logp = −c·A; the weights c below are written out by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from offpolicylab.objectives import get_objective
from tests.objectives._golden import (
    AGG_MODES,
    assert_finite_at_extreme_log_ratios,
    assert_padding_is_inert,
    assert_ratio_one_equals_reinforce,
    batch_data,
    expected,
    extreme_log_ratio_batch,
    run,
)

# ------------------------------------------------------------------------------------------------- CISPO
RATIOS = np.array([0.3, 0.9, 1.1, 1.5])
CISPO_ADV = np.array([0.8, -1.2])
CISPO_CASES = {  # (params, hand-written clipped weights for RATIOS, clipped flags)
    "paper_default": ({}, [0.3, 0.9, 1.1, 1.28], [0, 0, 0, 1]),
    "two_sided": ({"eps_low": 0.2, "eps_high": 0.28}, [0.8, 0.9, 1.1, 1.28], [1, 0, 0, 1]),
    "unclipped": ({"eps_low": float("inf"), "eps_high": float("inf")}, [0.3, 0.9, 1.1, 1.5], [0, 0, 0, 0]),
}


def _cispo_batch() -> dict:
    logp = np.log(np.array([[0.2, 0.4, 0.6, 0.8], [0.3, 0.5, 0.7, 0.9]]))
    return batch_data(logp, logp - np.log(RATIOS)[None, :], CISPO_ADV, np.ones_like(logp))


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("case", sorted(CISPO_CASES))
def test_cispo_golden(case: str, agg: str) -> None:
    params, weights, clipped = CISPO_CASES[case]
    data = _cispo_batch()
    weight = np.broadcast_to(np.array(weights), data["logp"].shape)
    adv = CISPO_ADV[:, None]
    want_loss, want_grad = expected(-weight * adv * data["logp"], -weight * adv, data["mask"], agg)
    loss, grad, out = run("cispo", data, agg=agg, **params)
    assert loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-15)
    assert float(out.metrics["clip_frac"]) == pytest.approx(np.mean(clipped))
    np.testing.assert_array_equal(out.token_mask.numpy(), 1.0)  # CISPO never drops a token


def test_cispo_defaults() -> None:
    obj = get_objective("cispo")
    assert (obj.eps_low, obj.eps_high) == (1.0, 0.28)
    with pytest.raises(ValueError, match="eps_high"):
        get_objective("cispo", eps_high=-0.5)


# -------------------------------------------------------------------------------------------------- TOPR
TOPR_MASK = np.array([[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 1, 1]], dtype=np.float64)
TOPR_LOG_RATIO = np.array(
    [
        [0.5, 0.3, -0.1],  # A > 0, Σ = +0.7: weight 1 (no IS on positives, even above 1)
        [-0.4, -0.6, 9.0],  # A > 0, Σ = −1.0: weight 1            (last entry is padding)
        [0.6, -0.2, 9.0],  # A < 0, Σ = +0.4: weight min(1, e^0.4) = 1, truncated
        [0.3, -0.5, -0.7],  # A < 0, Σ = −0.9: weight e^−0.9
    ]
)
TOPR_ADV = np.array([1.0, 0.5, -1.0, -0.6])
TOPR_WEIGHTS = {  # hand-written
    "sequence": np.array([[1, 1, 1], [1, 1, 1], [1, 1, 1], [np.exp(-0.9)] * 3]),
    "token": np.array([[1, 1, 1], [1, 1, 1], [1, np.exp(-0.2), 1], [1, np.exp(-0.5), np.exp(-0.7)]]),
}
TOPR_TRUNCATED_TOKENS = {"sequence": 2, "token": 2}  # valid tokens with A < 0 whose ratio (level) exceeds 1


def _topr_batch() -> dict:
    logp = np.log(np.linspace(0.15, 0.85, 12).reshape(4, 3))
    return batch_data(logp, logp - TOPR_LOG_RATIO, TOPR_ADV, TOPR_MASK)


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("level", sorted(TOPR_WEIGHTS))
def test_topr_golden(level: str, agg: str) -> None:
    data = _topr_batch()
    weight = TOPR_WEIGHTS[level]
    adv = TOPR_ADV[:, None]
    want_loss, want_grad = expected(-weight * adv * data["logp"], -weight * adv, TOPR_MASK, agg)
    loss, grad, out = run("topr", data, ratio_level=level, agg=agg)
    assert loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-15)
    assert float(out.metrics["clip_frac"]) == pytest.approx(TOPR_TRUNCATED_TOKENS[level] / TOPR_MASK.sum())


def test_topr_sequence_level_is_the_papers_estimator() -> None:
    """With seq-mean-token-sum the loss is (1/B) Σ_i −c_i·A_i·log π(τ_i), log π(τ) = Σ_t log π(y_t), the paper's
    trajectory form; its gradient w.r.t. each token's logp is −c_i·A_i/B."""
    data = _topr_batch()
    c = np.array([1.0, 1.0, 1.0, np.exp(-0.9)])
    log_traj = (data["logp"] * TOPR_MASK).sum(axis=1)
    loss, grad, _ = run("topr", data, agg="seq-mean-token-sum")
    assert loss == pytest.approx(np.mean(-c * TOPR_ADV * log_traj), rel=1e-12)
    np.testing.assert_allclose(grad, (-c * TOPR_ADV / 4)[:, None] * TOPR_MASK, rtol=1e-12)


def test_topr_defaults() -> None:
    assert get_objective("topr").ratio_level == "sequence"
    with pytest.raises(ValueError, match="sequence, token"):
        get_objective("topr", ratio_level="trajectory")


# ------------------------------------------------------------------------------------------------ shared
VARIANTS = [("cispo", {}), ("cispo", {"eps_low": 0.2}), ("topr", {"ratio_level": "sequence"}),
            ("topr", {"ratio_level": "token"})]


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize(("name", "params"), VARIANTS)
def test_at_ratio_one_equals_reinforce(name: str, params: dict, agg: str) -> None:
    assert_ratio_one_equals_reinforce(name, 15, agg, **params)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("name", "params"), VARIANTS)
def test_finite_at_extreme_log_ratios(name: str, params: dict, dtype: torch.dtype) -> None:
    assert_finite_at_extreme_log_ratios(name, extreme_log_ratio_batch(seed=16), dtype, **params)


@pytest.mark.parametrize(("name", "params"), VARIANTS)
def test_padding_is_inert(name: str, params: dict) -> None:
    assert_padding_is_inert(name, _topr_batch(), **params)
