"""Golden tests for ``gspo`` (Zheng et al. 2025, arXiv:2507.18071) and ``rec_gspo`` (Yao et al. 2025).

Per-row clip / keep flags are hand-enumerated from the chosen mean log-ratios; per-token losses and gradients use
the hand-derived forms (GSPO-token: value of s_it is s_i and ∂s_it/∂logp_it = s_i), aggregated with ``_golden``'s
independent NumPy weights.  A second, independent check differentiates GSPO's *sequence* objective directly.
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
    random_batch,
    run,
)

EPS_LOW, EPS_HIGH = 3e-4, 4e-4
MASK = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=np.float64)
LOG_RATIO = np.array(
    [
        [0.01, -0.02, 0.005, 0.005],  # mean 0      -> s = 1, inside the band
        [0.003, -0.001, 0.0, 0.0],  # mean +0.001 -> s > 1 + 4e-4
        [-0.002, 0.001, -0.002, 0.0],  # mean −0.001 -> s < 1 − 3e-4
        [0.004, 0.0, 0.002, 0.002],  # mean +0.002 -> s > 1 + 4e-4
        [-0.001, -0.003, 0.0, 0.0],  # mean −0.002 -> s < 1 − 3e-4
    ]
)
ADVANTAGES = np.array([0.5, 1.0, -1.0, -0.8, 0.6])
# hand-enumerated: PPO-style clip on s removes the gradient when (A > 0, s > 1+ε_h) or (A < 0, s < 1−ε_l)
GSPO_CLIPPED = np.array([False, True, True, False, False])
GSPO_BOUND = np.array([np.nan, 1 + EPS_HIGH, 1 - EPS_LOW, np.nan, np.nan])
# REC one-side on s keeps (A ≥ 0, s ≤ 1+ε_h) or (A ≤ 0, s ≥ 1−ε_l)
REC_KEEP = np.array([True, False, False, True, True])


def _golden_batch() -> dict:
    logp = np.log(np.linspace(0.1, 0.9, MASK.size).reshape(MASK.shape))
    return batch_data(logp, logp - LOG_RATIO, ADVANTAGES, MASK)


def _seq_ratio() -> np.ndarray:
    return np.exp((LOG_RATIO * MASK).sum(axis=1) / MASK.sum(axis=1))


@pytest.mark.parametrize("agg", AGG_MODES)
def test_gspo_golden(agg: str) -> None:
    data = _golden_batch()
    s = _seq_ratio()
    row_loss = np.where(GSPO_CLIPPED, -ADVANTAGES * GSPO_BOUND, -ADVANTAGES * s)
    row_grad = np.where(GSPO_CLIPPED, 0.0, -ADVANTAGES * s)
    want_loss, want_grad = expected(
        np.repeat(row_loss[:, None], 4, axis=1), np.repeat(row_grad[:, None], 4, axis=1), MASK, agg
    )
    loss, grad, out = run("gspo", data, agg=agg)
    assert loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-15)
    clipped_tokens = (GSPO_CLIPPED[:, None] * MASK).sum() / MASK.sum()
    assert float(out.metrics["clip_frac"]) == pytest.approx(clipped_tokens)
    np.testing.assert_array_equal(out.token_mask.numpy(), (~GSPO_CLIPPED)[:, None] * MASK)


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("importance_sampling", [True, False])
def test_rec_gspo_golden(importance_sampling: bool, agg: str) -> None:
    data = _golden_batch()
    s = _seq_ratio()
    keep = REC_KEEP[:, None].astype(np.float64) * np.ones_like(MASK)
    adv = ADVANTAGES[:, None] * np.ones_like(MASK)
    if importance_sampling:
        per_token, grad_token = -keep * adv * s[:, None], -keep * adv * s[:, None]
    else:
        per_token, grad_token = -keep * adv * data["logp"], -keep * adv
    want_loss, want_grad = expected(per_token, grad_token, MASK, agg)
    loss, grad, out = run("rec_gspo", data, importance_sampling=importance_sampling, agg=agg)
    assert loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(out.token_mask.numpy(), keep * MASK)
    assert float(out.metrics["clip_frac"]) == pytest.approx(1.0 - (keep * MASK).sum() / MASK.sum())


def test_rec_gspo_default_band_is_the_rec_papers() -> None:
    """REC paper App. B.7: ε_l = 6e-4, ε_h = 8e-4.  Mean log-ratios ±7e-4 give s = e^{±7e-4} ≈ 1.00070 / 0.99930,
    so by hand: A > 0 at s = 1.00070 ≤ 1 + 8e-4 is kept (GSPO's 1 + 4e-4 masks it); A < 0 at s = 0.99930 <
    1 − 6e-4 = 0.9994 is masked by both."""
    log_ratio = np.array([[7e-4, 7e-4], [-7e-4, -7e-4]])
    logp = np.log(np.array([[0.4, 0.5], [0.3, 0.6]]))
    data = batch_data(logp, logp - log_ratio, np.array([1.0, -1.0]), np.ones((2, 2)))
    _, _, out = run("rec_gspo", data)
    np.testing.assert_array_equal(out.token_mask.numpy(), [[1.0, 1.0], [0.0, 0.0]])
    _, _, narrow = run("rec_gspo", data, eps_low=3e-4, eps_high=4e-4)
    np.testing.assert_array_equal(narrow.token_mask.numpy(), [[0.0, 0.0], [0.0, 0.0]])


def test_gspo_token_form_equals_sequence_objective() -> None:
    """With sequence advantages and seq-mean-token-mean, GSPO-token's loss and gradient equal those of GSPO's
    sequence objective L = (1/B) Σ_i max(−A_i·s_i, −A_i·clip(s_i)), s_i = exp(mean_t log r_it), differentiated
    through s_i by autograd."""
    data = random_batch(seed=21, batch=6, length=5, spread=0.002)
    loss, grad, out = run("gspo", data, agg="seq-mean-token-mean")
    assert 0.0 < float(out.metrics["clip_frac"]) < 1.0  # both branches exercised

    logp = torch.tensor(data["logp"], requires_grad=True)
    mask = torch.tensor(data["mask"])
    adv = torch.tensor(data["advantages"])
    seq_ratio = torch.exp(((logp - torch.tensor(data["behavior_logp"])) * mask).sum(1) / mask.sum(1))
    seq_loss = torch.maximum(-adv * seq_ratio, -adv * seq_ratio.clamp(1 - EPS_LOW, 1 + EPS_HIGH)).mean()
    seq_loss.backward()
    assert loss == pytest.approx(float(seq_loss.detach()), rel=1e-12)
    np.testing.assert_allclose(grad, logp.grad.numpy() * data["mask"], rtol=1e-10, atol=1e-15)


VARIANTS = [("gspo", {}), ("rec_gspo", {"importance_sampling": True}), ("rec_gspo", {"importance_sampling": False})]


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize(("name", "params"), VARIANTS)
def test_at_ratio_one_equals_reinforce(name: str, params: dict, agg: str) -> None:
    assert_ratio_one_equals_reinforce(name, 13, agg, **params)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("name", "params"), VARIANTS)
def test_finite_at_extreme_log_ratios(name: str, params: dict, dtype: torch.dtype) -> None:
    data = extreme_log_ratio_batch(seed=7)
    data["behavior_logp"][:, 0] = data["logp"][:, 0] - 50.0  # push some sequence means far from 0
    assert_finite_at_extreme_log_ratios(name, data, dtype, **params)


@pytest.mark.parametrize(("name", "params"), [("gspo", {}), ("rec_gspo", {"importance_sampling": True})])
def test_padding_is_inert(name: str, params: dict) -> None:
    assert_padding_is_inert(name, _golden_batch(), **params)


def test_defaults() -> None:
    gspo = get_objective("gspo")
    assert (gspo.eps_low, gspo.eps_high, gspo.agg) == (3e-4, 4e-4, "token-mean")
    rec_gspo = get_objective("rec_gspo")
    assert (rec_gspo.eps_low, rec_gspo.eps_high, rec_gspo.importance_sampling) == (6e-4, 8e-4, False)
    with pytest.raises(ValueError, match="eps_low"):
        get_objective("rec_gspo", eps_low=2.0)
    with pytest.raises(ValueError, match="eps_high"):
        get_objective("gspo", eps_high=-1e-4)
