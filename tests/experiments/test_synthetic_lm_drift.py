"""experiments/synthetic_lm_drift.py on a tiny recipe (seconds): the sweep runs ε = 0.2 GRPO at stages:4 and
stale_k:256 per learning rate, the table reads each run's mean clip fraction (checked against metrics.csv read
independently) and prints the rule's choice."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("synthetic_lm_drift", ROOT / "experiments" / "synthetic_lm_drift.py")
drift = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(drift)

TINY = {"preset": "seed_scale", "vocab_size": 32, "response_len": 8, "num_keys": 4, "num_train_prompts": 16, "d_model": 16, "num_heads": 2,
        "num_layers": 1, "distill_steps": 20, "distill_batch": 16}


def test_drift_sweep_table_and_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("OFFPOLICYLAB_CACHE", str(tmp_path / "cache"))
    params = [x for k, v in TINY.items() for x in ("--world-param", f"{k}={v}")]
    assert drift.main(["--lrs", "1e-4,3e-2", "--updates", "6", "--out", str(tmp_path / "drift"), "--workers", "1",
                       *params]) == 0
    printed = capsys.readouterr().out
    means = {}
    for cell in (tmp_path / "drift").iterdir():
        if (cell / "metrics.csv").is_file():
            config = json.loads((cell / "config.json").read_text())
            params_used = config["objective_params"]
            assert (params_used["eps_low"], params_used["eps_high"], config["updates"]) == (0.2, 0.2, 6)
            means[(config["lr"], config["schedule"])] = pd.read_csv(cell / "metrics.csv")["clip_frac"].mean()
    assert set(means) == {(lr, s) for lr in (1e-4, 3e-2) for s in ("stages:4", "stale_k:256")}
    for lr in (1e-4, 3e-2):
        row = next(line for line in printed.splitlines() if line.startswith(f"| {lr:g} |"))
        assert f"{means[(lr, 'stages:4')]:.3%}" in row and f"{means[(lr, 'stale_k:256')]:.3%}" in row
    assert means[(3e-2, "stale_k:256")] > means[(1e-4, "stale_k:256")]  # a 300× larger step clips more
    assert "chosen lr: " in printed
