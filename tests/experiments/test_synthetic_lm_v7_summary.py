"""experiments/synthetic_lm_v7_summary.py on a hand-made metrics.csv: the clip fraction by lag and by quarter, and
``sampler_kl`` over the first 20 updates, the last 100 and the largest 250-update window, worked out by hand."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("synthetic_lm_v7_summary",
                                              ROOT / "experiments" / "synthetic_lm_v7_summary.py")
summary_module = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(summary_module)


def test_summary_of_a_hand_made_run(tmp_path: Path) -> None:
    """600 updates: clip 0.01 at lag 0 (even updates) and 0.03 at lag 1 (odd ones); sampler_kl 1e-4 over updates
    0–249, 3e-4 over 250–499, 2e-4 over 500–599 — so first 20 = 1e-4, last 100 = 2e-4, window max = 3e-4 (the
    second window), mean = (250·1 + 250·3 + 100·2)·1e-4 / 600 = 2e-4; |log-ratio| 0.002 for updates 0–9, 0.004
    after."""
    run = tmp_path / "run"
    run.mkdir()
    lines = ["update,clip_frac,staleness_mean,sampler_kl,sampler_log_ratio_abs_mean,time_update_s"]
    for u in range(600):
        kl = 1e-4 if u < 250 else 3e-4 if u < 500 else 2e-4
        lines.append(f"{u},{0.01 if u % 2 == 0 else 0.03},{u % 2},{kl},{0.002 if u < 10 else 0.004},0.5")
    (run / "metrics.csv").write_text("\n".join(lines) + "\n")
    (run / "config.json").write_text(json.dumps({"schedule": "stages:2", "policy_params": {}}))
    out = summary_module.summary(run)
    assert out["updates"] == 600 and out["schedule"] == "stages:2"
    assert out["clip_frac_mean"] == pytest.approx(0.02)
    assert out["clip_frac_by_lag"] == {"0": pytest.approx(0.01), "1": pytest.approx(0.03)}
    assert out["clip_frac_by_quarter"] == [pytest.approx(0.02)] * 4
    assert out["sampler_kl_first20"] == pytest.approx(1e-4)
    assert out["sampler_kl_last100"] == pytest.approx(2e-4)
    assert out["sampler_kl_window_max"] == pytest.approx(3e-4)
    assert out["sampler_kl_mean"] == pytest.approx(2e-4)
    assert out["sampler_abs_log_ratio_first20"] == pytest.approx(0.003)  # (10 · 0.002 + 10 · 0.004) / 20
    assert out["time_update_s_median"] == 0.5
