"""Bit-identity: fixed-seed runs reproduce the metrics recorded from the reference code (see golden_runs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.golden_runs import GOLDEN_DIR, GOLDEN_RUNS, run_golden


@pytest.mark.parametrize("name", sorted(GOLDEN_RUNS))
def test_metrics_match_the_recorded_reference_bit_for_bit(name: str, tmp_path: Path) -> None:
    expected = (GOLDEN_DIR / f"{name}.csv").read_text()
    assert run_golden(name, tmp_path) == expected
