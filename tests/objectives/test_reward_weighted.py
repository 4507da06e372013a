"""Golden tests for ``opmd``, ``asymre``, ``red_drop`` and ``red_weight`` (Yao et al. 2025, arXiv:2509.24203).

Hand-derived forms: OPMD (paper, sequence form) −A·log π(y) + β/2·(Σₜ Δₜ)² per sequence, ∂/∂logpₜ = −A + β·Σₜ Δₜ;
OPMD token form ℓ = −A·logp + β/2·Δ², ∂ℓ/∂logp = −A + β·Δ; AsymRE ∂ℓ/∂logp = −(A + β);
RED-Weight ∂ℓ/∂logp = −A·e^{A/T}; RED-Drop's effective advantages and |S| normaliser are worked out by hand below.
At ratio 1 these objectives are REINFORCE on their *effective* advantages (A + β, A·e^{A/T}, the RED-Drop A'),
which is what the ratio-1 tests compare against.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from offpolicylab.objectives import TokenBatch, get_objective
from tests.objectives._golden import (
    AGG_MODES,
    expected,
    extreme_log_ratio_batch,
    random_batch,
    run,
)

# ---------------------------------------------------------------------------------------------------- OPMD


@pytest.mark.parametrize("agg", AGG_MODES)
def test_opmd_token_form_golden(agg: str) -> None:
    data = random_batch(seed=1)
    beta = 0.3
    delta = data["logp"] - data["behavior_logp"]
    adv = data["advantages"][:, None]
    per_token = -adv * data["logp"] + 0.5 * beta * delta**2
    want_loss, want_grad = expected(per_token, -adv + beta * delta, data["mask"], agg)
    loss, grad, out = run("opmd", data, beta=beta, form="token", agg=agg)
    assert loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-15)
    reg = (0.5 * beta * delta**2 * data["mask"]).sum() / data["mask"].sum()
    assert float(out.metrics["opmd_reg"]) == pytest.approx(reg, rel=1e-12)


def test_opmd_sequence_form_is_the_papers_loss() -> None:
    """The paper's L = −(1/K) Σᵢ Aᵢ log π(yᵢ) + β/(2K) Σᵢ (log π(yᵢ) − log π_old(yᵢ))², sequence log-probs summed
    over valid tokens in NumPy; it is our loss with agg = seq-mean-token-sum, gradient (1/K)(−Aᵢ + β·Δᵢ) per token."""
    data = random_batch(seed=11, batch=5, length=7)
    beta = 0.2
    mask = data["mask"]
    seq_logp = (data["logp"] * mask).sum(axis=1)
    seq_delta = ((data["logp"] - data["behavior_logp"]) * mask).sum(axis=1)
    adv, k = data["advantages"], len(data["advantages"])
    paper = -(adv * seq_logp).sum() / k + beta / (2 * k) * (seq_delta**2).sum()
    loss, grad, _ = run("opmd", data, agg="seq-mean-token-sum")
    assert get_objective("opmd").form == "sequence"
    assert loss == pytest.approx(paper, rel=1e-12)
    np.testing.assert_allclose(grad, mask * ((-adv + beta * seq_delta) / k)[:, None], rtol=1e-12, atol=1e-15)
    # the token form differs at T > 1 (Σ Δₜ² ≠ (Σ Δₜ)²)
    token_loss, _, _ = run("opmd", data, form="token", agg="seq-mean-token-sum")
    assert abs(token_loss - paper) > 1e-3


@pytest.mark.parametrize("agg", AGG_MODES)
def test_opmd_sequence_form_keeps_the_papers_weighting_under_every_agg(agg: str) -> None:
    """Each sequence's two terms scale alike: per token ℓ = −A·logpₜ + β/2·Δ²/|y|, gradient −A + β·Δ."""
    data = random_batch(seed=12, batch=4, length=5)
    beta = 0.4
    mask = data["mask"]
    length = mask.sum(axis=1, keepdims=True)
    seq_delta = ((data["logp"] - data["behavior_logp"]) * mask).sum(axis=1, keepdims=True)
    adv = data["advantages"][:, None]
    per_token = -adv * data["logp"] + 0.5 * beta * seq_delta**2 / length
    want_loss, want_grad = expected(per_token, -adv + beta * seq_delta, mask, agg)
    loss, grad, _ = run("opmd", data, beta=beta, agg=agg)
    assert loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-15)


