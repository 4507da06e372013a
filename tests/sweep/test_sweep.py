"""Sweeps: grid expansion, a failing cell recorded while the others finish, re-running skips finished cells."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from offpolicylab import cli
from offpolicylab.grid import expand_grid
from offpolicylab.sweep import get_engine, run_sweep

GRID = {
    "base": {"world": "three_arm_pitfall", "updates": 4, "prompts_per_update": 2, "group_size": 4,
             "eval_every": 100, "sample_every": 0, "checkpoint_every": 100},
    "axes": {
        "objective": [
            "reinforce",
            {"label": "grpo_wide", "objective": "grpo", "objective_params": {"eps_low": 1.0, "eps_high": 1e9}},
            {"label": "broken", "objective": "grpo", "objective_params": {"eps_low": "abc"}},
        ],
        "schedule": ["on_policy", "stale_k:2"],
    },
}


def test_expand_grid_names_cells_from_axis_labels(tmp_path: Path) -> None:
    cells = expand_grid(GRID, tmp_path)
    assert [c.name for c in cells] == [
        "objective=reinforce__schedule=on_policy", "objective=reinforce__schedule=stale_k-2",
        "objective=grpo_wide__schedule=on_policy", "objective=grpo_wide__schedule=stale_k-2",
        "objective=broken__schedule=on_policy", "objective=broken__schedule=stale_k-2",
    ]
    assert cells[2].config["objective_params"] == {"eps_low": 1.0, "eps_high": 1e9}
    assert cells[1].config["schedule"] == "stale_k:2" and cells[1].config["world"] == "three_arm_pitfall"


def test_bad_grid_and_engine_are_value_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="valid: local"):
        get_engine("carrier-pigeon")
    with pytest.raises(ValueError, match="unknown config key"):
        expand_grid({"base": {"wrold": "bandit"}, "axes": {"seed": [0]}}, tmp_path)
    with pytest.raises(ValueError, match="non-empty list"):
        expand_grid({"base": {}, "axes": {"seed": []}}, tmp_path)


def test_failing_cell_is_recorded_and_others_finish_then_rerun_skips(tmp_path: Path) -> None:
    rows = run_sweep(GRID, tmp_path, workers=1)
    status = {row["cell"]: row["status"] for row in rows}
    assert [s for c, s in status.items() if c.startswith("objective=broken")] == ["failed", "failed"]
    assert all(s == "completed" for c, s in status.items() if not c.startswith("objective=broken"))
    broken = json.loads((tmp_path / "objective=broken__schedule=on_policy" / "summary.json").read_text())
    assert broken["status"] == "failed" and "eps_low" in broken["error"]
    with open(tmp_path / "sweep_results.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == 6 and {"objective", "schedule", "status", "peak_reward_mean", "final_exact_return",
                                "collapse_update"} <= set(table[0])
    assert table[0]["final_exact_return"] != ""
    done = tmp_path / "objective=reinforce__schedule=on_policy" / "metrics.csv"
    stamp = done.stat().st_mtime_ns
    again = run_sweep(GRID, tmp_path, workers=1)
    assert done.stat().st_mtime_ns == stamp  # completed cells are skipped …
    assert [r["status"] for r in again] == [r["status"] for r in rows]  # … failed ones are retried (and fail)


def test_cli_sweep_reports_failures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = {**GRID, "axes": {"objective": GRID["axes"]["objective"][::2], "schedule": ["on_policy"]}}
    (tmp_path / "grid.json").write_text(json.dumps(grid))
    code = cli.main(["sweep", str(tmp_path / "grid.json"), "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 1 and "2 cells, 1 failed" in out
