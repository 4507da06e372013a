"""A checkpoint written before a key was renamed still restores: the collapse detector's state was saved as
``detector`` before it was named ``collapse_detector``."""

from __future__ import annotations

from pathlib import Path

import pytest

from offpolicylab.build import build
from offpolicylab.lifecycle import checkpoint_state, restore_state
from offpolicylab.run_dir import RunDir
from offpolicylab.trainer import train
from tests.small_runs import mdp_config, read_rows, train_killed_at

TIMES = ("time_update_s", "time_elapsed_s")


def test_the_old_detector_key_restores_the_collapse_detector() -> None:
    """A state dict with the old key ``detector`` (and no ``collapse_detector``) restores the detector's numbers."""
    run = build(mdp_config())
    for update, reward in enumerate([0.1, 0.5, 0.9]):
        run.collapse_detector.observe(update, reward, 0.01 * (update + 1), 1.0 + update)
    state = checkpoint_state(run, 1)
    old = {("detector" if key == "collapse_detector" else key): value for key, value in state.items()}
    assert "collapse_detector" not in old
    fresh = build(mdp_config())
    assert fresh.collapse_detector.state_dict() != run.collapse_detector.state_dict()
    restore_state(fresh, old)
    assert fresh.collapse_detector.state_dict() == run.collapse_detector.state_dict()


def test_a_run_resumes_from_a_checkpoint_with_the_old_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run killed after its update-3 checkpoint, the checkpoint rewritten with the old key, resumes and ends with
    the metrics of an uninterrupted run (the clocks aside)."""
    config = mdp_config(updates=6, checkpoint_every=3)
    train(config, tmp_path / "full")
    train_killed_at(config, tmp_path / "cut", 6, monkeypatch)
    directory = RunDir(tmp_path / "cut")
    state = directory.load_checkpoint()
    state["detector"] = state.pop("collapse_detector")
    directory.save_checkpoint(state)
    assert "detector" in directory.load_checkpoint()
    train(config, tmp_path / "cut", resume=True)
    full, cut = read_rows(tmp_path / "full"), read_rows(tmp_path / "cut")
    assert len(cut) == 6
    assert [{k: v for k, v in row.items() if k not in TIMES} for row in cut] == \
        [{k: v for k, v in row.items() if k not in TIMES} for row in full]
