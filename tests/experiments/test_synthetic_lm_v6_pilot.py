"""experiments/synthetic_lm_v6_pilot.py: ``fell`` and ``fell_update`` on evaluation curves worked out by hand, the
quarters of a hand-made metrics table, and the script on a tiny v6 run (seconds)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from offpolicylab.config import TrainConfig
from offpolicylab.trainer import train

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("synthetic_lm_v6_pilot", ROOT / "experiments" / "synthetic_lm_v6_pilot.py")
pilot = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(pilot)


@pytest.mark.parametrize(("rewards", "expected"), [
    # J0 0.2, peak 0.8: level 0.5; final 0.4 below; 0.45 (update 40) starts the final stretch below
    ([0.2, 0.5, 0.8, 0.7, 0.45, 0.4], (True, 40)),
    # final 0.6 above the level: a dip to 0.4 that recovered is not a fall
    ([0.2, 0.8, 0.4, 0.7, 0.6], (False, -1)),
    # final exactly at the level counts (≤)
    ([0.2, 0.8, 0.5], (True, 20)),
    # a dip, a recovery above the level, then the fall: the fall starts after the recovery
    ([0.2, 0.8, 0.3, 0.7, 0.45], (True, 40)),
    # the peak is the last evaluation: no fall
    ([0.2, 0.3, 0.9], (False, -1)),
])
def test_fell_by_hand(rewards: list[float], expected: tuple[bool, int]) -> None:
    updates = np.arange(len(rewards)) * 10
    assert pilot.fell(updates, np.array(rewards)) == expected


def test_quarters_of_a_hand_made_table() -> None:
    metrics = pd.DataFrame({"update": range(8), "clip_frac": [0, 0, 1, 1, 2, 2, 3, 5.0],
                            "grad_norm": [1, 3, 2, 2, 9, 1, 1, 1.0], "accept_rate": [1, 0, 0.5, 0.5, 0, 0, 0.25, 0.75],
                            "eval_kl_init_k1": [0.0, math.nan, 0.1, math.nan, math.nan, 0.3, math.nan, math.nan]})
    rows = pilot.quarters(metrics)
    assert [row["updates"] for row in rows] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [row["clip_frac_mean"] for row in rows] == [0, 1, 2, 4]
    assert [row["accept_rate_mean"] for row in rows] == [0.5, 0.5, 0, 0.5]
    assert all("mask_frac_mean" not in row for row in rows)  # a column the run did not log is left out
    assert [row["grad_norm_max"] for row in rows] == [3, 2, 9, 1]
    assert [row["grad_norm_median"] for row in rows] == [2, 2, 5, 1]
    assert rows[0]["kl_init_k1_end"] == 0.0 and rows[2]["kl_init_k1_end"] == 0.3
    assert math.isnan(rows[3]["kl_init_k1_end"])


def test_the_script_reads_a_tiny_v6_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFPOLICYLAB_CACHE", str(tmp_path / "cache"))
    world = {"preset": "seed_scale_v6", "num_train_prompts": 16, "distill_steps": 1, "distill_batch": 4}
    config = TrainConfig(world="synthetic_lm", world_params=world, objective="grpo",
                         objective_params={"eps_low": "inf", "eps_high": "inf"}, schedule="stale_k:2", updates=6,
                         lr=1e-2, seed=0, eval_every=2, eval_samples=1, sample_every=0, checkpoint_every=4)
    train(config, tmp_path / "run")
    out = tmp_path / "pilot.csv"
    assert pilot.main([f"grpo_no_tr={tmp_path / 'run'}", "--csv", str(out), "--json", str(tmp_path / "q.json")]) == 0
    table = pd.read_csv(out)
    assert list(table.columns) == list(pilot.CSV_COLUMNS)
    quarters = json.loads((tmp_path / "q.json").read_text())
    assert list(quarters) == ["grpo_no_tr"] and list(quarters["grpo_no_tr"]) == ["0"]
    assert len(quarters["grpo_no_tr"]["0"]) == 4
    row = table.iloc[0]
    assert row["objective"] == "grpo_no_tr" and row["staleness"] == 2 and row["seed"] == 0
    assert row["J0"] <= row["peak_J"] and row["peak_update"] in (0, 2, 4, 5)
    assert row["fell"] == (row["final_J"] <= row["peak_J"] - 0.5 * (row["peak_J"] - row["J0"]))


def test_cells_by_hand() -> None:
    runs = pd.DataFrame({
        "objective": ["grpo_on_policy", "grpo_on_policy", "gppo", "gppo", "gppo"],
        "staleness": [0, 0, 256, 256, 256], "seed": [0, 1, 0, 1, 2],
        "final_J": [0.8, 0.6, 0.3, 0.6, 0.6], "fell": [False, False, True, False, False],
        "fell_update": [-1, -1, 1500, -1, -1], "collapsed": [False, False, True, True, False]})
    table = pilot.cells(runs)
    assert list(table.columns) == list(pilot.CELL_COLUMNS)
    on, gppo = table.iloc[0], table.iloc[1]
    assert (on["objective"], on["seeds"], on["fell"], on["flagged"]) == ("grpo_on_policy", 2, 0, 0)
    assert on["final_mean"] == pytest.approx(0.7) and on["x_on_policy"] == pytest.approx(1.0)
    assert on["final_se"] == pytest.approx(math.sqrt(0.02) / math.sqrt(2))  # sd of (0.8, 0.6) = √0.02
    assert (gppo["seeds"], gppo["fell"], gppo["flagged"], gppo["fell_updates"]) == (3, 1, 2, "1500")
    assert gppo["final_mean"] == pytest.approx(0.5) and gppo["x_on_policy"] == pytest.approx(0.5 / 0.7)
    assert gppo["final_se"] == pytest.approx(math.sqrt(0.03) / math.sqrt(3))  # deviations −0.2, 0.1, 0.1: var 0.03
    one = pilot.cells(runs.iloc[2:3])
    assert one["seeds"].item() == 1 and math.isnan(one["final_se"].item()) and math.isnan(one["x_on_policy"].item())
