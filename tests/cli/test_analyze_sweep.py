"""``analyze`` on a sweep folder: a table over its runs (sweep_analysis.csv, summary.json per run, the console
table), each row the analysis of that run directory on its own."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from offpolicylab import analyze, cli
from offpolicylab.sweep import run_sweep


def test_analyze_a_sweep_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = {"base": {"world": "three_arm_pitfall", "updates": 6, "eval_every": 3, "prompts_per_update": 2,
                     "group_size": 4},
            "axes": {"objective": ["grpo", "reinforce"], "schedule": ["on_policy", "stale_k:2"]}}
    sweep = tmp_path / "sweep"
    run_sweep(grid, sweep)
    out = tmp_path / "diag"
    assert cli.main(["analyze", str(sweep), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].split()[:4] == ["run", "status", "steps", "peak_reward"]
    assert "4 runs, 0 collapsed" in printed
    with open(out / "sweep_analysis.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    cells = sorted(path.name for path in sweep.iterdir() if path.is_dir())
    assert sorted(row["run"] for row in rows) == cells
    summaries = json.loads((out / "summary.json").read_text())["runs"]
    for row in rows:  # each row is the run's own analysis
        alone = analyze.analyze(sweep / row["run"]).summary
        assert summaries[row["run"]]["final_reward"] == alone["final_reward"]
        assert float(row["final_reward"]) == pytest.approx(alone["final_reward"])
        assert float(row["peak_reward"]) == pytest.approx(alone["peak_reward"])
        assert int(row["steps"]) == alone["steps"] == 6
        assert row["status"] == alone["status"]
    assert sorted(p.name for p in out.iterdir()) == ["summary.json", "sweep_analysis.csv"]
