"""TRL's ``loss_type`` aggregations (``dr_grpo``, ``bnpo``, ``dapo``) as our ``agg``: the loss and gradient of our
``grpo`` objective equal those computed by TRL's own ``GRPOTrainer._compute_loss`` on shared fixtures.

TRL's loss is a method, not a function: the test calls the unbound ``GRPOTrainer._compute_loss`` with a stand-in
``self`` that holds only what that method reads (one process, no gradient accumulation, no KL, no entropy bonus, no
vLLM) and returns the fixture's log-probs from ``_get_per_token_logps_and_entropies`` — every line of TRL's
clipping and aggregation runs as shipped.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
import torch

trl = pytest.importorskip("trl")  # optional extra (installed here and in CI)

from trl import GRPOTrainer  # noqa: E402

from offpolicylab.objectives import TokenBatch, get_objective  # noqa: E402
from tests.integrations.loss_fixtures import ragged_batch  # noqa: E402

MAX_COMPLETION_LENGTH = 11  # > the fixture's padded length 7: dr_grpo's constant is TRL's max_completion_length


class _OneProcess:
    """The accelerator calls ``_compute_loss`` makes, for a single process."""

    num_processes = 1
    sync_gradients = True

    @staticmethod
    def gather(x: torch.Tensor) -> torch.Tensor:
        return x

    gather_for_metrics = gather

    @staticmethod
    def reduce(x: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        return x


def stand_in_and_inputs(loss_type: str, data: dict[str, torch.Tensor], eps_low: float, eps_high: float,
                        accumulation: int = 1, generation_tokens: float | None = None,
                        ) -> tuple[SimpleNamespace, dict[str, Any]]:
    """What TRL's ``_compute_loss`` reads of ``self`` (training mode, one process, ``accumulation`` micro-batches
    per step and per generation) and its ``inputs`` (``num_items_in_batch``: the generation batch's tokens, default
    this micro-batch's)."""
    new, mask = data["new"], data["mask"].long()
    stand_in = SimpleNamespace(
        loss_type=loss_type, epsilon_low=eps_low, epsilon_high=eps_high, beta=0.0, top_entropy_quantile=1.0,
        off_policy_mask_threshold=None, importance_sampling_level="token", use_vllm=False,
        vllm_importance_sampling_correction=False, max_completion_length=MAX_COMPLETION_LENGTH,
        current_gradient_accumulation_steps=accumulation, accelerator=_OneProcess(),
        model=SimpleNamespace(training=True),
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=accumulation,
                             max_completion_length=MAX_COMPLETION_LENGTH),
        _entropy_bonus_enabled=False, aux_loss_enabled=False, _metrics=defaultdict(lambda: defaultdict(list)),
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (new, torch.zeros_like(new), None),
    )
    batch_size = new.shape[0]
    inputs: dict[str, Any] = {
        "prompt_ids": torch.ones(batch_size, 2, dtype=torch.long), "prompt_mask": torch.ones(batch_size, 2),
        "completion_ids": torch.ones_like(mask), "completion_mask": mask,
        "advantages": data["advantages"], "old_per_token_logps": data["old"],
        "num_items_in_batch": mask.sum().double() if generation_tokens is None else torch.tensor(generation_tokens),
    }
    return stand_in, inputs


def trl_loss(loss_type: str, data: dict[str, torch.Tensor], eps_low: float, eps_high: float,
             **window: Any) -> torch.Tensor:
    """The loss TRL's ``GRPOTrainer._compute_loss`` returns for ``loss_type`` on ``data`` (training mode)."""
    stand_in, inputs = stand_in_and_inputs(loss_type, data, eps_low, eps_high, **window)
    return GRPOTrainer._compute_loss(stand_in, None, inputs)


def our_loss(agg: str, data: dict[str, torch.Tensor], eps_low: float, eps_high: float, **params: Any) -> torch.Tensor:
    batch = TokenBatch(logp=data["new"], behavior_logp=data["old"], mask=data["mask"],
                       advantages=data["advantages"][:, None].expand_as(data["new"]))
    return get_objective("grpo", agg=agg, eps_low=eps_low, eps_high=eps_high, **params)(batch).loss


@pytest.mark.parametrize("loss_type", ["dr_grpo", "bnpo", "dapo"])
@pytest.mark.parametrize("seed", [0, 1])
def test_trl_loss_types_equal_trl_compute_loss(loss_type: str, seed: int) -> None:
    data = ragged_batch(seed, spread=0.4)
    params = {"agg_norm": MAX_COMPLETION_LENGTH} if loss_type == "dr_grpo" else {}
    expected = trl_loss(loss_type, data, 0.2, 0.28)
    ours = our_loss(loss_type, data, 0.2, 0.28, **params)
    torch.testing.assert_close(ours, expected, rtol=1e-12, atol=1e-15)
    (grad,) = torch.autograd.grad(ours, data["new"])
    (expected_grad,) = torch.autograd.grad(expected, data["new"])
    torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-15)


def test_fixture_clips_and_the_three_types_differ() -> None:
    """The fixture is not degenerate: some ratios leave [1−ε, 1+ε] and the three normalisations give three numbers
    (dapo = bnpo in one process without accumulation; dr_grpo divides by B·L_max instead)."""
    data = ragged_batch(0, spread=0.4)
    ratio = torch.exp(data["new"].detach() - data["old"])[data["mask"] > 0]
    assert ((ratio < 0.8) | (ratio > 1.28)).any()
    losses = {kind: trl_loss(kind, data, 0.2, 0.28).item() for kind in ("dr_grpo", "bnpo", "dapo", "grpo")}
    assert losses["dapo"] == pytest.approx(losses["bnpo"], rel=1e-12)
    assert len({round(losses[k], 12) for k in ("dr_grpo", "bnpo", "grpo")}) == 3


@pytest.mark.parametrize("loss_type", ["dr_grpo", "bnpo", "dapo"])
def test_plugin_loss_types_have_trl_scale_under_accumulation(loss_type: str) -> None:
    """OffPolicyLabGRPOTrainer with grpo and agg=<loss_type> returns TRL's own loss for that loss_type, with 3
    accumulation steps and a generation batch of 3.5× this micro-batch's tokens: dr_grpo divides by B·L_max (L_max =
    TRL's max_completion_length, no agg_norm given), dapo by TRL's num_items_in_batch normaliser."""
    from offpolicylab.integrations.trl import OffPolicyLabGRPOTrainer

    data = ragged_batch(3, spread=0.4)
    window = {"accumulation": 3, "generation_tokens": 3.5 * float(data["mask"].sum())}
    expected = trl_loss(loss_type, data, 0.2, 0.28, **window)
    plugin, inputs = stand_in_and_inputs(loss_type, data, 0.2, 0.28, **window)
    plugin.objective = get_objective("grpo", agg=loss_type, eps_low=0.2, eps_high=0.28)
    plugin.objective.response_limit = plugin.args.max_completion_length  # what the plug-in's __init__ sets
    plugin.state, plugin._objective_step, plugin.recorder = SimpleNamespace(global_step=0), 0, None
    for name in ("inputs_token_batch", "_log_objective_metrics", "_dapo_normalizer"):
        setattr(plugin, name, getattr(OffPolicyLabGRPOTrainer, name).__get__(plugin))
    ours = OffPolicyLabGRPOTrainer._compute_loss(plugin, None, inputs)
    torch.testing.assert_close(ours, expected, rtol=1e-12, atol=1e-15)
    (grad,) = torch.autograd.grad(ours, data["new"])
    (expected_grad,) = torch.autograd.grad(expected, data["new"])
    torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-15)
