"""Our ``areal`` correction and its loss aggregation against AReaL's own code (PyPI ``areal==1.0.4``), on the shared
fixtures (``tests/corrections/fixtures.py``) in float32 and float64.

Runs in the engine environment of ``.ci/run`` (AReaL installed without its dependencies: it pins ``torch<2.11``
against this project's CPU torch 2.13, ``transformers<=5.3`` and a GPU serving stack; the few modules that
``areal.utils.functional`` imports are installed beside it, and it imports normally); skipped where AReaL is not
installed.

* weights and keep: ``functional.apply_rejection_sampling`` (π_prox = the trainer's log-probs, π_behave the
  sampler's) → (behave_imp_weight, loss_mask);
* the aggregated loss and its gradient: ``functional.ppo_actor_loss_fn`` (decoupled PPO with ``rejection_sampling``,
  its ``loss_mask_count`` taken before the rejection) against our ``grpo`` with ``correction: areal`` and token-mean.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from offpolicylab import corrections
from tests.corrections.fixtures import FIXTURES, sanitised
from tests.integrations.engine_source import installed
from tests.objectives._golden import run

installed("areal", "1.0.4")
# AReaL is installed (above): a module it cannot import is an error of the engine environment, not a skip
functional = importlib.import_module("areal.utils.functional.functional")
cli_args = importlib.import_module("areal.api.cli_args")

CONFIGS = [
    dict(),  # RejectionSamplingConfig's defaults: token mask of ratios above 5
    dict(lower=0.5, upper=2.0),
    dict(action="clamp", upper=2.0),
    dict(level="sequence", agg="mean", upper=1.05, lower=0.95),
    dict(level="sequence", agg="sum", upper=3.0),
    dict(level="sequence", agg="max", metric="kl_k2", upper=0.5),
    dict(metric="kl_k3", upper=0.02),
    dict(metric="kl_k1", lower=-0.2, upper=0.2),
    dict(level="sequence", action="clamp", upper=2.0, lower=0.5),
]
DTYPES = [torch.float32, torch.float64]


def areal_config(config: dict) -> object:
    return cli_args.RejectionSamplingConfig(**config)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
@pytest.mark.parametrize("name", FIXTURES)
def test_weights_and_keep_equal_areals(name: str, config: dict, dtype: torch.dtype) -> None:
    prox, behave, mask, adv = sanitised(FIXTURES[name](dtype))
    result = functional.apply_rejection_sampling(prox, behave, mask.bool(), None, areal_config(config))
    weights, keep = corrections.apply("areal", prox, behave, mask, advantages=adv, **config)
    torch.testing.assert_close(keep.bool(), result.loss_mask.bool(), rtol=0, atol=0)
    torch.testing.assert_close((weights * keep).to(torch.float64), result.behave_imp_weight.to(torch.float64),
                               rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", CONFIGS[:4], ids=lambda c: ",".join(c) or "default")
@pytest.mark.parametrize("name", ["long", "extreme", "empty_rows", "near_one"])
def test_aggregated_loss_equals_areals(name: str, config: dict, dtype: torch.dtype) -> None:
    prox, behave, mask, adv = sanitised(FIXTURES[name](dtype))
    gen = torch.Generator().manual_seed(8)
    current = (prox + 0.1 * torch.randn(prox.shape, generator=gen, dtype=torch.float64).to(dtype)) * mask
    token_adv = adv.to(dtype)[:, None].expand_as(prox) * mask
    logp = current.clone().requires_grad_(True)
    loss, _ = functional.ppo_actor_loss_fn(logp, prox, behave, token_adv, eps_clip=0.2, loss_mask=mask.bool(),
                                           rejection_sampling=areal_config(config))
    loss.backward()
    data = {"logp": current, "behavior_logp": prox, "sampler_logp": behave, "advantages": adv.to(dtype),
            "mask": mask.to(dtype)}
    ours, grad, _ = run("grpo", data, dtype=dtype, agg="token-mean", eps_low=0.2, eps_high=0.2,
                        correction={"engine": "areal"} | config)
    tolerance = 1e-5  # AReaL computes its behaviour weights in float32 at either dtype
    assert ours == pytest.approx(float(loss.detach()), rel=tolerance, abs=1e-9)
    torch.testing.assert_close(torch.as_tensor(grad, dtype=torch.float64), logp.grad.to(torch.float64),
                               rtol=tolerance, atol=1e-9)
