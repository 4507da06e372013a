"""``--resume --updates N`` extends a finished run: its metrics then equal one straight run of N updates (every
column of every row, the wall-clock columns aside; the update where the first run ended also keeps the evaluation
it made there).  Extensions that could not equal a straight run are refused with one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offpolicylab import cli
from offpolicylab.run_dir import RunDir
from offpolicylab.trainer import train
from tests.small_runs import mdp_config, read_rows


def assert_extension_equals_straight(extended: Path, straight: Path, first_end: int) -> None:
    rows_e, rows_s = read_rows(extended), read_rows(straight)
    assert len(rows_e) == len(rows_s)
    assert list(rows_e[0]) == list(rows_s[0])  # the same columns
    for row_e, row_s in zip(rows_e, rows_s, strict=True):
        for key, value in row_s.items():
            if key.startswith("time_"):
                continue
            if value == "" and int(row_s["update"]) == first_end - 1 and key.startswith(("eval_", "exact_")):
                continue  # the first run's last evaluation, which a straight run does not make there
            assert row_e[key] == value, (row_s["update"], key)


@pytest.mark.parametrize("schedule", ["on_policy", "stale_k:3", "epochs:2", "mixture:0.5"])
def test_an_extended_run_equals_one_straight_run(tmp_path: Path, schedule: str) -> None:
    settings = dict(schedule=schedule, eval_every=4, checkpoint_every=5, sample_every=0)
    train(mdp_config(updates=8, **settings), tmp_path / "extended")
    summary = train(mdp_config(updates=14, **settings), tmp_path / "extended", resume=True)
    train(mdp_config(updates=14, **settings), tmp_path / "straight")
    assert summary["status"] == "completed" and summary["updates_done"] == 14
    assert_extension_equals_straight(tmp_path / "extended", tmp_path / "straight", first_end=8)
    run = RunDir(tmp_path / "extended")
    assert run.read_config()["updates"] == 14
    assert [e["event"] for e in run.read_events()] == ["extend"]


def test_a_stopped_run_resumes_to_a_new_length(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of 8 updates interrupted at update 6 (after its checkpoint at 5) continues to 12: one straight run."""
    settings = dict(eval_every=4, checkpoint_every=5, sample_every=0)
    append = RunDir.append_metrics

    def interrupted(self: RunDir, row: dict) -> None:  # Ctrl-C while update 6's row is written
        if row["update"] == 6:
            raise KeyboardInterrupt
        append(self, row)

    monkeypatch.setattr(RunDir, "append_metrics", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(mdp_config(updates=8, **settings), tmp_path / "stopped")
    monkeypatch.setattr(RunDir, "append_metrics", append)
    assert len(read_rows(tmp_path / "stopped")) == 6 and not (tmp_path / "stopped" / "summary.json").exists()
    train(mdp_config(updates=12, **settings), tmp_path / "stopped", resume=True)
    train(mdp_config(updates=12, **settings), tmp_path / "straight")
    assert_extension_equals_straight(tmp_path / "stopped", tmp_path / "straight", first_end=0)


def test_extensions_that_cannot_equal_a_straight_run_are_refused(tmp_path: Path) -> None:
    train(mdp_config(updates=6, schedule="sync:4,0", checkpoint_every=3, sample_every=0), tmp_path / "sync")
    with pytest.raises(ValueError, match=r"sync:4,0 run cannot be extended from 6 to 12 updates: at update 4"):
        train(mdp_config(updates=12, schedule="sync:4,0", checkpoint_every=3, sample_every=0), tmp_path / "sync",
              resume=True)
    assert json.loads((tmp_path / "sync" / "summary.json").read_text())["status"] == "completed"  # untouched
    with pytest.raises(ValueError, match="--updates 4 is below the 6 updates"):
        train(mdp_config(updates=4, schedule="sync:4,0", checkpoint_every=3, sample_every=0), tmp_path / "sync",
              resume=True)


def test_cli_extends_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    base = ["run", "--world", "bandit", "--objective", "grpo", "--eval-every", "2", "--out", str(out)]
    assert cli.main([*base, "--updates", "3"]) == 0
    assert cli.main(["run", "--out", str(out), "--resume", "--updates", "5"]) == 0
    assert len(read_rows(out)) == 5
    with pytest.raises(SystemExit) as stopped:
        cli.main(["run", "--out", str(out), "--resume"])
    assert stopped.value.code == 2
    assert "already finished with status 'completed'; valid: --updates N (more than 5)" in capsys.readouterr().err
