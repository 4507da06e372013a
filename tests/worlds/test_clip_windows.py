"""Calibration target (b) at the default recipe, CI-sized: ε = 0.2 GRPO's mean clip fraction over updates 0–299
(seed 0, the world's default rate) at ``stages:4`` (s = 0) must lie in [0.03 %, 0.15 %] and at ``stale_k:256`` in
[0.3 %, 2.5 %] — the windows around the M2PO paper's Fig. 6d (0.07 % / 0.66 % for Qwen3-1.7B, 0.05 % / 1.22 % for
Qwen2.5-32B; Zheng et al. 2025, arXiv:2510.01161).

The stale window is met.  The s = 0 window is not: no token leaves [0.8, 1.2] within 3 updates of this world's
student (experiments/synthetic_lm_v6_calibration.md, "Why ε = 0.2 clips nothing at s = 0"), so that test is a strict
expected failure — it turns red the day a recipe meets it, and must then become a plain test.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from offpolicylab.config import TrainConfig
from offpolicylab.synthetic_lm_calibration import S0_WINDOW, STALE_WINDOW
from offpolicylab.trainer import train

UPDATES = 300


def mean_clip_fraction(schedule: str, out: Path) -> float:
    """Mean ``clip_frac`` of a 300-update ε = 0.2 GRPO run at the default synthetic-LM recipe."""
    config = TrainConfig(world="synthetic_lm", objective="grpo", objective_params={"eps_low": 0.2, "eps_high": 0.2},
                         schedule=schedule, updates=UPDATES, seed=0, eval_every=UPDATES, sample_every=0,
                         checkpoint_every=UPDATES)
    train(config, out)
    metrics = pd.read_csv(out / "metrics.csv")
    assert list(metrics["update"]) == list(range(UPDATES))
    return float(metrics["clip_frac"].mean())


@pytest.fixture(scope="module")
def clip_fractions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    root = tmp_path_factory.mktemp("clip_windows")
    return {schedule: mean_clip_fraction(schedule, root / schedule.replace(":", "_"))
            for schedule in ("stages:4", "stale_k:256")}


def test_windows_are_the_papers() -> None:
    assert S0_WINDOW == (3e-4, 1.5e-3) and STALE_WINDOW == (3e-3, 2.5e-2)


def test_stale_clip_fraction_in_its_window(clip_fractions: dict[str, float]) -> None:
    assert STALE_WINDOW[0] <= clip_fractions["stale_k:256"] <= STALE_WINDOW[1]


@pytest.mark.xfail(strict=True, reason="measured: ε = 0.2 clips 0.000 % of tokens at s = 0 in every recipe (v4, v5, "
                                       "v6); the student's lag-1–3 log-ratios never leave [0.8, 1.2]")
def test_on_policy_clip_fraction_in_its_window(clip_fractions: dict[str, float]) -> None:
    assert S0_WINDOW[0] <= clip_fractions["stages:4"] <= S0_WINDOW[1]
