"""Our ``openrlhf`` correction and its loss aggregation against OpenRLHF's own ``PolicyLoss`` (PyPI
``openrlhf==0.11.2``, ``openrlhf/models/loss.py``), on the shared fixtures (``tests/corrections/fixtures.py``) in
float32 and float64.

Runs in the engine environment of ``.ci/run`` (OpenRLHF installed without its dependencies — they pin
``flash-attn``, whose build needs CUDA's ``nvcc`` — beside ``deepspeed==0.19.6``, which ``openrlhf.models.utils``
imports; ``openrlhf/models/__init__.py`` imports the actor and ``flash_attn``, so the loss module is imported past it:
``tests/integrations/engine_source.py``); skipped where OpenRLHF is not installed.

OpenRLHF 0.11.2 spells the correction ``is_correction_level`` (token / seq), ``is_correction_mode`` (clip / mask) and
``is_correction_threshold``; our names are the earlier ``vllm_is_correction_type``: ``tis`` = token + clip,
``icepop`` = token + mask, ``seq-mask-tis`` = seq + mask, and ours accepts both spellings (its
``is_correction_gating`` binary_kl / tv gates are not re-implemented).  ``PolicyLoss.forward`` returns the aggregated loss, not the factor, so the factor w·keep is read
from OpenRLHF's own gradient at π_θ = π_old with A = 1: there ∂L/∂log π_θ(y_t) = −coef_t / N (token-level loss).
"""

from __future__ import annotations

import pytest
import torch

from offpolicylab import corrections
from tests.corrections.fixtures import FIXTURES, loss_inputs, sanitised
from tests.integrations.engine_source import bare_module, installed
from tests.objectives._golden import run

installed("openrlhf", "0.11.2")
loss_module = bare_module("openrlhf.models.loss")

#: our type → OpenRLHF 0.11.2's (level, mode)
TYPES = {"tis": ("token", "clip"), "icepop": ("token", "mask"), "seq-mask-tis": ("seq", "mask")}
BANDS = [(0.5, 5.0), (0.8, 1.25)]
DTYPES = [torch.float32, torch.float64]


def policy_loss(kind: str, band: tuple[float, float]) -> object:
    level, mode = TYPES[kind]
    return loss_module.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2, token_level_loss=True,
                                  is_correction_level=level, is_correction_mode=mode, is_correction_threshold=band)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("band", BANDS)
@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("name", FIXTURES)
def test_factor_and_filter_equal_openrlhfs(name: str, kind: str, band: tuple[float, float],
                                           dtype: torch.dtype) -> None:
    old, sampler, mask, adv = sanitised(FIXTURES[name](dtype))
    mask = mask.to(dtype)
    logp = old.clone().requires_grad_(True)
    loss, _, _, _, filtered = policy_loss(kind, band)(logp, old, torch.ones_like(old), action_mask=mask,
                                                       rollout_log_probs=sampler)
    loss.backward()
    coef = -logp.grad.to(torch.float64) * mask.sum().to(torch.float64)
    weights, keep = corrections.apply("openrlhf", old, sampler, mask, advantages=adv, vllm_is_correction_type=kind,
                                      vllm_is_truncated_threshold=list(band))
    torch.testing.assert_close((weights * keep).to(torch.float64), coef, rtol=1e-5, atol=1e-9)
    if TYPES[kind][1] == "mask":  # the share OpenRLHF filters, per token or per sequence
        dropped = (keep.sum(dim=-1) == 0).to(torch.float64).mean() if kind == "seq-mask-tis" else \
            1 - keep.sum().to(torch.float64) / mask.sum()
        assert float(filtered) == pytest.approx(float(dropped), abs=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("name", ["long", "extreme", "empty_rows", "near_one", "top_p"])
def test_aggregated_loss_equals_openrlhfs(name: str, kind: str, dtype: torch.dtype) -> None:
    old, sampler, mask, adv, current, token_adv = loss_inputs(name, dtype, 9)
    logp = current.clone().requires_grad_(True)
    loss = policy_loss(kind, (0.5, 5.0))(logp, old, token_adv, action_mask=mask, rollout_log_probs=sampler)[0]
    loss.backward()
    data = {"logp": current, "behavior_logp": old, "sampler_logp": sampler, "advantages": adv.to(dtype),
            "mask": mask}
    level, mode = TYPES[kind]  # OpenRLHF 0.11.2's own spelling, pasted
    ours, grad, _ = run("grpo", data, dtype=dtype, agg="token-mean", eps_low=0.2, eps_high=0.2,
                        correction={"engine": "openrlhf", "is_correction_level": level, "is_correction_mode": mode})
    tolerance = 1e-5 if dtype == torch.float32 else 1e-10
    assert ours == pytest.approx(float(loss.detach()), rel=tolerance, abs=1e-9)
    torch.testing.assert_close(torch.as_tensor(grad, dtype=torch.float64), logp.grad.to(torch.float64),
                               rtol=tolerance, atol=1e-9)
