"""A refused batched command writes nothing: ``run --seeds ...`` checks every member (its directory, its
checkpoint and metrics, the memory of the whole batch) before it touches any of them.

These are the batched-seeds cases of the hardening round: a resume refused because one seed's metrics.csv was
edited leaves the other seeds' files as they were, a blocked member leaves no lock folder in the others, and the
memory guard counts every seed of the batch."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from offpolicylab import cli
from tests.cli.test_cli import run_cli

TABULAR = ["--world", "token_mdp", "--world-param", "vocab_size=3", "--world-param", "length=3", "--world-param",
           "num_prompts=2", "--objective", "grpo", "--prompts-per-update", "2", "--group-size", "4",
           "--eval-every", "4", "--sample-every", "4", "--checkpoint-every", "4", "--updates", "8"]


def files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes, except the lock files (they only name the last holder's pid)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def tree(root: Path) -> list[str]:
    """Every path under ``root`` (folders and files, lock files included)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_refused_batched_resume_leaves_every_seed_as_it_was(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "seeds"
    assert cli.main(["run", *TABULAR, "--seeds", "0,1,2", "--out", str(out)]) == 0
    capsys.readouterr()
    for seed in (0, 1, 2):  # as if killed after the last checkpoint, before the summaries
        (out / f"seed={seed}" / "summary.json").unlink()
    damaged = out / "seed=2" / "metrics.csv"
    lines = damaged.read_text().splitlines(keepends=True)
    cells = lines[2].split(",")
    cells[1] = "0.123456"  # an edited value in an early row: the rows no longer match the checkpoint
    lines[2] = ",".join(cells)
    damaged.write_text("".join(lines))
    before = files(out)

    code, _, err = run_cli(["run", *TABULAR, "--seeds", "0,1,2", "--out", str(out), "--resume"], capsys)

    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "seed=2" in err and "cannot be resumed consistently" in err
    after = files(out)
    changed = sorted(name for name in before if after.get(name) != before[name])
    assert changed == [], f"a refused resume wrote {changed}"
    assert sorted(after) == sorted(before)


def test_a_batched_run_with_one_member_a_file_leaves_no_folder_behind(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "seeds"
    out.mkdir()
    (out / "seed=1").write_text("not a folder")

    code, _, err = run_cli(["run", *TABULAR, "--seeds", "0,1,2", "--out", str(out)], capsys)

    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "seed=1" in err
    assert tree(out) == ["seed=1"], "the refused command created folders for the other seeds"


def test_a_batched_run_with_one_member_in_use_leaves_no_folder_behind(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "seeds"
    busy = out / "seed=2"
    busy.mkdir(parents=True)
    fd = os.open(busy / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another writer holds seed=2 (a separate open file)
        os.write(fd, b"4242\n")

        code, _, err = run_cli(["run", *TABULAR, "--seeds", "0,1,2", "--out", str(out)], capsys)
    finally:
        os.close(fd)

    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "in use by another process" in err and "seed=2" in err
    assert tree(out) == ["seed=2", "seed=2/.lock"], "the refused command created folders for the other seeds"


def test_the_memory_guard_counts_every_seed_of_the_batch(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine is made to report 4 pages of memory: one seed of 400 one-token responses (9,600 bytes by the
    guard's 24 bytes per token) fits, ten seeds of them (96,000 bytes) do not — nor does one seed of ten times the
    prompts, which the guard refuses already."""
    real = os.sysconf
    monkeypatch.setattr(os, "sysconf", lambda name: 4 if name == "SC_PHYS_PAGES" else real(name))
    bandit = ["--world", "three_arm_pitfall", "--objective", "reinforce", "--group-size", "4", "--updates", "2",
              "--eval-every", "100", "--sample-every", "0"]
    assert 4 * real("SC_PAGE_SIZE") < 96_000  # the fake machine is smaller than ten seeds' batch

    code, _, err = run_cli(["run", *bandit, "--prompts-per-update", "1000", "--seed", "0",
                            "--out", str(tmp_path / "one")], capsys)
    assert code == 2 and "need at least" in err, err  # the same total work, one seed: refused today
    assert not (tmp_path / "one").exists()

    code, _, err = run_cli(["run", *bandit, "--prompts-per-update", "100", "--seeds", ",".join(map(str, range(10))),
                            "--out", str(tmp_path / "ten")], capsys)

    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "need at least" in err and "10 seeds" in err
    assert not (tmp_path / "ten").exists()
