"""Golden tests for the core of the objective layer: ``reinforce``, ``grpo`` (incl. dual clip, eps = inf and the
decoupled ``prox_logp`` form), ``TokenBatch`` validation, the aggregation modes, the ``tis_cap`` option and the
registry's errors.  Clip regions and weights are written out by hand; aggregation goes through ``_golden``'s
independent NumPy weights.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from offpolicylab.objectives import (
    AGG_MODES,
    OBJECTIVES,
    Objective,
    TokenBatch,
    aggregate,
    get_objective,
    list_objectives,
    objective_params,
    register,
)
from offpolicylab.objectives.policy_gradient import Reinforce
from tests.objectives._golden import batch_data, expected, random_batch, run, tensor

# --------------------------------------------------------------------------------------------------- reinforce


@pytest.mark.parametrize("agg", AGG_MODES)
def test_reinforce_golden(agg: str) -> None:
    data = random_batch(seed=0, spread=0.7)  # the ratio must not matter
    adv = data["advantages"][:, None]
    want_loss, want_grad = expected(-adv * data["logp"], -adv * np.ones_like(data["logp"]), data["mask"], agg)
    loss, grad, out = run("reinforce", data, agg=agg)
    assert loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-15)
    assert float(out.metrics["mask_frac"]) == 0.0


# -------------------------------------------------------------------------------------------------------- GRPO
RATIOS = np.array([0.5, 0.9, 1.1, 1.5])
GRPO_ADV = np.array([1.3, -1.3])
# hand-derived with eps_low = 0.2, eps_high = 0.28 (bounds 0.8, 1.28): (loss multiplier m so ℓ = −A·m,
# gradient multiplier g so ∂ℓ/∂logp = −A·g, clipped flags), rows A > 0 / A < 0
GRPO_CASES = {
    "clip": (
        {"eps_low": 0.2, "eps_high": 0.28},
        [[0.5, 0.9, 1.1, 1.28], [0.8, 0.9, 1.1, 1.5]],
        [[0.5, 0.9, 1.1, 0.0], [0.0, 0.9, 1.1, 1.5]],
        [[0, 0, 0, 1], [1, 0, 0, 0]],
    ),
    "dual_clip": (  # c = 1.4 caps the A < 0 branch at −A·1.4: r = 1.5 is capped, gradient 0
        {"eps_low": 0.2, "eps_high": 0.28, "dual_clip": 1.4},
        [[0.5, 0.9, 1.1, 1.28], [0.8, 0.9, 1.1, 1.4]],
        [[0.5, 0.9, 1.1, 0.0], [0.0, 0.9, 1.1, 0.0]],
        [[0, 0, 0, 1], [1, 0, 0, 1]],
    ),
    "no_trust_region": (  # eps = inf: ℓ = −A·r everywhere
        {"eps_low": math.inf, "eps_high": math.inf},
        [list(RATIOS), list(RATIOS)],
        [list(RATIOS), list(RATIOS)],
        [[0, 0, 0, 0], [0, 0, 0, 0]],
    ),
    "no_upper_clip": (  # eps_high = inf only: the A > 0, r = 1.5 token keeps its gradient
        {"eps_low": 0.2, "eps_high": math.inf},
        [[0.5, 0.9, 1.1, 1.5], [0.8, 0.9, 1.1, 1.5]],
        [[0.5, 0.9, 1.1, 1.5], [0.0, 0.9, 1.1, 1.5]],
        [[0, 0, 0, 0], [1, 0, 0, 0]],
    ),
}


def _grpo_batch() -> dict:
    logp = np.log(np.array([[0.2, 0.4, 0.6, 0.8], [0.3, 0.5, 0.7, 0.9]]))
    return batch_data(logp, logp - np.log(RATIOS)[None, :], GRPO_ADV, np.ones_like(logp))


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("case", sorted(GRPO_CASES))
def test_grpo_golden(case: str, agg: str) -> None:
    params, loss_mult, grad_mult, clipped = GRPO_CASES[case]
    data = _grpo_batch()
    adv = GRPO_ADV[:, None]
    want_loss, want_grad = expected(-adv * np.array(loss_mult), -adv * np.array(grad_mult), data["mask"], agg)
    loss, grad, out = run("grpo", data, agg=agg, **params)
    assert loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-15)
    assert float(out.metrics["clip_frac"]) == pytest.approx(np.mean(clipped))
    np.testing.assert_array_equal(out.token_mask.numpy(), 1.0 - np.array(clipped))


def test_decoupled_ppo_hand_values() -> None:
    """decoupled_ppo: ℓ = w·max(−A·r', −A·clip(r')), r' = π_θ/π_prox, w = π_prox/π_behavior (detached)."""
    data = _grpo_batch()
    prox_ratio = np.array([1.25, 0.9, 1.1, 0.7])  # π_prox / π_behavior per column
    data["prox_logp"] = data["behavior_logp"] + np.log(prox_ratio)[None, :]
    r_prime = RATIOS / prox_ratio  # [0.4, 1.0, 1.0, 2.142857]
    # hand: A > 0 → −A·min(r', clip(r')); column 3 clipped at 1.28.  A < 0 → −A·max(r', clip(r')); column 0 at 0.8.
    loss_mult = np.array([[0.4, 1.0, 1.0, 1.28], [0.8, 1.0, 1.0, r_prime[3]]])
    grad_mult = np.array([[0.4, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, r_prime[3]]])
    adv = GRPO_ADV[:, None]
    want_loss, want_grad = expected(-adv * loss_mult * prox_ratio, -adv * grad_mult * prox_ratio, data["mask"],
                                    "token-mean")
    loss, grad, _ = run("decoupled_ppo", data, eps_low=0.2, eps_high=0.28)
    assert loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("params", [{}, {"dual_clip": 3.0}, {"eps_low": math.inf, "eps_high": math.inf}])
