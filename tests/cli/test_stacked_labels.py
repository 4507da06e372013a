"""A stacked run's console lines (progress, evaluations, warnings) name the run they are about: its run directory's
name, which tells seeds and a sweep's objectives apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from offpolicylab.batched import train_seeds
from offpolicylab.config import TrainConfig
from offpolicylab.progress import Progress
from offpolicylab.run_dir import RunDir
from offpolicylab.trainer import member_label


def test_seed_lines_carry_the_run_directory_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = TrainConfig(world="three_arm_pitfall", objective="grpo", updates=3, eval_every=3, prompts_per_update=2,
                         group_size=4)
    train_seeds(config, [0, 1], tmp_path / "seeds", progress="lines")
    lines = [line for line in capsys.readouterr().err.splitlines() if " update 2 (3/3 done)" in line]
    assert {line.split("]")[0] + "]" for line in lines} == {"[seed=0]", "[seed=1]"}


def test_warnings_name_the_member(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    labels = [member_label(None, RunDir(tmp_path / "objective=m2po__seed=3")),  # type: ignore[arg-type]
              member_label(None, RunDir(tmp_path / "objective=grpo__seed=3"))]  # type: ignore[arg-type]
    view = Progress(None, 10, 0, write=print)
    rows = [{"update": 4, "loss": 0.0, "grad_norm": 1.0}] * 2
    view.update(rows, labels, [None, "collapse warning: ESS 0.1 below its range"])
    assert capsys.readouterr().out.strip() == ("[objective=grpo__seed=3] warning: update 4: collapse warning: ESS 0.1 "
                                               "below its range")
