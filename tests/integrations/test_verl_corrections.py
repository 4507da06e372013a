"""Our ``verl`` correction against verl's own ``compute_rollout_correction_and_rejection_mask`` on the shared
fixtures (``tests/corrections/fixtures.py``).

verl pins packages the main environment does not take, so this runs in CI's verl environment (``.ci/run``); the
main run skips it (``pytest.importorskip``) when verl is not importable.

verl lets padding NaN reach its IS weights (``exp(clip(NaN))·0 = NaN``); ours are 0 there by contract.  So on the
raw fixtures the weights are compared on response tokens and the masks everywhere, and on the fixtures with 0 on
padding (:func:`sanitised`) everything is compared.
"""

from __future__ import annotations

import pytest
import torch

from offpolicylab import corrections
from tests.corrections.fixtures import FIXTURES, sanitised

helper = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper")

IS_CONFIGS = [
    dict(rollout_is=None),
    dict(rollout_is="token", rollout_is_threshold=2.0),
    dict(rollout_is="token", rollout_is_threshold="0.5_2.0"),
    dict(rollout_is="token", rollout_is_threshold=2.0, rollout_is_batch_normalize=True),
    dict(rollout_is="sequence", rollout_is_threshold=2.0),
    dict(rollout_is="sequence", rollout_is_threshold="0.5_5.0"),
    dict(rollout_is="sequence", rollout_is_threshold=5.0, rollout_is_batch_normalize=True),
]
RS_CONFIGS = [
    dict(rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0"),
    dict(rollout_rs="token_k2", rollout_rs_threshold=0.02),
    dict(rollout_rs="token_k3", rollout_rs_threshold="0.02"),
    dict(rollout_rs="seq_sum_k1", rollout_rs_threshold="0.5_2.0"),
    dict(rollout_rs="seq_sum_k2", rollout_rs_threshold=2.0),
    dict(rollout_rs="seq_sum_k3", rollout_rs_threshold=2.0),
    dict(rollout_rs="seq_mean_k1", rollout_rs_threshold=1.5),
    dict(rollout_rs="seq_mean_k2", rollout_rs_threshold=1e-4),
    dict(rollout_rs="seq_mean_k3", rollout_rs_threshold=1e-4),
    dict(rollout_rs="seq_max_k2", rollout_rs_threshold=0.5),
    dict(rollout_rs="seq_max_k3", rollout_rs_threshold=0.5),
    dict(rollout_rs="token_k1,seq_mean_k3", rollout_rs_threshold="0.5_2.0,1e-4"),
    dict(rollout_is="sequence", rollout_is_threshold=2.0, rollout_rs="seq_max_k2", rollout_rs_threshold=0.1),
]


def run_verl(logp, sampler, mask, config):
    options = dict(rollout_is=None, rollout_is_threshold=2.0) | config
    proto, keep, _ = helper.compute_rollout_correction_and_rejection_mask(
        old_log_prob=logp, rollout_log_prob=sampler, response_mask=mask, **options)
    weights = mask if proto is None else proto.batch["rollout_is_weights"]
    return weights, keep


def exact(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True, check_dtype=False)


@pytest.mark.parametrize("name", FIXTURES)
@pytest.mark.parametrize("config", IS_CONFIGS + RS_CONFIGS, ids=lambda c: "-".join(map(str, c.values())))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_matches_verl(name, config, dtype) -> None:
    fixture = FIXTURES[name](dtype)
    logp, sampler, mask, _ = fixture
    mask = mask.to(dtype)
    valid = mask.bool()
    ours = corrections.apply("verl", logp, sampler, mask, **(dict(rollout_is=None) | config))
    theirs = run_verl(logp, sampler, mask, config)
    exact(ours[0][valid], theirs[0][valid])
    exact(ours[1], theirs[1])
    exact(ours[0][~valid], torch.zeros_like(ours[0][~valid]))
    clean_logp, clean_sampler, _, _ = sanitised(fixture)
    exact(ours[0], run_verl(clean_logp, clean_sampler, mask, config)[0])


def test_defaults_are_verls() -> None:
    from verl.trainer.config.algorithm import RolloutCorrectionConfig

    fields = RolloutCorrectionConfig.__dataclass_fields__
    for name, spec in corrections.ENGINES["verl"].params.items():
        assert fields[name].default == spec.default, name
    assert set(corrections.verl.RS_OPTIONS) == helper.SUPPORTED_ROLLOUT_RS_OPTIONS
    assert corrections.verl.SAFETY_BOUND == helper.SAFETY_BOUND


@pytest.mark.parametrize("config", [dict(rollout_rs="token_k4", rollout_rs_threshold=1.0),
                                    dict(rollout_rs="token_k2", rollout_rs_threshold="0.5_2.0"),
                                    dict(rollout_rs="token_k1,token_k2", rollout_rs_threshold="1,2,3"),
                                    dict(rollout_rs="token_k1", rollout_rs_threshold=None),
                                    dict(rollout_is="token", rollout_is_threshold="2.0_0.5")])
def test_verl_and_ours_refuse_the_same_configs(config) -> None:
    logp, sampler, mask, _ = FIXTURES["near_one"]()
    with pytest.raises(ValueError):
        run_verl(logp, sampler, mask, config)
    with pytest.raises(ValueError):
        corrections.apply("verl", logp, sampler, mask, **(dict(rollout_is=None) | config))