def test_opmd_forms_agree_for_one_token_responses() -> None:
    data = random_batch(seed=13, batch=6, length=1)
    data["mask"] = np.ones_like(data["mask"])
    seq_loss, seq_grad, _ = run("opmd", data)
    tok_loss, tok_grad, _ = run("opmd", data, form="token")
    assert seq_loss == pytest.approx(tok_loss, rel=1e-12)
    np.testing.assert_allclose(seq_grad, tok_grad, rtol=1e-12)


def test_opmd_defaults_and_validation() -> None:
    assert get_objective("opmd").beta == 0.2  # β/2 = 0.1, the paper's code's coefficient
    with pytest.raises(ValueError, match="form"):
        get_objective("opmd", form="seq")
    for bad in (-0.1, float("inf")):
        with pytest.raises(ValueError, match="beta"):
            get_objective("opmd", beta=bad)


# -------------------------------------------------------------------------------------------------- AsymRE


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("beta", [0.1, -0.25])
def test_asymre_golden_and_equals_reinforce_with_shifted_baseline(beta: float, agg: str) -> None:
    data = random_batch(seed=2)  # ratios ≠ 1: AsymRE has no ratio, so this holds at any ratio
    adv = data["advantages"][:, None]
    want_loss, want_grad = expected(-(adv + beta) * data["logp"], -(adv + beta) * np.ones_like(adv), data["mask"], agg)
    loss, grad, _ = run("asymre", data, beta=beta, agg=agg)
    assert loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-15)
    shifted = dict(data, advantages=data["advantages"] + beta)
    _, reinforce_grad, _ = run("reinforce", shifted, agg=agg)
    np.testing.assert_allclose(grad, reinforce_grad, rtol=1e-12, atol=1e-15)


def test_asymre_validation() -> None:
    assert get_objective("asymre").beta == 0.1
    with pytest.raises(ValueError, match="beta"):
        get_objective("asymre", beta=float("-inf"))


# ------------------------------------------------------------------------------------------------ RED-Drop
# Interleaved groups (ids need not be contiguous or sorted):
#   group 5 = rows 0, 2, 3, 5 with rewards 0, 1, 0, 0: r̄ = 0.25, one positive (row 2), three negatives
#             -> keep the first negative (row 0), drop rows 3 and 5; kept r̄ = 0.5: A' = −0.5 (row 0), +0.5 (row 2)
#   group 2 = rows 1, 4, 6 with rewards 1, 0, 1: r̄ = 2/3, two positives, one negative -> nothing dropped:
#             A' = 1/3, −2/3, 1/3
#   group 9 = row 7 alone, reward 0.5: A' = 0, kept
RED_GROUPS = np.array([5, 2, 5, 5, 2, 5, 2, 9])
RED_REWARDS = np.array([0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.5])
RED_ADVANTAGES = np.array([-0.5, 1 / 3, 0.5, 0.0, -2 / 3, 0.0, 1 / 3, 0.0])
RED_KEEP = np.array([1, 1, 1, 0, 1, 0, 1, 1], dtype=np.float64)


def _red_batch(seed: int = 4) -> dict:
    data = random_batch(seed=seed, batch=8, length=3)
    data["advantages"] = np.full(8, 123.0)  # ignored by red_drop: it recomputes from rewards
    data["rewards"] = RED_REWARDS
    data["group_ids"] = torch.tensor(RED_GROUPS)
    return data


