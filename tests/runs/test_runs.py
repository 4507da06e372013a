"""runs.py reads back what it and the sweep wrote: typed Run records, sweep labels from grid.json, sweep results."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from offpolicylab.grid import expand_grid
from offpolicylab.run_dir import RunDir, write_grid, write_sweep_results
from offpolicylab.run_records import load_run, load_runs, read_sweep_results, sample_update, sweep_labels

GRID = {"base": {"world": "three_arm_pitfall", "updates": 2},
        "axes": {"objective": [{"label": "no_tr", "objective": "grpo", "objective_params": {"eps_low": "inf"}},
                               "rec"],
                 "seed": [0, 1]}}


def _write_run(path: Path, config: dict, rows: list[dict]) -> None:
    run = RunDir(path)
    run.create(config)
    for row in rows:
        run.append_metrics(row)
    run.close()
    run.event("collapse", 1, reason="test")
    run.write_samples(1, {"log_ratio": np.zeros(3, np.float32)})
    run.write_summary("collapsed")


def test_a_run_reads_back_as_a_typed_record(tmp_path: Path) -> None:
    _write_run(tmp_path / "r", {"objective": "grpo", "schedule": "stale_k:4", "seed": 3},
               [{"update": 0, "reward_mean": 0.5, "exact_return": None}, {"update": 1, "reward_mean": 0.25}])
    run = load_run(tmp_path / "r")
    assert run.metrics["reward_mean"].tolist() == [0.5, 0.25]
    assert run.metrics["exact_return"].isna().all()
    assert (run.objective, run.schedule, run.seed) == ("grpo", "stale_k:4", 3)
    assert run.collapse_updates() == [1] and run.summary["status"] == "collapsed"
    assert [sample_update(p) for p in run.sample_files] == [1] and run.labels == {}


def test_sweep_labels_come_from_the_grid_file_not_the_directory_name(tmp_path: Path) -> None:
    write_grid(tmp_path, GRID)
    cells = expand_grid(GRID, tmp_path)
    for cell in cells:
        _write_run(Path(cell.out_dir), cell.config, [{"update": 0, "reward_mean": 0.0}])
    labels = sweep_labels(tmp_path)
    assert labels == {cell.name: cell.labels for cell in cells}
    runs = load_runs([tmp_path])
    assert sorted(r.labels["objective"] for r in runs) == ["no_tr", "no_tr", "rec", "rec"]
    assert {r.labels["seed"] for r in runs} == {"0", "1"}


def test_sweep_results_round_trip_and_bad_paths(tmp_path: Path) -> None:
    rows = [{"cell": "a", "status": "completed", "peak": 0.5}, {"cell": "b", "status": "failed", "error": "x"}]
    write_sweep_results(tmp_path, rows)
    assert read_sweep_results(tmp_path) == [{"cell": "a", "status": "completed", "peak": "0.5", "error": ""},
                                            {"cell": "b", "status": "failed", "peak": "", "error": "x"}]
    with pytest.raises(ValueError, match="no sweep_results.csv"):
        read_sweep_results(tmp_path / "missing")
    with pytest.raises(ValueError, match="does not exist"):
        load_runs([tmp_path / "missing"])
    with pytest.raises(ValueError, match="not a run directory"):
        load_run(tmp_path)
    with pytest.raises(ValueError, match="no update number"):
        sample_update(tmp_path / "samples" / "first.npz")
