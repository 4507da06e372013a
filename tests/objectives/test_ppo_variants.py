"""GPPO and decoupled PPO: loss and gradient against the papers' equations worked out by hand and in NumPy.

GPPO (Su et al. 2025, arXiv:2508.07629): ℓ = max(−A·r, −A·clip(r, (1−ε_l)·r/sg(r), (1+ε_h)·r/sg(r))); its value is
PPO's, and ∂ℓ/∂log π is −A·r on the unclipped branch, −A·(1±ε) where a bound set the value.
Decoupled PPO (Fu et al. 2025, arXiv:2505.24298): ℓ = −w·min(u·A, clip(u, 1−ε, 1+ε)·A), u = π_θ/π_prox,
w = π_prox/π_behavior (a constant), so ∂ℓ/∂log π is −w·A·u on the unclipped branch and 0 where the clip set it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from offpolicylab.objectives import TokenBatch, get_objective
from tests.objectives._golden import AGG_MODES, agg_weights, batch_data, expected, random_batch, run, tensor

# (A, r) per token, and the value and derivative the GPPO equation gives for ε_l = 0.2, ε_h = 0.28, by hand:
GPPO_HAND = [
    (1.0, 1.5, -1.28, -1.28),   # A > 0 above 1 + ε_h: value −A·1.28, gradient −A·1.28 (PPO: 0)
    (1.0, 0.5, -0.5, -0.5),     # A > 0 below 1 − ε_l: min picks r·A, unclipped
    (-1.0, 0.5, 0.8, 0.8),      # A < 0 below 1 − ε_l: value −A·0.8, gradient −A·0.8 (PPO: 0)
    (-1.0, 1.5, 1.5, 1.5),      # A < 0 above 1 + ε_h: unclipped
    (2.0, 1.1, -2.2, -2.2),     # inside the bounds: −A·r
    (-0.5, 2.0, 1.0, 1.0),      # A < 0 far above: unclipped, −A·r = 1.0
    (0.0, 3.0, 0.0, 0.0),       # A = 0: nothing
    (0.5, 1.28, -0.64, -0.64),  # on the bound itself: both branches give −A·1.28
]


def _token_row(cases: list[tuple[float, float, float, float]], behavior: float = -1.0) -> dict[str, np.ndarray]:
    advantages = np.array([[a for a, *_ in cases]])
    log_ratio = np.log(np.array([[r for _, r, *_ in cases]]))
    behavior_logp = np.full_like(log_ratio, behavior)
    return batch_data(behavior_logp + log_ratio, behavior_logp, advantages, np.ones_like(log_ratio))


@pytest.mark.parametrize("agg", AGG_MODES)
def test_gppo_hand_values_of_loss_and_gradient(agg: str) -> None:
    data = _token_row(GPPO_HAND)
    loss, grad, out = run("gppo", data, agg=agg)
    want_loss, want_grad = expected(np.array([[v for *_, v, _ in GPPO_HAND]]), np.array([[g for *_, g in GPPO_HAND]]),
                                    data["mask"], agg)
    assert loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-15)
    assert float(out.metrics["clip_frac"]) == pytest.approx(2 / len(GPPO_HAND))  # the first and third tokens were clipped
    assert float(out.metrics["mask_frac"]) == 0.0  # every token keeps a gradient


def test_gppo_value_is_ppo_clip_and_gradient_differs_only_on_clipped_tokens() -> None:
    data = random_batch(3, batch=6, length=7, spread=0.6)
    loss, grad, out = run("gppo", data, eps_low=0.2, eps_high=0.28)
    ppo_loss, ppo_grad, ppo_out = run("grpo", data, eps_low=0.2, eps_high=0.28)
    assert loss == pytest.approx(ppo_loss, rel=1e-12)
    clipped = (ppo_out.token_mask.numpy() == 0) & (data["mask"] > 0)
    assert clipped.any() and (~clipped & (data["mask"] > 0)).any()
    np.testing.assert_allclose(grad[~clipped], ppo_grad[~clipped], rtol=1e-12, atol=1e-15)
    # clipped tokens: −A·(bound) times the aggregation weight, the bound from the side the ratio left through
    ratio = np.exp(data["logp"] - data["behavior_logp"])
    advantages = np.broadcast_to(data["advantages"][:, None], ratio.shape)
    bound = np.where(ratio > 1.0, 1.28, 0.8)
    want = agg_weights(data["mask"], "token-mean") * -advantages * bound
    np.testing.assert_allclose(grad[clipped], want[clipped], rtol=1e-12)
    assert float(out.metrics["clip_frac"]) == pytest.approx(float(ppo_out.metrics["clip_frac"]))


def test_gppo_equals_the_papers_stop_gradient_expression_under_autograd() -> None:
    """The authors' form, written out with autograd: −A·clamp(r, (1−ε_l)·r/sg(r), (1+ε_h)·r/sg(r)) maxed with −A·r."""
    data = random_batch(7, batch=5, length=6, spread=0.7)
    loss, grad, _ = run("gppo", data)
    logp = tensor(data["logp"]).requires_grad_(True)
    ratio = torch.exp(logp - tensor(data["behavior_logp"]))
    advantages = tensor(data["advantages"])[:, None]
    gentle = torch.clamp(ratio, 0.8 * ratio / ratio.detach(), 1.28 * ratio / ratio.detach())
    per_token = torch.maximum(-advantages * ratio, -advantages * gentle)
    mask = tensor(data["mask"])
    reference = (per_token * mask).sum() / mask.sum()
    reference.backward()
    assert loss == pytest.approx(float(reference.detach()), rel=1e-12)
    np.testing.assert_allclose(grad, logp.grad.numpy(), rtol=1e-10, atol=1e-14)


