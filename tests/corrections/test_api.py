"""The corrections contract: shapes, padding, errors naming the valid names, specs and configs."""

from __future__ import annotations

import doctest

import pytest
import torch

from offpolicylab import corrections
from tests.corrections.fixtures import FIXTURES


def test_the_module_example() -> None:
    assert doctest.testmod(corrections).failed == 0


@pytest.mark.parametrize("engine", corrections.ENGINES)
@pytest.mark.parametrize("name", FIXTURES)
def test_every_engine_keeps_the_contract(engine, name) -> None:
    """Defaults of every engine on every fixture: [B, T] outputs, 0 weights and keep ⊆ mask on padding, weights
    finite and ≥ 0 on the response (the fixtures' response tokens are finite)."""
    logp, sampler, mask, advantages = FIXTURES[name]()
    weights, keep = corrections.apply(engine, logp, sampler, mask, advantages=advantages)
    assert weights.shape == keep.shape == mask.shape and keep.dtype == mask.dtype
    assert torch.all(weights[mask == 0] == 0) and torch.all(keep <= mask)
    assert torch.isfinite(weights).all() and (weights >= 0).all()


def test_unknown_engine_and_parameter_name_the_valid_ones() -> None:
    logp, sampler, mask, _ = FIXTURES["near_one"]()
    with pytest.raises(ValueError, match="valid: verl, trl, openrlhf, slime, skyrl, areal"):
        corrections.apply("deepspeed", logp, sampler, mask)
    with pytest.raises(ValueError, match="no parameter rollout_iss; valid: rollout_is, rollout_is_threshold"):
        corrections.apply("verl", logp, sampler, mask, rollout_iss="token")
    with pytest.raises(ValueError, match="tis_ratio_type"):
        corrections.apply("skyrl", logp, sampler, mask, tis_ratio_type="geometric")
    with pytest.raises(ValueError, match="advantages"):
        corrections.apply("trl", logp, sampler, mask, off_policy_mask_threshold=0.5)
    with pytest.raises(ValueError, match="same parameter"):
        corrections.apply("openrlhf", logp, sampler, mask, is_correction_type="tis", vllm_is_correction_type="tis")
    with pytest.raises(ValueError, match="shape"):
        corrections.apply("trl", logp, sampler[:, :-1], mask)


def test_specs_and_configs() -> None:
    specs = corrections.parse_specs("verl:rollout_is=token:rollout_rs=token_k1,seq_mean_k3:"
                                    "rollout_rs_threshold=0.5_2.0,0.01,trl,skyrl:tis_ratio_type=token")
    assert [s.engine for s in specs] == ["verl", "trl", "skyrl"]
    assert specs[0].params == {"rollout_is": "token", "rollout_rs": "token_k1,seq_mean_k3",
                               "rollout_rs_threshold": "0.5_2.0,0.01"}
    assert corrections.parse_spec(specs[0].label()) == specs[0]
    config = corrections.Correction.from_config({"engine": "verl", "rollout_is": "sequence",
                                                 "rollout_is_threshold": 2.0})
    logp, sampler, mask, _ = FIXTURES["near_one"]()
    from_string = corrections.Correction.from_config("verl:rollout_is=sequence:rollout_is_threshold=2.0")
    for a, b in zip(config(logp, sampler, mask), from_string(logp, sampler, mask), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="engine"):
        corrections.Correction.from_config({"rollout_is": "sequence"})
    with pytest.raises(ValueError, match="no parameter"):
        corrections.parse_spec("trl:cap=3")
