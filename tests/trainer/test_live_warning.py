"""The live collapse warning in training runs: fed every finite update's metrics row, recorded in events.jsonl and
printed; restored after a resume by replaying the recorded rows."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from offpolicylab import trainer
from offpolicylab.diagnostics import warning
from offpolicylab.lifecycle import replay_warning
from offpolicylab.run_dir import RunDir
from tests.small_runs import mdp_config, read_rows


def test_a_warning_is_recorded_where_the_detector_fires(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """verl's |KL| ≤ kl_max with kl_max = 1e-4: the first warning is at the first update whose recorded kl_k3
    exceeds it (worked out from metrics.csv), then none for the cooldown."""
    monkeypatch.setattr(warning, "DEFAULT_DETECTOR", "verl_ranges")
    monkeypatch.setattr(warning, "DEFAULT_PARAMS", {"kl_max": 1e-4, "patience": 1})
    trainer.train(mdp_config(schedule="stale_k:2", updates=12, checkpoint_every=12), tmp_path / "r", progress="lines")
    rows = read_rows(tmp_path / "r")
    expected = next(int(r["update"]) for r in rows if abs(float(r["kl_k3"])) > 1e-4)
    events = [e for e in RunDir(tmp_path / "r").read_events() if e["event"] == "warning"]
    assert [e["update"] for e in events] == [expected]
    assert events[0]["detector"] == "verl_ranges" and "|KL|" in events[0]["reason"]
    assert f"warning: update {expected}: collapse warning: |KL|" in capsys.readouterr().err


def test_replaying_the_recorded_rows_restores_the_warning() -> None:
    """A detector fed rows 0–59 silently and then 60–199 alarms exactly where one fed all 200 does after 59."""
    rows = [(u, {"kl_k3": 1e-3 if u < 100 else 1e-1, "ess": 0.9, "grad_norm": 1.0}) for u in range(200)]
    whole = [u for u, _ in warning.alarms(warning.KlSlope(rise=1.0, patience=3), rows)]
    run = SimpleNamespace(early_warning=warning.KlSlope(rise=1.0, patience=3))
    replay_warning(run, [{"update": str(u), **{k: str(v) for k, v in row.items()}} for u, row in rows[:60]])
    resumed = [u for u, _ in warning.alarms(run.early_warning, rows[60:])]
    assert resumed == whole == [106 + 2]


def test_a_run_without_progress_names_itself_in_its_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A sweep's cell trains without progress lines, beside other cells on the same console: its warning line
    starts with its run directory's name, so the reader knows which cell it is about."""
    monkeypatch.setattr(warning, "DEFAULT_DETECTOR", "verl_ranges")
    monkeypatch.setattr(warning, "DEFAULT_PARAMS", {"kl_max": 1e-4, "patience": 1})
    trainer.train(mdp_config(schedule="stale_k:2", updates=12, checkpoint_every=12), tmp_path / "objective=grpo")
    lines = [line for line in capsys.readouterr().err.splitlines() if "collapse warning" in line]
    assert lines and all(line.startswith("[objective=grpo] warning: update ") for line in lines)
