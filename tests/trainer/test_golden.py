"""Golden runs: fixed-seed runs reproduce the metrics recorded from the reference code within stated tolerances
(``golden_runs.RTOL`` / ``ATOL``), on any x86-64 CPU; the tolerances still catch a 0.1 % change of the learning rate."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer import golden_runs
from tests.trainer.golden_runs import GOLDEN_DIR, GOLDEN_RUNS, metric_mismatches, run_golden

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(GOLDEN_RUNS))
def test_metrics_match_the_recorded_reference_within_tolerance(name: str, tmp_path: Path) -> None:
    expected = (GOLDEN_DIR / f"{name}.csv").read_text()
    assert metric_mismatches(run_golden(name, tmp_path), expected) == []


def test_goldens_hold_with_another_cpu_kernel_set(tmp_path: Path) -> None:
    """torch's portable kernels (``ATEN_CPU_CAPABILITY=default``) round differently from the AVX2 / AVX-512 ones,
    as another CPU model does: every golden run still matches within the tolerances."""
    code = (
        "import sys, torch; from pathlib import Path; from tests.trainer.golden_runs import *\n"
        "assert torch.backends.cpu.get_cpu_capability() == 'DEFAULT'\n"
        "bad = {n: metric_mismatches(run_golden(n, sys.argv[1]), (GOLDEN_DIR / f'{n}.csv').read_text())"
        " for n in sorted(GOLDEN_RUNS)}\n"
        "print(bad); sys.exit(any(bad.values()))\n")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


def test_tolerances_catch_a_small_change_of_the_learning_rate(tmp_path: Path, monkeypatch) -> None:
    """Float noise uses < 2 % of the tolerance; a learning rate 0.1 % higher must not pass as noise."""
    from offpolicylab.config import TrainConfig

    name = "bandit_rec_sync"
    config = GOLDEN_RUNS[name]
    changed = {**config, "lr": TrainConfig(**config).lr * 1.001}
    monkeypatch.setitem(golden_runs.GOLDEN_RUNS, name, changed)
    got = run_golden(name, tmp_path)
    assert metric_mismatches(got, (GOLDEN_DIR / f"{name}.csv").read_text()) != []


def test_the_comparison_reads_headers_rows_and_empty_cells_exactly() -> None:
    want = "update,loss,eval\n0,1.0,\n1,2.0,0.5\n"
    assert metric_mismatches("update,loss,eval\n0,1.00005,\n1,2.0,0.5\n", want) == []
    assert metric_mismatches("update,loss,eval\n0,1.001,\n1,2.0,0.5\n", want) == ["line 2 loss: '1.001' != '1.0'"]
    assert metric_mismatches("update,loss,eval\n0,1.0,0.1\n1,2.0,0.5\n", want) == ["line 2 eval: '0.1' != ''"]
    assert metric_mismatches("update,loss\n0,1.0\n1,2.0\n", want) != []
    assert metric_mismatches("update,loss,eval\n0,1.0,\n", want) == ["1 rows, expected 2"]
