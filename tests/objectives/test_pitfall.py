"""The 3-arm pitfall of REC (Yao et al. 2025, arXiv:2509.24203) at the objective level.

A 3-arm softmax policy π_θ = softmax(θ) learns from FIXED behaviour data: π_b = [0.3, 0.6, 0.1], rewards
r = [0, 0.8, 1], advantage A_a = r_a − r̄ with r̄ = E_{π_b}[r] = 0.58, so A = [−0.58, 0.22, 0.42].
No sampling: the batch holds the three actions once each (T = 1) and the EXACT expectation over π_b is obtained by
weighting each action's advantage by 3·π_b(a) (``token-mean`` divides by 3), so the loss is Σ_a π_b(a)·ℓ_a.

REINFORCE fixed point, by hand.  L_RF(θ) = −Σ_a π_b(a)·A_a·log π_θ(a), and ∂ log π_θ(a)/∂θ_k = 1[a = k] − π_θ(k), so

    −∂L_RF/∂θ_k = π_b(k)·A_k − π_θ(k)·Σ_a π_b(a)·A_a = π_b(k)·A_k        (Σ_a π_b(a)·A_a = E_b[r] − r̄ = 0).

The ascent direction is the constant g = π_b ⊙ A = [−0.174, 0.132, 0.042], whatever θ is: θ_t = θ_0 + η·t·g.
It never vanishes, so there is no interior stationary point; the logit gap θ_1 − θ_2 grows by η·0.09 per step and
π_θ → e_1, the vertex of argmax_a π_b(a)·A_a = the 0.8 arm, not the best arm (1.0).  The "fixed point" of NoIS
REINFORCE on stale data is the arm the behaviour policy sampled most profitably, not the best one.

With the importance weight, L_IS(θ) = −Σ_a π_b(a)·A_a·π_θ(a)/π_b(a) = −(E_θ[r] − r̄): exactly the true objective,
so gradient ascent (GRPO without trust region, ε = inf) climbs to the 1.0 arm.
"""

from __future__ import annotations

import math

import torch

from offpolicylab.objectives import TokenBatch, get_objective

PI_B = torch.tensor([0.3, 0.6, 0.1], dtype=torch.float64)
REWARDS = torch.tensor([0.0, 0.8, 1.0], dtype=torch.float64)
ADVANTAGES = REWARDS - (PI_B * REWARDS).sum()


def _exact_batch(theta: torch.Tensor) -> TokenBatch:
    """The three actions once each, advantages weighted by 3·π_b(a): token-mean = exact E_{π_b}."""
    logp = torch.log_softmax(theta, dim=0)[:, None]
    return TokenBatch(
        logp=logp,
        behavior_logp=torch.log(PI_B)[:, None],
        advantages=(3.0 * PI_B * ADVANTAGES)[:, None],
        mask=torch.ones(3, 1, dtype=torch.float64),
    )


def _train(objective_name: str, steps: int, lr: float, **params: float) -> torch.Tensor:
    """Gradient ascent on θ (descent on the objective's loss), starting at π_θ = π_b; returns the final π_θ."""
    objective = get_objective(objective_name, **params)
    theta = torch.log(PI_B).clone().requires_grad_(True)
    for _ in range(steps):
        (grad,) = torch.autograd.grad(objective(_exact_batch(theta)).loss, theta)
        with torch.no_grad():
            theta -= lr * grad
    return torch.softmax(theta.detach(), dim=0)


def test_reinforce_gradient_is_the_constant_pi_b_times_a() -> None:
    expected_ascent = PI_B * ADVANTAGES
    torch.testing.assert_close(expected_ascent, torch.tensor([-0.174, 0.132, 0.042], dtype=torch.float64))
    gen = torch.Generator().manual_seed(0)
    objective = get_objective("reinforce")
    for _ in range(3):
        theta = torch.randn(3, generator=gen, dtype=torch.float64).requires_grad_(True)
        (grad,) = torch.autograd.grad(objective(_exact_batch(theta)).loss, theta)
        torch.testing.assert_close(-grad, expected_ascent, rtol=1e-12, atol=1e-14)


def test_unclipped_is_loss_is_minus_the_true_expected_reward() -> None:
    gen = torch.Generator().manual_seed(1)
    objective = get_objective("grpo", eps_low=math.inf, eps_high=math.inf)
    r_bar = (PI_B * REWARDS).sum()
    for _ in range(3):
        theta = torch.randn(3, generator=gen, dtype=torch.float64)
        pi_theta = torch.softmax(theta, dim=0)
        loss = objective(_exact_batch(theta)).loss
        torch.testing.assert_close(loss, -((pi_theta * REWARDS).sum() - r_bar), rtol=1e-12, atol=1e-14)


def test_reinforce_on_fixed_data_concentrates_on_the_0_8_arm() -> None:
    pi_final = _train("reinforce", steps=200, lr=1.0)
    assert pi_final[1] > 0.9, pi_final
    assert pi_final[2] < 0.05, pi_final
    expected_reward = (pi_final * REWARDS).sum()
    assert abs(expected_reward - 0.8) < 0.02  # stuck near 0.8 although 1.0 is reachable


def test_unclipped_importance_weighted_objective_reaches_the_1_0_arm() -> None:
    pi_final = _train("grpo", steps=300, lr=5.0, eps_low=math.inf, eps_high=math.inf)
    assert pi_final[2] > 0.9, pi_final
    assert (pi_final * REWARDS).sum() > 0.95
