"""verl's ``seq-mean-token-sum-norm`` as our ``agg``: equal to verl's own ``core_algos.agg_loss`` and, through the
verl adapter, to verl's own ``vanilla`` policy loss (value and gradient).  Needs verl: skipped where it is not
importable (it runs in the verl environment of ``.ci/run``)."""

from __future__ import annotations

import pytest
import torch

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")

from offpolicylab.integrations import verl as verl_adapter  # noqa: E402
from offpolicylab.objectives import TokenBatch, aggregate, get_objective  # noqa: E402
from tests.integrations.loss_fixtures import ragged_batch  # noqa: E402

MODE = "seq-mean-token-sum-norm"


def actor_config(loss_scale_factor: float | None = None, **info: object):
    from verl.workers.config import ActorConfig

    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_low=0.2,
                         clip_ratio_high=0.28, loss_scale_factor=loss_scale_factor)
    config.global_batch_info.update(info, loss_scale_factor=loss_scale_factor)  # as verl's ppo_loss fills it
    return config


@pytest.mark.parametrize("scale", [None, 16])
@pytest.mark.parametrize("mode", [MODE, "dr_grpo"])
def test_aggregate_equals_verl_agg_loss(scale: int | None, mode: str) -> None:
    """Local: verl divides by the non-empty rows (all are here), ours by B; C = loss_scale_factor or T."""
    data = ragged_batch(0)
    per_token = -data["advantages"][:, None] * data["new"]
    expected = core_algos.agg_loss(per_token, data["mask"], MODE, loss_scale_factor=scale)
    torch.testing.assert_close(aggregate(per_token, data["mask"], mode, norm=scale), expected, rtol=1e-12, atol=0)
    info = {"dp_size": 4, "global_batch_size": 13}
    adapter = verl_adapter.VerlPolicyLoss(get_objective("reinforce"))
    loss, _ = adapter(data["old"], data["new"], data["advantages"][:, None].expand_as(data["new"]),
                      data["mask"].bool(), loss_agg_mode=MODE, config=actor_config(scale, **info))
    torch.testing.assert_close(loss, core_algos.agg_loss(per_token, data["mask"], MODE, loss_scale_factor=scale,
                                                         **info), rtol=1e-12, atol=0)
    assert adapter.objective.agg == MODE and adapter.objective.agg_norm == scale


@pytest.mark.parametrize("scale", [None, 16])
def test_adapter_equals_verl_vanilla_loss(scale: int | None) -> None:
    """Peer oracle: verl's vanilla PPO loss (dual clip 3) aggregated seq-mean-token-sum-norm equals our grpo through
    the adapter, value and gradient, with verl's loss_scale_factor passed along."""
    for seed in (1, 2):
        data = ragged_batch(seed, spread=0.4)
        inputs = {"old_log_prob": data["old"], "log_prob": data["new"], "response_mask": data["mask"].bool(),
                  "advantages": data["advantages"][:, None].expand_as(data["new"])}
        config = actor_config(scale)
        expected, _ = core_algos.get_policy_loss_fn("vanilla")(**inputs, loss_agg_mode=MODE, config=config)
        adapter = verl_adapter.VerlPolicyLoss(get_objective("grpo", eps_low=0.2, eps_high=0.28, dual_clip=3.0))
        loss, _ = adapter(**inputs, loss_agg_mode=MODE, config=config)
        torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-15)
        batch = TokenBatch(logp=data["new"], behavior_logp=data["old"], advantages=inputs["advantages"],
                           mask=data["mask"])
        direct = get_objective("grpo", agg="dr_grpo", agg_norm=scale, eps_low=0.2, eps_high=0.28, dual_clip=3.0)
        torch.testing.assert_close(direct(batch).loss, expected, rtol=1e-12, atol=1e-15)
        (grad,) = torch.autograd.grad(loss, data["new"])
        (expected_grad,) = torch.autograd.grad(expected, data["new"])
        torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-15)
