"""A sweep's seed and objective axes: the cells of one tabular or GRU configuration that differ only in seed and
objective train together (one task), and every cell's run directory is the one its separate run writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from offpolicylab import batched, sweep, trainer
from offpolicylab import grid as grid_module
from offpolicylab.config import TrainConfig
from tests.trainer.golden_runs import normalized_metrics

BASE: dict[str, Any] = {"world": "token_mdp", "world_params": {"vocab_size": 3, "length": 3, "num_prompts": 2},
                        "updates": 4, "prompts_per_update": 2, "group_size": 4, "eval_every": 2, "sample_every": 0}


def test_seed_groups_gather_the_seeds_and_objectives_of_stackable_configurations(tmp_path: Path) -> None:
    grid = {"base": BASE, "axes": {"policy": ["tabular", "sequence_model"], "lr": [0.1, 0.2],
                                   "objective": ["grpo", "m2po"], "seed": [0, 1, 2]}}
    cells = grid_module.expand_grid(grid, tmp_path)
    groups = sweep.seed_groups(cells)
    assert len(groups) == 4 and all(len(g) == 6 for g in groups)  # one per policy and lr
    for group in groups:
        labels = [cells[i].labels for i in group]
        assert len({(x["policy"], x["lr"]) for x in labels}) == 1
        assert {(x["objective"], x["seed"]) for x in labels} == {(o, s) for o in ("grpo", "m2po") for s in "012"}


def test_sweep_cells_trained_together_equal_their_separate_runs(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """grpo (std advantages) and rec (mean advantages) in one group: each cell as its separate run, bit for bit."""
    calls: list[list[tuple[str, int]]] = []
    real = batched.train_together

    def spy(configs: list[TrainConfig], run_dirs: Any, **kw: Any) -> Any:
        calls.append([(c.objective, c.seed) for c in configs])
        return real(configs, run_dirs, **kw)

    monkeypatch.setattr(sweep, "train_together", spy)
    grid = {"base": BASE, "axes": {"objective": ["grpo", "rec"], "seed": [0, 1, 2]}}
    rows = sweep.run_sweep(grid, tmp_path / "sweep")
    assert calls == [[(o, s) for o in ("grpo", "rec") for s in (0, 1, 2)]]
    assert {row["status"] for row in rows} == {"completed"}
    for cell in grid_module.expand_grid(grid, tmp_path / "sweep"):
        alone = tmp_path / "alone" / cell.name
        trainer.train(TrainConfig.from_dict(cell.config), alone)
        assert normalized_metrics(cell.out_dir) == normalized_metrics(alone)
    again = sweep.run_sweep(grid, tmp_path / "sweep")  # done cells are reused, not run again
    assert len(calls) == 1 and [row["status"] for row in again] == [row["status"] for row in rows]


def test_a_cell_whose_objective_cannot_be_built_fails_alone(tmp_path: Path) -> None:
    grid = {"base": BASE, "axes": {"objective": ["grpo", "no_such_objective"], "seed": [0, 1]}}
    rows = sweep.run_sweep(grid, tmp_path / "sweep")
    assert [(row["objective"], row["status"]) for row in rows] == [
        ("grpo", "completed"), ("grpo", "completed"), ("no_such_objective", "failed"), ("no_such_objective", "failed")]
