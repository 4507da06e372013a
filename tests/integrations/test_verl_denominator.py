"""verl's loss denominator of a corrected loss, on verl's own code: its rejection
(``rollout_corr_helper.compute_rollout_correction_and_rejection_mask``) gives the modified response mask that
``compute_rollout_correction_and_add_to_batch`` stores as the batch's ``response_mask``; its vanilla PPO loss
(``core_algos.compute_policy_loss_vanilla``, IS weights applied, dual clip 3) aggregated over that mask, token-mean
and seq-mean-token-mean, equals our ``grpo`` with ``correction: verl`` — value and gradient — on the shared fixtures
where the rejection changes the denominator (where it keeps no token at all verl's token-mean is 0/0 = NaN and ours
0).  Needs verl: runs in the verl environment of ``.ci/run``."""

from __future__ import annotations

import pytest
import torch

from tests.corrections.fixtures import FIXTURES, sanitised
from tests.objectives._golden import run

helper = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper")
core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")

CONFIGS = [dict(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token_k1", rollout_rs_threshold="0.9_1.1"),
           dict(rollout_is="sequence", rollout_is_threshold=2.0, rollout_rs="seq_mean_k1",
                rollout_rs_threshold=1.01)]


def actor_config():  # noqa: ANN201 - verl's ActorConfig
    from verl.workers.config import ActorConfig

    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_low=0.2,
                       clip_ratio_high=0.2, clip_ratio_c=3.0)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("config", CONFIGS, ids=["token", "sequence"])
@pytest.mark.parametrize("name", ["long", "extreme", "empty_rows", "near_one", "top_p"])
def test_corrected_loss_is_verls(name: str, config: dict, mode: str) -> None:
    old, sampler, mask, adv = sanitised(FIXTURES[name](torch.float64))
    gen = torch.Generator().manual_seed(11)
    current = (old + 0.1 * torch.randn(old.shape, generator=gen, dtype=torch.float64)) * mask
    proto, kept, _ = helper.compute_rollout_correction_and_rejection_mask(
        old_log_prob=old, rollout_log_prob=sampler, response_mask=mask, **config)
    logp = current.clone().requires_grad_(True)
    expected, _ = core_algos.compute_policy_loss_vanilla(
        old_log_prob=old, log_prob=logp, advantages=adv[:, None].expand_as(old), response_mask=kept,
        loss_agg_mode=mode, config=actor_config(), rollout_is_weights=proto.batch["rollout_is_weights"])
    expected.backward()
    data = {"logp": current, "behavior_logp": old, "sampler_logp": sampler, "advantages": adv.double(),
            "mask": mask.double()}
    ours, grad, _ = run("grpo", data, agg=mode, eps_low=0.2, eps_high=0.2, dual_clip=3.0,
                        correction={"engine": "verl"} | config)
    if kept.sum() == 0:  # verl's rejection kept nothing: it divides 0 by 0; ours is 0 with a zero gradient
        assert torch.isnan(expected) and ours == 0.0 and not grad.any()
        return
    assert ours == pytest.approx(float(expected.detach()), rel=1e-10, abs=1e-12)
    torch.testing.assert_close(torch.as_tensor(grad), logp.grad, rtol=1e-10, atol=1e-12)


def test_the_fixtures_reject() -> None:
    """Most of the cases above are ones where verl's rejection changes the denominator."""
    changed = 0
    for name in ["long", "extreme", "empty_rows", "near_one", "top_p"]:
        old, sampler, mask, _ = sanitised(FIXTURES[name](torch.float64))
        for config in CONFIGS:
            _, kept, _ = helper.compute_rollout_correction_and_rejection_mask(
                old_log_prob=old, rollout_log_prob=sampler, response_mask=mask, **config)
            changed += bool(0 < kept.sum() < mask.sum())
    assert changed >= 6