@pytest.mark.parametrize("agg", AGG_MODES)
def test_red_drop_golden(agg: str) -> None:
    data = _red_batch()
    adv = RED_ADVANTAGES[:, None]
    kept_mask = data["mask"] * RED_KEEP[:, None]  # eq. 10: the mean runs over the kept sequences S only
    want_loss, want_grad = expected(-adv * data["logp"], -adv * np.ones_like(data["logp"]), kept_mask, agg)
    loss, grad, out = run("red_drop", data, agg=agg)
    assert loss == pytest.approx(want_loss, rel=1e-12, abs=1e-15)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(out.token_mask.numpy(), RED_KEEP[:, None] * data["mask"])
    assert float(out.metrics["drop_frac"]) == pytest.approx(2 / 8)
    # ratio-independent, so it is REINFORCE on the effective advantages A' over the kept sequences at any ratio
    _, reinforce_grad, _ = run("reinforce", dict(data, advantages=RED_ADVANTAGES, mask=kept_mask), agg=agg)
    np.testing.assert_allclose(grad, reinforce_grad, rtol=1e-12, atol=1e-15)


def test_red_drop_one_positive_seven_negatives_by_hand() -> None:
    """Eq. 10 by hand, T = 1: rewards [1, 0 × 7] keep S = {the positive, the first negative}, r̄_S = 0.5,
    A' = ±0.5, L = −(1/|S|)·(0.5·log π(y₊) − 0.5·log π(y₋)) → ∂L/∂logp = −0.25 / +0.25, 0 for the dropped six
    (normalising by all 8 sequences instead would give ∓0.0625, 4× too small)."""
    logp = np.log(np.full((8, 1), 0.3))
    data = {"logp": logp, "behavior_logp": logp - 0.1, "advantages": np.zeros(8), "mask": np.ones((8, 1)),
            "rewards": np.array([1.0] + [0.0] * 7), "group_ids": torch.zeros(8, dtype=torch.long)}
    loss, grad, out = run("red_drop", data)
    np.testing.assert_allclose(grad[:, 0], [-0.25, 0.25, 0, 0, 0, 0, 0, 0], atol=1e-15)
    assert loss == pytest.approx(-(0.5 * np.log(0.3) - 0.5 * np.log(0.3)) / 2, abs=1e-15)
    assert float(out.metrics["drop_frac"]) == pytest.approx(6 / 8)
    assert float(out.metrics["mask_frac"]) == pytest.approx(6 / 8)


def test_red_drop_balanced_groups_equal_reinforce_at_ratio_one() -> None:
    """Nothing to drop (positives ≥ negatives everywhere): red_drop = REINFORCE with A = r − r̄ per group."""
    data = random_batch(seed=8, batch=6, length=4)
    data["behavior_logp"] = data["logp"].copy()
    data["group_ids"] = torch.tensor([0, 0, 0, 1, 1, 1])
    data["rewards"] = np.array([1.0, 1.0, 0.0, 0.3, 0.9, 0.9])  # group means 2/3 and 0.7
    advantages = data["rewards"] - np.array([2 / 3] * 3 + [0.7] * 3)
    _, grad, out = run("red_drop", data)
    _, reinforce_grad, _ = run("reinforce", dict(data, advantages=advantages))
    np.testing.assert_allclose(grad, reinforce_grad, rtol=1e-12, atol=1e-15)
    assert float(out.metrics["drop_frac"]) == 0.0


def test_red_drop_ties_count_as_positive() -> None:
    """r_i = r̄ up to rounding (0.1 + 0.1 + 0.1 ≠ 0.3 in floating point) is a positive: nothing is dropped."""
    data = random_batch(seed=9, batch=3, length=2)
    data["rewards"], data["group_ids"] = np.array([0.1, 0.1, 0.1]), torch.tensor([4, 4, 4])
    _, grad, out = run("red_drop", data)
    assert float(out.metrics["drop_frac"]) == 0.0
    np.testing.assert_allclose(grad, 0.0, atol=1e-12)


@pytest.mark.parametrize("missing", ["rewards", "group_ids"])
def test_red_drop_needs_rewards_and_groups(missing: str) -> None:
    data = _red_batch()
    data[missing] = None
    with pytest.raises(ValueError, match=missing):
        run("red_drop", data)


