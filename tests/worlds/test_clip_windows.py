"""Held-out check of the default world (recipe v7), calibration target (b) at its defaults, CI-sized: ε = 0.2 GRPO's
mean clip fraction over updates 0–299 (seed 0, the world's default rate) at ``stages:4`` (s = 0) must lie in
[0.03 %, 0.15 %] and at ``stale_k:256`` in [0.3 %, 2.5 %] — the windows around the M2PO paper's Fig. 6d (0.07 % /
0.66 % for Qwen3-1.7B, 0.05 % / 1.22 % for Qwen2.5-32B; Zheng et al. 2025, arXiv:2510.01161).

Recipes v4–v6 never met the s = 0 window (0.000 %: docs/synthetic_lm_v6.md); v7's 16-bit engines do (measured
0.036 % / 1.52 %, docs/synthetic_lm_v7.md, part 13).  The two runs go on two worker processes of one thread each,
as the calibration's runs did.
"""

from __future__ import annotations

import pandas as pd
import pytest

from offpolicylab.run_dir import RunDir
from offpolicylab.sweep import run_sweep
from offpolicylab.synthetic_lm_calibration import S0_WINDOW, STALE_WINDOW

UPDATES = 300
SCHEDULES = {"s0": "stages:4", "s256": "stale_k:256"}


@pytest.fixture(scope="module")
def clip_fractions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    """Mean ``clip_frac`` of 300-update ε = 0.2 GRPO runs at the default synthetic-LM world, per schedule."""
    root = tmp_path_factory.mktemp("clip_windows")
    base = {"world": "synthetic_lm", "objective": "grpo", "objective_params": {"eps_low": 0.2, "eps_high": 0.2},
            "updates": UPDATES, "seed": 0, "eval_every": UPDATES, "sample_every": 0, "checkpoint_every": UPDATES}
    grid = {"base": base, "axes": {"schedule": [{"label": k, "schedule": v} for k, v in SCHEDULES.items()]}}
    rows = run_sweep(grid, root, workers=2)
    assert [row["status"] for row in rows] == ["completed"] * 2
    out = {}
    for row in rows:
        run = RunDir(root / row["cell"])
        config = run.read_config()
        assert config["world_params"] == {"preset": "seed_scale_v7"} and config["lr"] == 1.5e-5  # the defaults
        metrics = pd.read_csv(run.metrics_path)
        assert list(metrics["update"]) == list(range(UPDATES))
        out[config["schedule"]] = float(metrics["clip_frac"].mean())
    return out


def test_windows_are_the_papers() -> None:
    assert S0_WINDOW == (3e-4, 1.5e-3) and STALE_WINDOW == (3e-3, 2.5e-2)


def test_stale_clip_fraction_in_its_window(clip_fractions: dict[str, float]) -> None:
    assert STALE_WINDOW[0] <= clip_fractions["stale_k:256"] <= STALE_WINDOW[1]


def test_on_policy_clip_fraction_in_its_window(clip_fractions: dict[str, float]) -> None:
    assert S0_WINDOW[0] <= clip_fractions["stages:4"] <= S0_WINDOW[1]
