"""Bandit world: rewards, exact return and the exact expected gradient against hand-derived formulas (NumPy)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from offpolicylab.objectives import get_objective
from offpolicylab.policies import TabularSoftmaxPolicy, make_policy
from offpolicylab.worlds import make_world
from offpolicylab.worlds.bandits import SoftmaxBandit, three_arm_pitfall

R = np.array([0.0, 0.8, 1.0])
PI_B = np.array([0.3, 0.6, 0.1])


def _theta_policy(theta: np.ndarray) -> TabularSoftmaxPolicy:
    return TabularSoftmaxPolicy(1, len(theta), 1, context="none", init_logits=torch.tensor(theta, dtype=torch.float32))


def _softmax(theta: np.ndarray) -> np.ndarray:
    e = np.exp(theta - theta.max())
    return e / e.sum()


def test_pitfall_preset_and_default_policy_is_behaviour():
    world = three_arm_pitfall()
    policy = make_policy("tabular", world)
    np.testing.assert_allclose(policy.bandit_probs().numpy(), PI_B, atol=1e-6)
    assert world.exact_return(policy) == pytest.approx(float(PI_B @ R), abs=1e-6)  # 0.58
    assert world.optimal_return() == pytest.approx(1.0)


def test_rewards_fixed_and_bernoulli():
    world = SoftmaxBandit([0.0, 0.8, 1.0])
    arms = torch.tensor([[2], [0], [1]])
    np.testing.assert_allclose(world.reward(torch.zeros(3, dtype=torch.long), arms, torch.ones(3, 1)).numpy(),
                               [1.0, 0.0, 0.8], atol=1e-7)
    bern = SoftmaxBandit([0.25, 0.75], bernoulli=True)
    g = torch.Generator().manual_seed(0)
    arms = torch.tensor([[1]] * 4000)
    draws = bern.reward(torch.zeros(4000, dtype=torch.long), arms, torch.ones(4000, 1), generator=g)
    assert set(draws.unique().tolist()) <= {0.0, 1.0}
    assert float(draws.mean()) == pytest.approx(0.75, abs=0.03)


def test_exact_return_matches_monte_carlo():
    world = SoftmaxBandit([0.2, 0.5, 0.9, 0.1])
    policy = _theta_policy(np.array([0.3, -0.2, 0.7, 0.0]))
    g = torch.Generator().manual_seed(1)
    rollout = policy.sample(world.sample_prompts(1), 20000, 1.0, g)
    mc = float(world.reward(rollout.prompt_index, rollout.response_ids, rollout.response_mask).mean())
    exact = world.exact_return(policy)
    assert exact == pytest.approx(float(_softmax(np.array([0.3, -0.2, 0.7, 0.0])) @ [0.2, 0.5, 0.9, 0.1]), abs=1e-6)
    assert mc == pytest.approx(exact, abs=0.01)  # std of the MC mean ≈ 0.002


@pytest.mark.parametrize("theta", [np.zeros(3), np.array([0.5, -1.0, 0.2])])
def test_exact_gradient_reinforce_matches_hand_formula(theta):
    """∇_θj E_b[−A log π_θ(a)] = −Σ_a π_b(a)(r_a − r̄)(1[a=j] − π_θ(j)),  r̄ = Σ π_b r."""
    world = three_arm_pitfall()
    grad = world.exact_gradient(_theta_policy(theta), get_objective("reinforce"))
    pi = _softmax(theta)
    adv = R - PI_B @ R
    expected = -np.array([np.sum(PI_B * adv * ((np.arange(3) == j) - pi[j])) for j in range(3)])
    np.testing.assert_allclose(grad.numpy(), expected, atol=1e-6)


def test_exact_gradient_no_trust_region_is_on_policy_gradient():
    """GRPO with ε = ∞: ℓ = −A π_θ(a)/π_b(a), so E_b[∇ℓ] = −Σ_a π_θ(a) A_a (1[a=j] − π_θ(j))."""
    theta = np.array([0.1, 0.4, -0.3])
    world = three_arm_pitfall()
    grad = world.exact_gradient(_theta_policy(theta), get_objective("grpo", eps_low=float("inf"), eps_high=float("inf")))
    pi = _softmax(theta)
    adv = R - PI_B @ R
    expected = -np.array([np.sum(pi * adv * ((np.arange(3) == j) - pi[j])) for j in range(3)])
    np.testing.assert_allclose(grad.numpy(), expected, atol=1e-6)


def test_exact_gradient_std_normalised_and_custom_behaviour():
    theta = np.array([0.2, 0.0, -0.1])
    probs = np.array([0.5, 0.25, 0.25])
    world = three_arm_pitfall()
    grad = world.exact_gradient(_theta_policy(theta), get_objective("reinforce"), probs, normalize_std=True)
    pi = _softmax(theta)
    adv = R - probs @ R
    adv = adv / (np.sqrt(probs @ adv ** 2) + 1e-6)
    expected = -np.array([np.sum(probs * adv * ((np.arange(3) == j) - pi[j])) for j in range(3)])
    np.testing.assert_allclose(grad.numpy(), expected, atol=1e-6)


def test_reinforce_on_fixed_pitfall_data_prefers_the_08_arm():
    """Ascending the exact NoIS gradient on π_b data concentrates on arm 1 (r = 0.8), the REC pitfall."""
    world = three_arm_pitfall()
    policy = make_policy("tabular", world, init="uniform")
    objective = get_objective("reinforce")
    for _ in range(300):
        grad = world.exact_gradient(policy, objective)
        with torch.no_grad():
            policy.logits.view(-1).sub_(1.0 * grad)
    assert float(policy.bandit_probs()[1]) > 0.9


def test_bandit_factory_and_bad_input():
    world = make_world("bandit", rewards="0,0.5,1", behavior_probs="0.2,0.3,0.5")
    assert world.vocab_size == 3 and world.behavior_probs is not None
    assert make_world("bandit", num_arms="4", seed="3").vocab_size == 4
    with pytest.raises(ValueError, match="valid"):
        make_world("bandit", arms=3)
    with pytest.raises(ValueError, match="valid"):
        make_world("nope")
    with pytest.raises(ValueError, match="summing to 1"):
        make_world("bandit", rewards="0,1", behavior_probs="0.5,0.6")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        SoftmaxBandit([0.0, 2.0], bernoulli=True)
    with pytest.raises(ValueError, match="no behavior_probs"):
        SoftmaxBandit([0.0, 1.0]).exact_gradient(_theta_policy(np.zeros(2)), get_objective("reinforce"))