def test_gppo_dual_clip_caps_negative_advantages_with_zero_gradient() -> None:
    # A = −1: r = 5 → PPO value 5 > c = 3 → ℓ = 3, gradient 0; r = 2 → ℓ = 2 < 3, gradient 2; r = 0.5 → 0.8, 0.8
    cases = [(-1.0, 5.0, 3.0, 0.0), (-1.0, 2.0, 2.0, 2.0), (-1.0, 0.5, 0.8, 0.8), (1.0, 5.0, -1.28, -1.28)]
    data = _token_row(cases)
    loss, grad, _ = run("gppo", data, dual_clip=3.0)
    want_loss, want_grad = expected(np.array([[c[2] for c in cases]]), np.array([[c[3] for c in cases]]),
                                    data["mask"], "token-mean")
    assert loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-15)


# ------------------------------------------------------------------------------------------------ decoupled PPO
# (A, u = π_θ/π_prox, w = π_prox/π_behavior) and the equation's value and derivative for ε = 0.2, by hand:
DECOUPLED_HAND = [
    (1.0, 1.5, 2.0, -2.4, 0.0),      # A > 0, u above 1.2: value −w·1.2·A, clipped (gradient 0)
    (1.0, 0.5, 0.5, -0.25, -0.25),   # A > 0, u below 0.8: min picks u·A: −w·u·A, gradient the same
    (-1.0, 0.5, 3.0, 2.4, 0.0),      # A < 0, u below 0.8: value −w·0.8·A, clipped
    (-1.0, 1.5, 1.0, 1.5, 1.5),      # A < 0, u above 1.2: unclipped
    (2.0, 1.0, 0.25, -0.5, -0.5),    # u = 1 (π_prox = π_θ): importance sampling, −w·A
]


def _decoupled_row(cases: list[tuple[float, ...]]) -> dict[str, np.ndarray]:
    advantages = np.array([[c[0] for c in cases]])
    log_u, log_w = np.log([[c[1] for c in cases]]), np.log([[c[2] for c in cases]])
    behavior_logp = np.full_like(log_u, -2.0)
    prox_logp = behavior_logp + log_w
    return batch_data(prox_logp + log_u, behavior_logp, advantages, np.ones_like(log_u), prox_logp=prox_logp)


@pytest.mark.parametrize("agg", AGG_MODES)
def test_decoupled_ppo_hand_values_of_loss_and_gradient(agg: str) -> None:
    data = _decoupled_row(DECOUPLED_HAND)
    loss, grad, out = run("decoupled_ppo", data, agg=agg)
    want_loss, want_grad = expected(np.array([[c[3] for c in DECOUPLED_HAND]]),
                                    np.array([[c[4] for c in DECOUPLED_HAND]]), data["mask"], agg)
    assert loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-15)
    assert float(out.metrics["clip_frac"]) == pytest.approx(2 / 5)
    assert float(out.metrics["mask_frac"]) == 0.0