def test_red_drop_works_in_float32_with_float_group_ids() -> None:
    data = _red_batch()
    data["group_ids"] = torch.tensor(RED_GROUPS, dtype=torch.float32)
    _, grad, _ = run("red_drop", data, dtype=torch.float32)
    kept_mask = data["mask"] * RED_KEEP[:, None]
    want = -RED_ADVANTAGES[:, None] * kept_mask / kept_mask.sum()
    np.testing.assert_allclose(grad, want, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------------------------- RED-Weight


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_red_weight_golden_and_equals_weighted_reinforce(temperature: float, agg: str) -> None:
    data = random_batch(seed=6)
    adv = data["advantages"][:, None]
    effective = adv * np.exp(adv / temperature)
    want_loss, want_grad = expected(-effective * data["logp"], -effective * np.ones_like(adv), data["mask"], agg)
    loss, grad, out = run("red_weight", data, temperature=temperature, agg=agg)
    assert loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-15)
    _, reinforce_grad, _ = run("reinforce", dict(data, advantages=effective[:, 0]), agg=agg)
    np.testing.assert_allclose(grad, reinforce_grad, rtol=1e-12, atol=1e-15)
    weights = np.broadcast_to(np.exp(adv / temperature), data["mask"].shape)
    assert float(out.metrics["weight_mean"]) == pytest.approx((weights * data["mask"]).sum() / data["mask"].sum())


def test_red_weight_validation() -> None:
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="temperature"):
            get_objective("red_weight", temperature=bad)


# ------------------------------------------------------------------------------------------------- shared


@pytest.mark.parametrize("agg", AGG_MODES)
def test_opmd_at_ratio_one_equals_reinforce(agg: str) -> None:
    data = random_batch(seed=10)
    data["behavior_logp"] = data["logp"].copy()
    _, grad, _ = run("opmd", data, agg=agg)
    _, reinforce_grad, _ = run("reinforce", data, agg=agg)
    np.testing.assert_allclose(grad, reinforce_grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["opmd", "asymre", "red_drop", "red_weight"])
def test_finite_at_extreme_log_ratios(name: str, dtype: torch.dtype) -> None:
    data = extreme_log_ratio_batch(seed=12)
    data["rewards"] = np.arange(data["logp"].shape[0], dtype=np.float64) % 2
    data["group_ids"] = torch.zeros(data["logp"].shape[0], dtype=torch.long)
    loss, grad, _ = run(name, data, dtype=dtype)
    assert np.isfinite(loss) and np.all(np.isfinite(grad))


@pytest.mark.parametrize("name", ["opmd", "asymre", "red_drop", "red_weight"])
def test_padding_is_inert(name: str) -> None:
    clean = _red_batch(seed=14)
    clean["mask"][:, -1] = 0.0
    dirty = dict(clean, logp=clean["logp"].copy(), behavior_logp=clean["behavior_logp"].copy())
    dirty["logp"][:, -1] = np.nan
    dirty["behavior_logp"][:, -1] = np.inf
    loss_c, grad_c, _ = run(name, clean)
    loss_d, grad_d, _ = run(name, dirty)
    assert loss_d == pytest.approx(loss_c, rel=1e-12)
    np.testing.assert_allclose(grad_d, grad_c, rtol=1e-12)
    assert np.all(grad_d[:, -1] == 0.0)


def test_metrics_are_detached() -> None:
    data = _red_batch()
    batch = TokenBatch(
        logp=torch.tensor(data["logp"], requires_grad=True),
        behavior_logp=torch.tensor(data["behavior_logp"]),
        advantages=torch.tensor(data["advantages"]),
        mask=torch.tensor(data["mask"]),
        rewards=torch.tensor(data["rewards"]),
        group_ids=data["group_ids"],
    )
    for name in ("opmd", "asymre", "red_drop", "red_weight"):
        out = get_objective(name)(batch)
        assert all(not value.requires_grad for value in out.metrics.values()), name
