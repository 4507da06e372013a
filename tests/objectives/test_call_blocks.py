"""One objective call over several runs' batches joined row-wise (``Objective.call_blocks``, batched seeds) against
each run's own call: loss, gradient, token mask and every metric bit for bit, for every row-wise objective and the
aggregation modes, TIS and proximal-policy variants; and the guards that keep other objectives out."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

from offpolicylab.diagnostics import stats
from offpolicylab.objectives import AGG_MODES, TokenBatch, get_objective, list_objectives
from offpolicylab.objectives.base import OBJECTIVES, Objective
from tests.objectives.test_fused_metrics import ragged_batch

BLOCKS = 3
ROWS = 8

VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("grpo", {}), ("grpo", {"dual_clip": 3.0}), ("grpo", {"eps_low": "inf", "eps_high": "inf"}),
    ("grpo", {"tis_cap": 2.0}), ("reinforce", {}), ("cispo", {}), ("cispo", {"eps_low": 0.2}),
    ("topr", {}), ("topr", {"ratio_level": "token"}), ("rec", {}), ("rec", {"mask": "two_side"}),
    ("rec", {"mask": "ring", "importance_sampling": True}), ("mu_grpo", {}), ("mu_grpo", {"nav_scope": "response"}),
    ("mu_grpo", {"nav_scope": "trigger"}), ("mispo", {}), ("gspo", {}), ("opmd", {}), ("opmd", {"form": "token"}),
    ("asymre", {}), ("red_weight", {}), ("gppo", {}), ("gppo", {"dual_clip": 3.0}), ("decoupled_ppo", {}),
    ("decoupled_ppo", {"behavior_cap": 1.05}),
] + [("grpo", {"agg": agg}) for agg in AGG_MODES] + [("mu_grpo", {"agg": "seq-mean-token-sum"}),
                                                      ("gspo", {"agg": "seq-mean-token-mean"})]


def block_fields(prox: bool) -> list[dict[str, Tensor]]:
    """Three runs' batches (float32, ragged, one empty row each, garbage in the padding), each with its own data."""
    blocks = []
    for seed in range(BLOCKS):
        fields = {k: (v.float() if v.is_floating_point() else v)
                  for k, v in ragged_batch(10 + seed, rows=ROWS, length=12).items()}
        gen = torch.Generator().manual_seed(100 + seed)
        fields["sampler_logp"] = fields["behavior_logp"] + 0.05 * torch.randn(fields["mask"].shape, generator=gen)
        fields["sampler_logp"] = torch.where(fields["mask"] > 0, fields["sampler_logp"], 0.0)
        if prox:
            near = fields["behavior_logp"] + 0.1 * torch.randn(fields["mask"].shape, generator=gen)
            fields["prox_logp"] = torch.where(fields["mask"] > 0, near, 0.0)
        blocks.append(fields)
    return blocks


def batch_of(fields: dict[str, Tensor]) -> tuple[TokenBatch, Tensor]:
    logp = fields["logp"].clone().requires_grad_(True)
    return TokenBatch(**{**fields, "logp": logp}), logp


def joined_fields(blocks: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    joined = {key: torch.cat([b[key] for b in blocks]) for key in blocks[0] if key != "group_ids"}
    joined["group_ids"] = torch.cat([b["group_ids"] + index * 100 for index, b in enumerate(blocks)])
    return joined


@pytest.mark.parametrize(("name", "params"), VARIANTS, ids=[f"{n}-{p}" for n, p in VARIANTS])
@pytest.mark.parametrize("metrics", [True, False])
def test_call_blocks_equals_each_block_alone(name: str, params: dict[str, Any], metrics: bool) -> None:
    blocks = block_fields(prox=name in ("grpo", "decoupled_ppo"))
    objective = get_objective(name, **params)
    alone = []
    for fields in blocks:
        batch, logp = batch_of(fields)
        objective.update(batch)
        out = objective(batch, metrics=metrics)
        out.loss.backward()
        alone.append((out, logp.grad))
    joined, logp = batch_of(joined_fields(blocks))
    parts = joined.split_rows(BLOCKS, [b["group_ids"] + i * 100 for i, b in enumerate(blocks)], summarize=metrics)
    summaries = [part._summary for part in parts] if metrics else None
    outs = objective.call_blocks(joined, BLOCKS, summaries, metrics=metrics)
    sum(out.loss for out in outs).backward()
    for index, (out, (own, own_grad)) in enumerate(zip(outs, alone, strict=True)):
        assert torch.equal(out.loss.detach(), own.loss.detach()), index
        assert torch.equal(logp.grad[index * ROWS:(index + 1) * ROWS], own_grad), index
        assert torch.equal(out.token_mask, own.token_mask), index
        assert list(out.metrics) == list(own.metrics), index
        for key, value in own.metrics.items():
            assert torch.equal(out.metrics[key], value), (index, key)


def test_every_rowwise_objective_is_covered_and_the_others_refuse() -> None:
    rowwise = {name for name in list_objectives() if OBJECTIVES.get(name).builder.rowwise}
    assert rowwise == {name for name, _ in VARIANTS}
    batch, _ = batch_of(joined_fields(block_fields(prox=False)))
    for name in sorted(set(list_objectives()) - rowwise):
        with pytest.raises(ValueError, match="not row-wise or keeps state"):
            get_objective(name).call_blocks(batch, BLOCKS, metrics=False)


def test_a_sum_that_bypasses_total_is_refused() -> None:
    class Bypass(Objective):
        name, rowwise = "bypass", True

        def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
            return -batch.advantages * batch.logp, torch.ones_like(batch.mask), {"raw": batch.mask.sum()}

    batch, _ = batch_of(joined_fields(block_fields(prox=False)))
    with pytest.raises(ValueError, match="'raw' as one value for all blocks"):
        Bypass().call_blocks(batch, BLOCKS, [{}] * BLOCKS)


@pytest.mark.parametrize("size", [1, 7, 320, 4096, stats.ROW_LIMIT])
def test_total_sums_each_block_as_the_block_alone(size: int) -> None:
    values = torch.randn(BLOCKS * size, generator=torch.Generator().manual_seed(size)) * 1e3
    with stats.blockwise(BLOCKS):
        sums, means = stats.total(values), stats.average(values)
    for index, block in enumerate(values.split(size)):
        assert torch.equal(sums[index], block.sum()) and torch.equal(means[index], block.mean())
    assert stats.total(values).dim() == 0  # the context is gone
    with pytest.raises(RuntimeError), stats.blockwise(BLOCKS):
        raise RuntimeError
    assert stats.total(values).dim() == 0