def test_grpo_at_ratio_one_equals_reinforce(params: dict) -> None:
    data = random_batch(seed=1)
    data["behavior_logp"] = data["logp"].copy()
    _, grad, _ = run("grpo", data, **params)
    _, reinforce_grad, _ = run("reinforce", data)
    np.testing.assert_allclose(grad, reinforce_grad, rtol=1e-12, atol=1e-15)


def test_grpo_parameters_validated() -> None:
    with pytest.raises(ValueError, match=r"dual_clip.*\(1, inf\]"):
        get_objective("grpo", dual_clip=1.0)
    assert get_objective("grpo", dual_clip="none").dual_clip is None  # CLI spelling


# ------------------------------------------------------------------------------------------------- TokenBatch
def _fields(batch: int = 2, length: int = 3) -> dict:
    return {
        "logp": torch.zeros(batch, length, dtype=torch.float64),
        "behavior_logp": torch.zeros(batch, length, dtype=torch.float64),
        "advantages": torch.ones(batch, length, dtype=torch.float64),
        "mask": torch.ones(batch, length, dtype=torch.float64),
    }


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"logp": torch.zeros(3)}, r"logp must be a 2-D \[B, T\]"),
        ({"logp": torch.zeros(2, 3, dtype=torch.long)}, "logp must be floating point"),
        ({"behavior_logp": torch.zeros(2, 4)}, r"behavior_logp must have shape \[B, T\] = \[2, 3\]"),
        ({"advantages": torch.ones(2, 3, dtype=torch.long)}, "advantages must be floating point"),
        ({"advantages": torch.ones(3)}, "advantages must have shape"),
        ({"mask": torch.full((2, 3), 0.5)}, "mask must hold only 0 and 1"),
        ({"behavior_logp": None}, "behavior_logp is required"),
        ({"rewards": torch.ones(3)}, r"rewards must have shape \[B\] = \[2\]"),
        ({"rewards": torch.tensor([1.0, math.nan])}, "rewards holds non-finite"),
        ({"group_ids": torch.zeros(2, 1)}, "group_ids must have shape"),
        ({"sampler_logp": torch.zeros(2, 2)}, "sampler_logp must have shape"),
        ({"behavior_logp": torch.tensor([[0.0, math.nan, 0.0], [0.0, 0.0, 0.0]])}, "behavior_logp holds non-finite"),
        ({"advantages": torch.tensor([[0.0, 0.0, math.inf], [0.0, 0.0, 0.0]])}, "advantages holds non-finite"),
    ],
)
def test_token_batch_rejects_bad_input(change: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        TokenBatch(**{**_fields(), **change})


def test_token_batch_accepts_non_finite_padding_and_zeroes_it() -> None:
    fields = _fields()
    fields["mask"] = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    fields["behavior_logp"] = torch.tensor([[-1.0, -2.0, math.nan], [-1.0, math.inf, -math.inf]])
    batch = TokenBatch(**fields)
    assert torch.equal(batch.behavior_logp, torch.tensor([[-1.0, -2.0, 0.0], [-1.0, 0.0, 0.0]], dtype=torch.float64))
    assert torch.equal(batch.log_ratio[fields["mask"] == 0], torch.zeros(3, dtype=torch.float64))


def test_token_batch_broadcasts_sequence_advantages_and_detaches() -> None:
    behavior = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    batch = TokenBatch(**{**_fields(), "advantages": torch.tensor([0.5, -1.0], dtype=torch.float64),
                          "behavior_logp": behavior, "mask": torch.ones(2, 3, dtype=torch.bool)})
    assert torch.equal(batch.advantages, torch.tensor([[0.5] * 3, [-1.0] * 3], dtype=torch.float64))
    assert not batch.behavior_logp.requires_grad
    assert batch.mask.dtype == torch.float64  # a bool mask is converted to logp's dtype
    with pytest.raises(ValueError, match="rewards"):
        batch.replace(rewards=torch.ones(5))  # replace re-validates


# ------------------------------------------------------------------------------------------------ aggregation
AGG_LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, math.nan], [math.inf, 8.0, 9.0]], dtype=torch.float64)
AGG_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
AGG_GOLDEN = {  # by hand; the empty third row counts for seq-mean-token-sum only (its sum is 0)
    "token-mean": (1 + 2 + 3 + 4 + 5) / 5,
    "seq-mean-token-mean": ((1 + 2 + 3) / 3 + (4 + 5) / 2) / 2,
    "seq-mean-token-sum": ((1 + 2 + 3) + (4 + 5) + 0) / 3,
}


