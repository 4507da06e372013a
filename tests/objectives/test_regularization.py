"""The KL penalty and the entropy bonus of every objective (``kl_coef``, ``kl_estimator``, ``entropy_coef``).

Expected values come from Schulman's estimators written out in NumPy (J. Schulman, "Approximating KL divergence",
2020): with δ = log π_ref − log π_θ, k1 = −δ, k2 = δ²/2, k3 = e^δ − 1 − δ, and their derivatives w.r.t. log π_θ
1, −δ and 1 − e^δ; the entropy gradient of a softmax is ∂H/∂z_j = −p_j (log p_j + H).  The aggregation weights are
``_golden``'s (written from the aggregation formulas, not from our code).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from offpolicylab.objectives import AGG_MODES, TokenBatch, get_objective, list_objectives
from offpolicylab.objectives.regularization import kl_penalty
from tests.objectives._golden import agg_weights, random_batch, run


def numpy_kl(logp: np.ndarray, ref: np.ndarray, estimator: str) -> tuple[np.ndarray, np.ndarray]:
    """(k, ∂k/∂logp) per token from Schulman's formulas."""
    delta = ref - logp
    if estimator == "k1":
        return -delta, np.ones_like(delta)
    if estimator == "k2":
        return 0.5 * delta**2, -delta
    return np.exp(delta) - 1.0 - delta, 1.0 - np.exp(delta)


def with_reference(seed: int) -> dict:
    data = random_batch(seed=seed, spread=0.6)
    rng = np.random.default_rng(seed + 100)
    data["ref_logp"] = data["logp"] + rng.normal(0.0, 0.5, size=data["logp"].shape)
    return data


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("name", ["reinforce", "grpo", "m2po"])
def test_kl_penalty_adds_beta_times_the_estimator(name: str, agg: str, estimator: str) -> None:
    data = with_reference(seed=3)
    beta = 0.37
    base_loss, base_grad, _ = run(name, data, agg=agg)
    loss, grad, out = run(name, data, agg=agg, kl_coef=beta, kl_estimator=estimator)
    k, dk = numpy_kl(data["logp"], data["ref_logp"], estimator)
    weights = agg_weights(data["mask"], agg)
    want = float((weights * np.where(data["mask"] > 0, k, 0.0)).sum())
    assert loss - base_loss == pytest.approx(beta * want, rel=1e-10, abs=1e-13)
    np.testing.assert_allclose(grad - base_grad, beta * weights * np.where(data["mask"] > 0, dk, 0.0),
                               rtol=1e-9, atol=1e-13)
    assert float(out.metrics["kl_ref"]) == pytest.approx(want, rel=1e-10, abs=1e-13)


@pytest.mark.parametrize(("verl_name", "ours"), [("kl", "k1"), ("mse", "k2"), ("low_var_kl", "k3")])
def test_verl_names_are_the_same_estimators(verl_name: str, ours: str) -> None:
    logp, ref = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
    torch.testing.assert_close(kl_penalty(logp, ref, verl_name), kl_penalty(logp, ref, ours), rtol=0, atol=0)


def test_k1_and_k3_are_unbiased_and_k2_is_not() -> None:
    """E_{y~π}[k(y)] over a categorical π, summed exactly: KL(π‖π_ref) for k1 and k3 (Schulman's point), not k2."""
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(7))
    q = rng.dirichlet(np.ones(7))
    kl = float((p * np.log(p / q)).sum())
    logp, ref = torch.tensor(np.log(p)), torch.tensor(np.log(q))
    for estimator in ("k1", "k3"):
        assert float((torch.tensor(p) * kl_penalty(logp, ref, estimator)).sum()) == pytest.approx(kl, rel=1e-12)
    assert abs(float((torch.tensor(p) * kl_penalty(logp, ref, "k2")).sum()) - kl) > 1e-3


def test_zero_coefficients_leave_the_loss_bit_for_bit() -> None:
    data = with_reference(seed=5)
    plain = {k: v for k, v in data.items() if k != "ref_logp"}
    loss0, grad0, _ = run("grpo", plain)
    loss1, grad1, out = run("grpo", data, kl_coef=0.0, entropy_coef=0.0)
    assert loss0 == loss1
    np.testing.assert_array_equal(grad0, grad1)
    assert "kl_ref" in out.metrics  # the KL to the reference is reported whenever ref_logp is given


@pytest.mark.parametrize("agg", AGG_MODES)
def test_entropy_bonus_against_the_softmax_entropy_gradient(agg: str) -> None:
    rng = np.random.default_rng(1)
    logits_np = rng.normal(size=(3, 4, 5))
    tokens = rng.integers(0, 5, size=(3, 4))
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=np.float64)
    coef = 0.25

    def loss_and_grad(entropy_coef: float) -> tuple[float, np.ndarray]:
        logits = torch.tensor(logits_np, requires_grad=True)
        log_probs = torch.log_softmax(logits, -1)
        logp = log_probs.gather(-1, torch.tensor(tokens)[..., None]).squeeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        batch = TokenBatch(logp=logp, behavior_logp=logp.detach(), advantages=torch.tensor([1.0, -0.5, 0.2],
                           dtype=torch.float64), mask=torch.tensor(mask), entropy=entropy)
        out = get_objective("reinforce", agg=agg, entropy_coef=entropy_coef)(batch)
        out.loss.backward()
        return float(out.loss.detach()), logits.grad.numpy()

    loss0, grad0 = loss_and_grad(0.0)
    loss1, grad1 = loss_and_grad(coef)
    p = np.exp(logits_np) / np.exp(logits_np).sum(-1, keepdims=True)
    entropy = -(p * np.log(p)).sum(-1)
    weights = agg_weights(mask, agg)
    assert loss1 - loss0 == pytest.approx(-coef * float((weights * entropy).sum()), rel=1e-10)
    d_entropy = -p * (np.log(p) + entropy[..., None])  # ∂H/∂z
    np.testing.assert_allclose(grad1 - grad0, -coef * weights[..., None] * d_entropy, rtol=1e-9, atol=1e-14)


def test_padding_of_ref_logp_is_inert() -> None:
    data = with_reference(seed=7)
    padded = dict(data)
    padded["ref_logp"] = np.where(data["mask"] > 0, data["ref_logp"], np.inf)
    assert run("grpo", data, kl_coef=0.5)[0] == run("grpo", padded, kl_coef=0.5)[0]


def test_every_objective_takes_the_terms() -> None:
    for name in list_objectives():
        objective = get_objective(name, kl_coef=0.1, kl_estimator="low_var_kl", entropy_coef=0.01)
        assert (objective.kl_coef, objective.kl_estimator, objective.entropy_coef) == (0.1, "low_var_kl", 0.01)


def test_missing_inputs_are_refused() -> None:
    data = random_batch(seed=2, spread=0.3)
    with pytest.raises(ValueError, match="kl_coef=0.1 but the batch has no ref_logp"):
        run("grpo", data, kl_coef=0.1)
    with pytest.raises(ValueError, match="entropy is missing"):
        run("grpo", data, entropy_coef=0.1)
    with pytest.raises(ValueError, match="kl_estimator"):
        get_objective("grpo", kl_estimator="k4")
    with pytest.raises(ValueError, match="kl_coef=-1"):
        get_objective("grpo", kl_coef=-1)
