"""One objective call on a batch that joins several runs (``TokenBatch.runs`` > 1) equals one call per run.

Every objective that declares :attr:`Objective.joins_runs` is called once on three runs' batches joined row-wise
and once on each run's batch alone.  The runs differ in everything a reduction over the batch reads — log-ratios,
advantages, lengths, entropies, reference log-probs — so a sum, mean, ESS or count taken over the whole joined batch
instead of per run gives another number for at least one run.  Tolerance: none — the loss, every metric, the token
mask and the gradient w.r.t. ``logp`` equal the run's own call bit for bit (blocks far below ``stats.ROW_LIMIT``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import Tensor

from offpolicylab.diagnostics import stats
from offpolicylab.objectives import AGG_CHOICES, TokenBatch, get_objective
from offpolicylab.objectives.base import Objective
from offpolicylab.objectives.m2po import m2po_mask
from offpolicylab.trainer import objective_groups
from tests.objectives.test_all_objectives import CONFIGS

RUNS, ROWS, LENGTH = 3, 8, 7


def _joining() -> list[Any]:
    return [config for config in CONFIGS if get_objective(config.values[0], **config.values[1]).joins_runs]


def _run_fields(run: int) -> dict[str, Tensor]:
    """Run ``run``'s batch fields (float32, as the trainer's): its own scale of log-ratios, signs of advantages,
    response lengths (one empty response in run 1), entropies and reference log-probs."""
    generator = torch.Generator().manual_seed(100 + run)
    lengths = torch.randint(1, LENGTH + 1, (ROWS,), generator=generator)
    if run == 1:
        lengths[3] = 0
    mask = (torch.arange(LENGTH)[None, :] < lengths[:, None]).to(torch.float32)
    behavior = -torch.rand(ROWS, LENGTH, generator=generator) * 2.0 - 0.1
    delta = torch.randn(ROWS, LENGTH, generator=generator) * (0.02, 0.3, 1.5)[run]
    advantages = torch.randn(ROWS, generator=generator) + (0.0, 0.5, -0.5)[run]
    return {"logp": (behavior + delta) * mask, "behavior_logp": behavior * mask, "advantages": advantages,
            "mask": mask, "rewards": torch.rand(ROWS, generator=generator),
            "group_ids": torch.arange(ROWS) // 4 + 2 * run, "staleness": torch.full((ROWS,), float(run)),
            "entropy": torch.rand(ROWS, LENGTH, generator=generator) * mask,
            "ref_logp": (behavior + torch.randn(ROWS, LENGTH, generator=generator) * 0.2) * mask}


def _call(objective: Objective, fields: dict[str, Tensor], runs: int) -> tuple[Any, Tensor]:
    """(the output, ∂ Σ loss / ∂ logp) of one call on ``fields`` as a batch of ``runs`` runs."""
    logp = fields["logp"].clone().requires_grad_(True)
    entropy = fields["entropy"].clone().requires_grad_(True)
    batch = TokenBatch(**{**fields, "logp": logp, "entropy": entropy}, runs=runs)
    output = objective(batch)
    output.loss.sum().backward()
    return output, logp.grad


@pytest.mark.parametrize("agg", AGG_CHOICES[:4])
@pytest.mark.parametrize("regularized", [False, True], ids=["plain", "kl-entropy"])
@pytest.mark.parametrize(("name", "params"), _joining())
def test_one_call_on_joined_runs_equals_each_runs_own_call(name: str, params: dict[str, Any], agg: str,
                                                           regularized: bool) -> None:
    extra = {"kl_coef": 0.1, "entropy_coef": 0.01} if regularized else {}
    objective = get_objective(name, **params, agg=agg, **extra)
    own = [_run_fields(run) for run in range(RUNS)]
    joined = {key: torch.cat([fields[key] for fields in own]) for key in own[0]}
    output, grad = _call(objective, joined, RUNS)
    parts = output.split(RUNS)
    assert output.loss.shape == (RUNS,)
    for run, (fields, part) in enumerate(zip(own, parts, strict=True)):
        alone, alone_grad = _call(objective, fields, 1)
        assert torch.equal(part.loss, alone.loss), run
        assert part.metrics.keys() == alone.metrics.keys()
        for key, value in alone.metrics.items():
            assert torch.equal(part.metrics[key], value), (run, key)
        assert torch.equal(part.token_mask, alone.token_mask), run
        assert torch.equal(grad[run * ROWS:(run + 1) * ROWS], alone_grad), run
    columns = [output.loss.detach(), *(value for value in output.metrics.values() if value.dim())]
    assert any(len(set(column.tolist())) == RUNS for column in columns)  # the runs differ: a batch-wide sum shows


@pytest.mark.parametrize(("name", "params"), [("m2po", {"variant": "cap"}), ("ac_mispo", {}),
                                              ("grpo", {"tis_cap": 2.0})])
def test_an_objective_that_cannot_join_runs_refuses_a_joined_batch(name: str, params: dict[str, Any]) -> None:
    """m2po's cap variant solves one bound over the batch, ac_mispo keeps per-run state, a mismatch correction
    reduces over the whole batch: each refuses a batch of several runs."""
    objective = get_objective(name, **params)
    own = [_run_fields(run) for run in range(2)]
    joined = TokenBatch(**{key: torch.cat([fields[key] for fields in own]) for key in own[0]}, runs=2)
    assert not objective.joins_runs
    with pytest.raises(ValueError, match="cannot score 2 runs"):
        objective(joined)


def test_objective_groups_join_consecutive_equal_objectives_that_join_runs() -> None:
    """Consecutive members with the same objective and parameters form one group; another parameter, an objective
    that cannot join (m2po's cap variant) or blocks above stats.ROW_LIMIT tokens make groups of one."""
    cap = {"variant": "cap"}
    objectives = [get_objective("grpo"), get_objective("grpo"), get_objective("grpo", eps_high=0.3),
                  get_objective("m2po", **cap), get_objective("m2po", **cap), get_objective("p3o"), get_objective("p3o"),
                  get_objective("grpo")]
    runs = [SimpleNamespace(objective=objective) for objective in objectives]
    small = TokenBatch(logp=torch.zeros(8 * 2, 3), behavior_logp=torch.zeros(8 * 2, 3), advantages=torch.zeros(16),
                       mask=torch.ones(16, 3), runs=8)
    assert objective_groups(runs, small) == [(0, 2), (2, 3), (3, 4), (4, 5), (5, 7), (7, 8)]
    rows = stats.ROW_LIMIT + 1
    large = TokenBatch(logp=torch.zeros(8 * rows, 1), behavior_logp=torch.zeros(8 * rows, 1),
                       advantages=torch.zeros(8 * rows), mask=torch.ones(8 * rows, 1), runs=8)
    assert objective_groups(runs, large) == [(index, index + 1) for index in range(8)]


def test_a_batch_refuses_runs_that_do_not_divide_its_rows() -> None:
    with pytest.raises(ValueError, match="runs=3 must divide"):
        TokenBatch(logp=torch.zeros(4, 2), behavior_logp=torch.zeros(4, 2), advantages=torch.zeros(4),
                   mask=torch.ones(4, 2), runs=3)


@pytest.mark.parametrize("tau", [1e-4, 0.04, 0.3, 10.0])
def test_m2po_mask_of_joined_runs_cuts_each_run_at_its_own_k(tau: float) -> None:
    """m2po_mask with runs > 1 (one sort per run's row) equals each run's own m2po_mask bit for bit: runs with
    values on both sides of τ, ties at the cut, values exactly τ, an empty trust region."""
    generator = torch.Generator().manual_seed(7)
    blocks = []
    for run in range(4):
        values = (torch.randn(6, 5, generator=generator) * (0.05, 0.4, 1.0, 0.2)[run]) ** 2
        values[0, :3] = values[0, 3]  # ties
        values[1, 0] = tau
        region = (torch.rand(6, 5, generator=generator) < 0.6).to(values.dtype) * (run != 3)
        blocks.append((values, region))
    joined = m2po_mask(torch.cat([b[0] for b in blocks]), torch.cat([b[1] for b in blocks]), tau, runs=4)
    assert torch.equal(joined, torch.cat([m2po_mask(values, region, tau) for values, region in blocks]))
