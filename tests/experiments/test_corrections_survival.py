"""experiments/corrections_survival.py on hand-written run directories: the per-run CSV and the per-(setting, arm)
table hold the numbers of the runs' metrics.csv (seed mean, SE = sd/√n, the paired difference to none_trainer,
"fell"), recomputed here; the identity check finds the first update where two runs differ."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("corrections_survival", ROOT / "experiments" / "corrections_survival.py")
survival = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(survival)


def write(root: Path, seed: int, arm: str, evals: list[float], drop: float, differ_at: int | None = None,
          setting: str = "fp8_e4m3-s0") -> None:
    run = root / f"seed={seed}__setting={setting}__correction={arm}"
    run.mkdir(parents=True)
    updates = np.arange(5)
    reward = np.full(5, 0.1 * seed)
    if differ_at is not None:
        reward[differ_at:] += 0.5
    metrics = pd.DataFrame({"update": updates, "reward_mean": reward, "clip_frac": 0.01 * updates,
                            "eval_reward_sampled": [evals[0], np.nan, evals[1], np.nan, evals[2]],
                            "eval_reward_se": [0.02, np.nan, 0.02, np.nan, 0.015],
                            "time_update_s": updates * 0.1 + (0.05 if arm.startswith("skyrl") else 0.0)})
    if arm != "none_trainer":
        metrics["corr_drop_frac"] = drop
        metrics["corr_ess"] = 1 - drop
    metrics.to_csv(run / "metrics.csv", index=False)
    (run / "summary.json").write_text(json.dumps({"status": "completed"}))


def test_table(tmp_path: Path) -> None:
    finals = {"none_trainer": [0.30, 0.25, 0.35], "skyrl_recommended": [0.20, 0.18, 0.10]}
    peaks = {"none_trainer": 0.31, "skyrl_recommended": 0.26}
    for seed in range(3):
        for arm in finals:
            write(tmp_path, seed, arm, [0.2, peaks[arm], finals[arm][seed]], 0.5 + 0.01 * seed)
    frame = survival.cells([str(tmp_path)])
    assert len(frame) == 6
    for arm, values in finals.items():
        fell = [max(peaks[arm], f) - f > 0.05 for f in values]
        assert frame[frame["arm"] == arm].sort_values("seed")["fell"].tolist() == fell
        assert frame[frame["arm"] == arm].sort_values("seed")["peak"].tolist() == pytest.approx(
            [max(peaks[arm], f) for f in values])
    table = survival.table(frame).set_index("arm")
    sky = np.array(finals["skyrl_recommended"])
    diff = sky - np.array(finals["none_trainer"])
    assert table.loc["skyrl_recommended", "final"] == pytest.approx(sky.mean())
    assert table.loc["skyrl_recommended", "final_se"] == pytest.approx(sky.std(ddof=1) / math.sqrt(3))
    assert table.loc["skyrl_recommended", "delta_final"] == pytest.approx(diff.mean())
    assert table.loc["skyrl_recommended", "delta_se"] == pytest.approx(diff.std(ddof=1) / math.sqrt(3))
    assert table.loc["skyrl_recommended", "corr_drop_frac"] == pytest.approx(0.51)
    assert table.loc["skyrl_recommended", "fell"] == sum(0.26 - f > 0.05 for f in sky)
    assert math.isnan(table.loc["none_trainer", "delta_final"])
    assert "| fp8_e4m3-s0 | skyrl_recommended | 3 |" in survival.markdown(survival.table(frame))


def test_runs_written_before_the_rename_get_the_new_labels(tmp_path: Path) -> None:
    """Run directories named with the plain engine names (before the arms said "recommended") are read under the
    new labels; the old ``skyrl`` runs, which divided by the kept tokens only, as ``skyrl_kept_denominator``."""
    for arm in ("verl", "skyrl", "none_trainer"):
        write(tmp_path, 0, arm, [0.2, 0.3, 0.3], 0.1)
    arms = sorted(survival.cells([str(tmp_path)])["arm"])
    assert arms == ["none_trainer", "skyrl_kept_denominator", "verl_recommended"]


def test_identity_finds_the_first_differing_update(tmp_path: Path) -> None:
    """SkyRL vs none at bf16 (a pair the design predicts to train alike): equal metrics but for the timings and
    the correction's own columns at seeds 0 and 2; reward_mean differs from update 3 at seed 1."""
    for seed in range(3):
        for arm in ("none_trainer", "skyrl_recommended"):
            write(tmp_path, seed, arm, [0.2, 0.3, 0.3], 0.0,
                  differ_at=3 if seed == 1 and arm == "skyrl_recommended" else None,
                  setting="bf16-s0")
    lines = survival.identity(survival.cells([str(tmp_path)]))
    assert len(lines) == 3
    assert ["identical" in line for line in lines] == [True, False, True]
    assert "differ from update 3" in lines[1]
