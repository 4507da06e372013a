"""Properties every registered objective must have (docs/design.md, "The objective contract"), parametrised over ``list_objectives()``:

(a) at ratio 1 with nothing masked, the gradient w.r.t. logp is REINFORCE's (on the objective's effective advantages);
(b) padded tokens change neither loss, gradient nor metrics, whatever they hold (huge, ±inf, nan);
(c) loss and gradient stay finite at log-ratios of ±50, for every aggregation mode;
(d) metrics are detached 0-dim tensors with the standard names, ``token_mask`` is [B, T]; state round-trips.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import Tensor

from offpolicylab.objectives import AGG_MODES, TokenBatch, get_objective, list_objectives
from offpolicylab.objectives.reward_weighted import red_drop_advantages

# Non-default configurations worth running through the same properties (only those whose objective is registered).
EXTRA_CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("grpo", {"eps_low": math.inf, "eps_high": math.inf}),
    ("grpo", {"dual_clip": 3.0}),
    ("rec", {"mask": "two_side", "importance_sampling": True}),
    ("rec", {"mask": "ring", "importance_sampling": True}),
    ("rec_gspo", {"importance_sampling": True}),
    ("topr", {"ratio_level": "token"}),
    ("m2po", {"variant": "cap"}),
    ("mu_grpo", {"nav_scope": "response"}),
    ("mu_grpo", {"nav_scope": "trigger"}),
    ("gppo", {"dual_clip": 3.0}),
    ("decoupled_ppo", {"behavior_cap": 2.0}),
]


def _configs() -> list[Any]:
    names = list_objectives()
    configs = [(name, {}) for name in names] + [(n, p) for n, p in EXTRA_CONFIGS if n in names]
    return [
        pytest.param(name, params, id=name + "".join(f"-{k}={v}" for k, v in params.items()))
        for name, params in configs
    ]


CONFIGS = _configs()

# Standard metric names (docs/design.md, "The objective contract"): every objective reports BASE_METRICS (entropy
# when given) and the names EXPECTED_METRICS lists for it; together they make up the full list.
BASE_METRICS = {
    "mask_frac",
    "ratio_mean",
    "ratio_max",
    "log_ratio_abs_mean",
    "m2",
    "ess",
    "kl_k1",
    "kl_k3",
    "entropy",
}
EXPECTED_METRICS: dict[str, set[str]] = {
    "grpo": {"clip_frac"},
    "rec": {"clip_frac"},
    "gspo": {"clip_frac"},
    "rec_gspo": {"clip_frac"},
    "cispo": {"clip_frac"},
    "mispo": {"accept_rate", "tok_accept_rate", "traj_bound"},
    "ac_mispo": {"accept_rate", "tok_accept_rate", "traj_bound"},
    "mu_grpo": {"clip_frac", "nav_frac"},
    "gppo": {"clip_frac"},
    "decoupled_ppo": {"clip_frac"},
}

GROUP_SIZE = 4
REWARDS = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.5]  # group 0 has surplus negatives (RED-Drop drops two)
LENGTHS = [5, 2, 7, 1, 4, 7, 3, 6]


def _mask(lengths: list[int], length: int) -> Tensor:
    return (torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]).to(torch.float64)


def _batch(log_ratio_scale: float = 0.0, seed: int = 0, entropy: bool = True) -> dict[str, Tensor]:
    """Fields of a batch: 2 groups of 4, group-relative advantages A = r − r̄, varied lengths, logp < 0; the proximal
    policy halfway between behaviour and current policy in log space (all three equal at ``log_ratio_scale`` 0)."""
    gen = torch.Generator().manual_seed(seed)
    batch, length = len(REWARDS), max(LENGTHS)
    rewards = torch.tensor(REWARDS, dtype=torch.float64)
    group_ids = torch.arange(batch) // GROUP_SIZE
    advantages = rewards - rewards.view(-1, GROUP_SIZE).mean(dim=1).repeat_interleave(GROUP_SIZE)
    behavior_logp = -torch.rand(batch, length, generator=gen, dtype=torch.float64) * 3.0 - 0.05
    logp = behavior_logp + log_ratio_scale * torch.randn(batch, length, generator=gen, dtype=torch.float64)
    fields = {
        "logp": logp,
        "behavior_logp": behavior_logp,
        "advantages": advantages[:, None].expand(batch, length).clone(),
        "mask": _mask(LENGTHS, length),
        "rewards": rewards,
        "group_ids": group_ids,
        "sampler_logp": behavior_logp + 0.05 * torch.randn(batch, length, generator=gen, dtype=torch.float64),
        "prox_logp": behavior_logp + 0.5 * (logp - behavior_logp),
    }
    if entropy:
        fields["entropy"] = torch.rand(batch, length, generator=gen, dtype=torch.float64) * 2.0
    return fields


def _run(obj: Any, fields: dict[str, Tensor]) -> tuple[Any, Tensor]:
    """Loss output and ∂loss/∂logp for a batch built from ``fields`` (logp becomes a fresh leaf)."""
    logp = fields["logp"].detach().clone().requires_grad_(True)
    batch = TokenBatch(**{**fields, "logp": logp})
    if getattr(obj, "stateful", False):
        obj.update(batch)
    out = obj(batch)
    (grad,) = torch.autograd.grad(out.loss, logp)
    return out, grad


def effective_advantages(name: str, obj: Any, fields: dict[str, Tensor]) -> Tensor:
    """The advantage A' whose REINFORCE gradient an objective follows at ratio 1, from each objective's documented
    formula: AsymRE A' = A + β; RED-Weight A' = exp(A/T)·A; RED-Drop A' from ``red_drop_advantages`` (dropped
    sequences get 0).  Every other objective follows A itself."""
    advantages = fields["advantages"]
    if name == "asymre":
        return advantages + obj.beta
    if name == "red_weight":
        return torch.exp(advantages / obj.temperature) * advantages
    if name == "red_drop":
        dropped_aware, _ = red_drop_advantages(fields["rewards"], fields["group_ids"])
        return dropped_aware.to(advantages.dtype)[:, None].expand_as(advantages)
    return advantages


# --------------------------------------------------------------------------------------------------- (a) ratio 1
@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize(("name", "params"), CONFIGS)
def test_gradient_at_ratio_one_equals_reinforce(name: str, params: dict[str, Any], agg: str) -> None:
    fields = _batch(log_ratio_scale=0.0)
    obj = get_objective(name, agg=agg, **params)
    out, grad = _run(obj, fields)
    reference_fields = {**fields, "advantages": effective_advantages(name, obj, fields)}
    if name == "red_drop":  # eq. 10 averages over the kept sequences only
        _, keep = red_drop_advantages(fields["rewards"], fields["group_ids"])
        reference_fields["mask"] = fields["mask"] * keep[:, None].to(fields["mask"].dtype)
    _, expected = _run(get_objective("reinforce", agg=agg), reference_fields)
    torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-12)
    assert expected.abs().sum() > 0  # the comparison is not vacuous
    if name != "red_drop":  # RED-Drop removes whole sequences by design; nothing else may mask at ratio 1
        torch.testing.assert_close(out.token_mask, fields["mask"].to(out.token_mask.dtype), rtol=0, atol=0)


def test_red_drop_really_drops_in_the_ratio_one_batch() -> None:
    """Guards the test above: the batch has a group with surplus negatives, so RED-Drop's A' differs from A."""
    fields = _batch()
    obj = get_objective("red_drop")
    assert not torch.allclose(effective_advantages("red_drop", obj, fields), fields["advantages"])


# ------------------------------------------------------------------------------------------------- (b) padding
def _with_padding(fields: dict[str, Tensor], kind: str, seed: int) -> dict[str, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    pad = fields["mask"] == 0
    out = dict(fields)
    for key in ("logp", "behavior_logp", "advantages", "entropy", "sampler_logp", "prox_logp"):
        value = fields[key].clone()
        shape = value.shape
        if kind == "huge":
            garbage = torch.randn(shape, generator=gen, dtype=value.dtype) * 1e30
        else:  # a mix of +inf, -inf and nan
            choice = torch.randint(0, 3, shape, generator=gen)
            garbage = (
                torch.stack(
                    [torch.full(shape, math.inf), torch.full(shape, -math.inf), torch.full(shape, math.nan)]
                )
                .to(value.dtype)
                .gather(0, choice[None])[0]
            )
        value[pad] = garbage[pad]
        out[key] = value
    return out


def _metrics_equal(a: dict[str, Tensor], b: dict[str, Tensor]) -> None:
    assert set(a) == set(b)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-12, atol=0, equal_nan=True, msg=f"metric {key}")


@pytest.mark.parametrize("tis_cap", [None, 2.0])
@pytest.mark.parametrize(("name", "params"), CONFIGS)
def test_padding_changes_neither_loss_nor_gradient(
    name: str, params: dict[str, Any], tis_cap: float | None
) -> None:
    clean = _batch(log_ratio_scale=0.4, seed=1)
    results = []
    for variant in (clean, _with_padding(clean, "huge", 2), _with_padding(clean, "nonfinite", 3)):
        obj = get_objective(name, tis_cap=tis_cap, **params)
        results.append(_run(obj, variant))
    (out0, grad0) = results[0]
    assert torch.isfinite(out0.loss) and torch.isfinite(grad0).all()
    pad = clean["mask"] == 0
    for out, grad in results[1:]:
        torch.testing.assert_close(out.loss, out0.loss, rtol=1e-12, atol=0)
        torch.testing.assert_close(grad, grad0, rtol=1e-12, atol=0)
        assert (grad[pad] == 0).all()
        torch.testing.assert_close(out.token_mask, out0.token_mask, rtol=0, atol=0)
        _metrics_equal(out.metrics, out0.metrics)


# ------------------------------------------------------------------------------------------------ (c) extremes
@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize(("name", "params"), CONFIGS)
def test_finite_at_log_ratios_of_plus_minus_50(name: str, params: dict[str, Any], agg: str) -> None:
    fields = {
        k: (v.to(torch.float32) if torch.is_floating_point(v) else v) for k, v in _batch(seed=4).items()
    }
    shape = fields["logp"].shape
    pattern = torch.tensor(
        [50.0, -50.0, 0.0, 50.0, -50.0, 0.3, -0.3]
    )  # both signs in every sequence and in each A
    delta = pattern.roll(1).repeat(shape[0], 1)[:, : shape[1]]
    delta[1::2] = delta[1::2].flip(-1)
    behavior = torch.where(delta > 0, torch.full(shape, -60.0), torch.full(shape, -5.0))
    fields.update(behavior_logp=behavior, logp=behavior + delta, sampler_logp=behavior - 1.0,
                  prox_logp=behavior + 0.5 * delta)
    for tis_cap in (None, 2.0):
        obj = get_objective(name, agg=agg, tis_cap=tis_cap, **params)
        out, grad = _run(obj, fields)
        assert torch.isfinite(out.loss), f"loss {out.loss}"
        assert torch.isfinite(grad).all(), f"gradient has non-finite entries: {grad}"
        assert torch.isfinite(out.token_mask).all()


# ------------------------------------------------------------------------------------------- (d) metrics, state
@pytest.mark.parametrize(("name", "params"), CONFIGS)
def test_metrics_are_detached_standard_and_token_mask_is_b_by_t(name: str, params: dict[str, Any]) -> None:
    fields = _batch(log_ratio_scale=0.3, seed=5)
    obj = get_objective(name, **params)
    out, _ = _run(obj, fields)
    assert out.loss.dim() == 0 and out.loss.requires_grad
    for key, value in out.metrics.items():
        assert isinstance(value, Tensor), f"metric {key} is {type(value).__name__}, not a tensor"
        assert not value.requires_grad and value.grad_fn is None, f"metric {key} is not detached"
        assert value.dim() == 0, f"metric {key} has shape {tuple(value.shape)}, want a scalar"
    missing = (BASE_METRICS | EXPECTED_METRICS.get(name, set())) - set(out.metrics)
    if name == "m2po" and params.get("variant") == "cap":
        missing |= {"clip_frac"} - set(out.metrics)
    assert not missing, f"{name} lacks standard metrics {sorted(missing)}"
    mask = out.token_mask
    assert mask is not None and tuple(mask.shape) == tuple(fields["mask"].shape)
    assert not mask.requires_grad
    assert ((mask == 0) | (mask == 1)).all() and (mask[fields["mask"] == 0] == 0).all()
    removed = 1.0 - (mask * fields["mask"]).sum() / fields["mask"].sum()
    torch.testing.assert_close(out.metrics["mask_frac"], removed.to(out.metrics["mask_frac"].dtype))


@pytest.mark.parametrize(("name", "params"), CONFIGS)
def test_state_dict_round_trips(name: str, params: dict[str, Any]) -> None:
    obj = get_objective(name, **params)
    for seed in range(3):  # a few optimizer updates on drifting data
        batch = TokenBatch(**_batch(log_ratio_scale=0.01 * (seed + 1), seed=seed))
        obj.update(batch)
    state = obj.state_dict()
    clone = get_objective(name, **params)
    clone.load_state_dict(state)
    assert clone.state_dict() == state
    probe = TokenBatch(**_batch(log_ratio_scale=0.005, seed=9))
    a, b = obj(probe), clone(probe)
    torch.testing.assert_close(a.loss, b.loss, rtol=0, atol=0)
    _metrics_equal(a.metrics, b.metrics)
    obj.update(probe)
    clone.update(probe)
    assert clone.state_dict() == obj.state_dict()
    if getattr(obj, "stateful", False):
        assert state != get_objective(name, **params).state_dict(), "updates did not change the state"


def test_every_design_objective_is_registered() -> None:
    design = {
        "reinforce",
        "grpo",
        "rec",
        "gspo",
        "rec_gspo",
        "opmd",
        "asymre",
        "red_drop",
        "red_weight",
        "cispo",
        "topr",
        "m2po",
        "mispo",
        "ac_mispo",
        "p3o",
        "mu_grpo",
        "gppo",
        "decoupled_ppo",
    }
    assert design <= set(list_objectives()), f"missing: {sorted(design - set(list_objectives()))}"


# ------------------------------------------------------------------------------ documented values from the CLI
def test_every_documented_choice_is_accepted_from_the_command_line() -> None:
    """Each value a string-choice parameter lists (``nav_scope=none`` included) survives the CLI's ``k=v`` parsing
    and builds the objective / policy with exactly that value; optional parameters read ``none`` as unset."""
    from offpolicylab.config import parse_assignments
    from offpolicylab.policies import POLICIES
    from offpolicylab.registry import Param
    from offpolicylab.worlds import WORLDS

    specs: list[tuple[str, str, Param]] = [(n, k, p) for n in list_objectives()
                                           for k, p in get_objective(n).all_params().items()]
    specs += [(f"{registry.kind} {name}", k, p) for registry in (POLICIES, WORLDS) for name in registry.names()
              for k, p in registry.params(name).items()]
    checked = 0
    for owner, key, spec in specs:
        for choice in spec.choices or ():
            value = parse_assignments([f"{key}={choice}"], "--param")[key]
            assert spec.validate(key, value) == choice, (owner, key, choice)
            checked += 1
        if spec.optional:
            assert spec.validate(key, parse_assignments([f"{key}=none"], "--param")[key]) is None
    assert checked > 10
    assert get_objective("mu_grpo", **parse_assignments(["nav_scope=none"], "--param")).nav_scope == "none"
