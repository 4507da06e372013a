"""A sweep's seed axis: the seeds of one tabular configuration train together (one task), and every cell's run
directory is the one its separate run writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from offpolicylab import sweep, trainer
from offpolicylab.config import TrainConfig
from tests.trainer.golden_runs import normalized_metrics

BASE: dict[str, Any] = {"world": "token_mdp", "world_params": {"vocab_size": 3, "length": 3, "num_prompts": 2},
                        "updates": 4, "prompts_per_update": 2, "group_size": 4, "eval_every": 2, "sample_every": 0}


def test_seed_groups_gather_the_seeds_of_stackable_configurations(tmp_path: Path) -> None:
    grid = {"base": BASE, "axes": {"policy": ["tabular", "sequence_model"], "objective": ["grpo", "m2po"],
                                   "seed": [0, 1, 2]}}
    cells = sweep.expand_grid(grid, tmp_path)
    groups = sweep.seed_groups(cells)
    tabular = [g for g in groups if cells[g[0]].labels["policy"] == "tabular"]
    assert [[cells[i].labels["seed"] for i in g] for g in tabular] == [["0", "1", "2"]] * 2
    assert all(len({cells[i].labels["objective"] for i in g}) == 1 for g in tabular)
    assert sorted(len(g) for g in groups) == [1] * 6 + [3] * 2  # the GRU's cells run one by one


def test_sweep_cells_of_batched_seeds_equal_their_separate_runs(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    batched: list[list[int]] = []
    real = trainer.train_seeds

    def spy(config: TrainConfig, seeds: list[int], run_dirs: Any, **kw: Any) -> Any:
        batched.append(list(seeds))
        return real(config, seeds, run_dirs, **kw)

    monkeypatch.setattr(trainer, "train_seeds", spy)
    grid = {"base": BASE, "axes": {"objective": ["grpo", "rec"], "seed": [0, 1, 2]}}
    rows = sweep.run_sweep(grid, tmp_path / "sweep")
    assert batched == [[0, 1, 2], [0, 1, 2]] and {row["status"] for row in rows} == {"completed"}
    for cell in sweep.expand_grid(grid, tmp_path / "sweep"):
        alone = tmp_path / "alone" / cell.name
        trainer.train(TrainConfig.from_dict(cell.config), alone)
        assert normalized_metrics(cell.out_dir) == normalized_metrics(alone)
    again = sweep.run_sweep(grid, tmp_path / "sweep")  # done cells are reused, not run again
    assert len(batched) == 2 and [row["status"] for row in again] == [row["status"] for row in rows]
