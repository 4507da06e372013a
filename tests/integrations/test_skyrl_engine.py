"""Our ``skyrl`` correction and its loss aggregation against SkyRL's own code (PyPI ``skyrl==0.3.0``), on the shared
fixtures (``tests/corrections/fixtures.py``: 2048-token drift, ±40 log-ratios, top-p, NaN / inf padding, empty rows,
a 1e-3-nat mismatch) in float32 and float64.

Runs in the engine environment of ``.ci/run`` (SkyRL installed without its dependencies, which pin
``transformers<=5.8``; its package ``__init__`` needs Python ≥ 3.12, so the modules are imported past it:
``tests/integrations/engine_source.py``); skipped where SkyRL is not installed.

* weights and keep: ``off_policy_correction_utils.compute_off_policy_correction`` → (tis_ratio, loss_mask);
* the aggregated loss and its gradient: SkyRL's ``ppo_utils.ppo_policy_loss`` (ε-clipped PPO, the correction
  applied inside, ``reduce_loss``) over advantages divided as its trainer divides them
  (``apply_loss_reduction_to_advantages_minibatch``, ``token_mean``), against our ``grpo`` with ``correction: skyrl``
  and token-mean — the rejected tokens stay in the denominator.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from offpolicylab import corrections
from tests.corrections.fixtures import FIXTURES, loss_inputs, sanitised
from tests.integrations.engine_source import bare_module, installed
from tests.objectives._golden import run

installed("skyrl", "0.3.0")
omegaconf = importlib.import_module("omegaconf")  # in the engine environment: missing is an error
utils = bare_module("skyrl.backends.skyrl_train.utils.off_policy_correction_utils")
ppo = bare_module("skyrl.backends.skyrl_train.utils.ppo_utils")

UNSET = dict(tis_ratio_type=None, token_tis_ratio_clip_high=2.0, sequence_tis_ratio_clip_high=5.0,
             sequence_mask_metric=None, geo_mask_high=1.01, geo_mask_low=0.99, product_mask_high=2.0,
             product_mask_low=0.5, outlier_token_is_threshold_low=None, outlier_token_is_threshold_high=None,
             token_mask_is_threshold_low=None, token_mask_is_threshold_high=None)
CONFIGS = [
    dict(sequence_mask_metric="geometric"),  # the guide's recommendation
    dict(tis_ratio_type="token"),
    dict(tis_ratio_type="sequence"),
    dict(sequence_mask_metric="product"),
    dict(outlier_token_is_threshold_low=1e-4, outlier_token_is_threshold_high=100.0),
    dict(token_mask_is_threshold_low=0.5, token_mask_is_threshold_high=2.0),
    dict(tis_ratio_type="token", sequence_mask_metric="geometric", token_mask_is_threshold_low=0.5,
         token_mask_is_threshold_high=2.0),
    dict(tis_ratio_type="sequence", sequence_mask_metric="product", outlier_token_is_threshold_high=100.0),
]
DTYPES = [torch.float32, torch.float64]


def skyrl_config(config: dict) -> object:
    return omegaconf.OmegaConf.create(UNSET | config)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("name", FIXTURES)
def test_weights_and_keep_equal_skyrls(name: str, config: dict, dtype: torch.dtype) -> None:
    logp, sampler, mask, adv = sanitised(FIXTURES[name](dtype))
    mask = mask.to(dtype)
    tis, _, keep = utils.compute_off_policy_correction(logp, sampler, mask, skyrl_config(config))
    weights = torch.ones_like(logp) if tis is None else tis.expand_as(logp)
    ours_w, ours_keep = corrections.apply("skyrl", logp, sampler, mask, advantages=adv, **config)
    torch.testing.assert_close(ours_keep, keep, rtol=0, atol=0)
    torch.testing.assert_close(ours_w * ours_keep, (weights * keep).to(dtype), rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", CONFIGS[:3] + CONFIGS[5:6], ids=lambda c: ",".join(c))
@pytest.mark.parametrize("name", ["long", "extreme", "empty_rows", "near_one"])
def test_aggregated_loss_equals_skyrls(name: str, config: dict, dtype: torch.dtype) -> None:
    old, sampler, mask, adv, current, token_adv = loss_inputs(name, dtype, 7)
    divided = ppo.apply_loss_reduction_to_advantages_minibatch(token_adv, mask, "token_mean", len(mask),
                                                               old.shape[1])
    algo = omegaconf.OmegaConf.create(dict(policy_loss_type="regular", eps_clip_low=0.2, eps_clip_high=0.2,
                                           clip_ratio_c=3.0, off_policy_correction=UNSET | config))
    logp = current.clone().requires_grad_(True)
    loss, _ = ppo.ppo_policy_loss(logp, old, divided, algo, loss_mask=mask, rollout_logprobs=sampler)
    loss.backward()
    data = {"logp": current, "behavior_logp": old, "sampler_logp": sampler, "advantages": adv.to(dtype),
            "mask": mask}
    ours, grad, _ = run("grpo", data, dtype=dtype, agg="token-mean", eps_low=0.2, eps_high=0.2,
                        correction={"engine": "skyrl"} | config)
    tolerance = 1e-5  # SkyRL exponentiates its PPO and IS ratios in float32 (safe_exp_delta) at either dtype
    assert ours == pytest.approx(float(loss.detach()), rel=tolerance, abs=tolerance)
    torch.testing.assert_close(torch.as_tensor(grad, dtype=torch.float64), logp.grad.to(torch.float64), rtol=tolerance,
                               atol=1e-9)