@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregation_golden(mode: str) -> None:
    assert float(aggregate(AGG_LOSS, AGG_MASK, mode)) == pytest.approx(AGG_GOLDEN[mode], rel=1e-15)


def test_aggregation_unknown_mode_lists_valid() -> None:
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-mean, seq-mean-token-sum"):
        aggregate(AGG_LOSS, AGG_MASK, "sum")
    with pytest.raises(ValueError, match="agg"):
        get_objective("reinforce", agg="sum")


# ----------------------------------------------------------------------------------------------------- tis_cap
@pytest.mark.parametrize("agg", AGG_MODES)
def test_tis_cap_golden(agg: str) -> None:
    """ℓ' = min(exp(behavior_logp − sampler_logp), C)·ℓ, weight detached (Yao et al. 2025, TIS)."""
    data = random_batch(seed=2)
    offsets = np.array([-1.0, -0.2, 0.0, 0.3, 1.2, 2.0])  # behavior − sampler per column
    data["sampler_logp"] = data["behavior_logp"] - offsets[None, :]
    cap = 2.0
    weight = np.broadcast_to(np.minimum(np.exp(offsets), cap), data["logp"].shape)  # e^1.2, e^2 capped at 2
    adv = data["advantages"][:, None]
    want_loss, want_grad = expected(-weight * adv * data["logp"], -weight * adv, data["mask"], agg)
    loss, grad, _ = run("reinforce", data, agg=agg, tis_cap=cap)
    assert loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-15)


def test_tis_cap_is_inert_without_sampler_logp_and_validated() -> None:
    data = random_batch(seed=3)
    assert run("reinforce", data, tis_cap=2.0)[0] == pytest.approx(run("reinforce", data)[0], rel=1e-15)
    for bad in (0.0, -1.0, "abc"):
        with pytest.raises(ValueError, match="tis_cap"):
            get_objective("grpo", tis_cap=bad)


# ---------------------------------------------------------------------------------------------------- registry
def test_registry_duplicate_name_raises_and_keeps_the_original() -> None:
    with pytest.raises(ValueError, match="'reinforce' is already registered by Reinforce"):

        @register("reinforce")
        class Impostor(Objective):  # noqa: F841
            pass

    assert OBJECTIVES.get("reinforce").builder is Reinforce


def test_registry_unknown_name_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown objective 'ppo'; valid: reinforce, grpo, rec"):
        get_objective("ppo")
    with pytest.raises(ValueError, match="valid: reinforce"):
        objective_params("ppo")


def test_registry_bad_parameter_names_parameter_and_range() -> None:
    with pytest.raises(ValueError, match=r"eps_low=-0.1 is out of range; valid: a float in \[0, inf\]"):
        get_objective("grpo", eps_low=-0.1)
    with pytest.raises(ValueError, match=r"has no parameter epsilon; valid: eps_low, eps_high, dual_clip, agg"):
        get_objective("grpo", epsilon=0.2)
    with pytest.raises(ValueError, match="eps_high='wide' is invalid"):
        get_objective("grpo", eps_high="wide")
    with pytest.raises(ValueError, match="eps_low=nan"):
        get_objective("grpo", eps_low=math.nan)


def test_registry_coerces_cli_strings() -> None:
    obj = get_objective("rec", eps_low="0.3", importance_sampling="true", mask="ring")
    assert (obj.eps_low, obj.importance_sampling, obj.mask) == (0.3, True, "ring")
    assert "agg" in objective_params("rec") and "tis_cap" in objective_params("rec")


def test_objectives_of_this_family_are_registered() -> None:
    names = set(list_objectives())
    want = {"reinforce", "grpo", "rec", "gspo", "rec_gspo", "opmd", "asymre", "red_drop", "red_weight", "cispo",
            "topr"}
    assert want <= names


def test_losses_are_differentiable_scalars_on_float32() -> None:
    data = random_batch(seed=4)
    batch = TokenBatch(
        logp=tensor(data["logp"], torch.float32).requires_grad_(True),
        behavior_logp=tensor(data["behavior_logp"], torch.float32),
        advantages=tensor(data["advantages"], torch.float32),
        mask=tensor(data["mask"], torch.float32),
    )
    for name in ("reinforce", "grpo"):
        out = get_objective(name)(batch)
        assert out.loss.dim() == 0 and out.loss.dtype == torch.float32 and out.loss.requires_grad