def test_decoupled_ppo_behavior_cap_drops_heavy_tokens_but_keeps_them_in_the_denominator() -> None:
    data = _decoupled_row(DECOUPLED_HAND)
    loss, grad, out = run("decoupled_ppo", data, behavior_cap=2.5)  # only the w = 3 token exceeds the cap
    values = np.array([[c[3] for c in DECOUPLED_HAND]])
    grads = np.array([[c[4] for c in DECOUPLED_HAND]])
    values[0, 2] = grads[0, 2] = 0.0
    want_loss, want_grad = expected(values, grads, data["mask"], "token-mean")  # still divided by 5 tokens
    assert loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-15)
    assert out.token_mask.tolist() == [[1.0, 1.0, 0.0, 1.0, 1.0]]
    assert float(out.metrics["mask_frac"]) == pytest.approx(1 / 5)


def test_decoupled_ppo_with_prox_equal_to_behavior_is_grpo_and_with_prox_equal_to_current_is_is_weighted() -> None:
    data = random_batch(11, batch=5, length=6, spread=0.5)
    as_grpo = dict(data, prox_logp=data["behavior_logp"])
    loss, grad, _ = run("decoupled_ppo", as_grpo)
    grpo_loss, grpo_grad, _ = run("grpo", data)
    assert loss == pytest.approx(grpo_loss, rel=1e-12)
    np.testing.assert_allclose(grad, grpo_grad, rtol=1e-12, atol=1e-15)
    # π_prox = π_θ: u = 1, no clip, gradient −w·A with w = π_θ/π_behavior = r: GRPO without a trust region
    current = dict(data, prox_logp=data["logp"])
    loss, grad, out = run("decoupled_ppo", current)
    free_loss, free_grad, _ = run("grpo", data, eps_low="inf", eps_high="inf")
    assert loss == pytest.approx(free_loss, rel=1e-12)
    np.testing.assert_allclose(grad, free_grad, rtol=1e-12, atol=1e-15)
    assert float(out.metrics["clip_frac"]) == 0.0


def test_decoupled_ppo_refuses_a_batch_without_prox_logp() -> None:
    fields = {k: tensor(v) for k, v in random_batch(0).items()}
    with pytest.raises(ValueError, match="needs TokenBatch.prox_logp"):
        get_objective("decoupled_ppo")(TokenBatch(**fields))


def test_grpo_ignores_prox_logp() -> None:
    data = random_batch(2)
    loss, grad, _ = run("grpo", data)
    with_prox = dict(data, prox_logp=data["behavior_logp"] + 0.3)
    assert run("grpo", with_prox)[0] == loss
    np.testing.assert_array_equal(run("grpo", with_prox)[1], grad)


def test_decoupled_ppo_state_round_trips_and_refuses_other_state() -> None:
    objective = get_objective("decoupled_ppo")
    objective.keep_proximal(3, torch.zeros(2, 4))
    clone = get_objective("decoupled_ppo")
    clone.load_state_dict(objective.state_dict())
    assert list(clone.state_dict()["proximal"]) == [3] and torch.equal(clone.kept_proximal(3), torch.zeros(2, 4))
    clone.release_proximal([3])
    assert clone.kept_proximal(3) is None and clone.state_dict() == {"proximal": {}}
    with pytest.raises(ValueError, match="state must be"):
        clone.load_state_dict({"other": 1})


def test_cispo_threshold_two_tenths_caps_the_weight_at_1_2() -> None:
    """CISPO at the M2PO paper's threshold 0.2 (eps_high = 0.2): ℓ = −sg(min(r, 1.2))·A·log π, no floor."""
    ratios = np.array([[0.3, 1.0, 1.19, 1.5, 4.0]])
    advantages = np.array([[1.0, -1.0, 2.0, 1.0, -0.5]])
    behavior = np.full_like(ratios, -1.5)
    data = batch_data(behavior + np.log(ratios), behavior, advantages, np.ones_like(ratios))
    loss, grad, out = run("cispo", data, eps_high=0.2)
    weight = np.minimum(ratios, 1.2)
    want_loss, want_grad = expected(-weight * advantages * data["logp"], -weight * advantages, data["mask"],
                                    "token-mean")
    assert loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12)
    assert float(out.metrics["clip_frac"]) == pytest.approx(2 / 5)
