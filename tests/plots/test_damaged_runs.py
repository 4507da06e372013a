"""``offpolicylab plot`` under hostile input: every damaged file of a run directory, and every output location that
cannot be written, gives one line naming the file and exit code 2 — before any figure is written."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offpolicylab.run_dir import RunDir
from offpolicylab.sweep import run_cell
from offpolicylab.trainer import train
from tests.cli.test_cli import run_cli
from tests.small_runs import mdp_config


@pytest.fixture(scope="module")
def good_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished token-MDP run with sample files (8 updates)."""
    path = tmp_path_factory.mktemp("good") / "run"
    train(mdp_config(checkpoint_every=4), path)
    assert list((path / "samples").glob("*.npz"))
    return path


def damaged(good_run: Path, tmp_path: Path, damage: Callable[[Path], None]) -> Path:
    run = tmp_path / "runs" / "run"
    shutil.copytree(good_run, run)
    damage(run)
    return run


def _npz(run: Path, **arrays: np.ndarray) -> None:
    first = sorted((run / "samples").glob("*.npz"))[0]
    first.unlink()
    np.savez(first, **arrays)


def _first_sample(run: Path) -> Path:
    return sorted((run / "samples").glob("*.npz"))[0]


def _folder_sample(run: Path) -> None:
    first = _first_sample(run)
    first.unlink()
    first.mkdir()


DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "config not JSON": (lambda r: (r / "config.json").write_text("{garb"), "config.json is not valid JSON"),
    "config a list": (lambda r: (r / "config.json").write_text("[1, 2]"), "config.json holds a JSON list"),
    "config binary": (lambda r: (r / "config.json").write_bytes(b"\xff\xfe\x00\x81"), "config.json is not UTF-8"),
    "config seed a string": (lambda r: (r / "config.json").write_text(json.dumps(
        {**json.loads((r / "config.json").read_text()), "seed": "abc"})), "config.json: seed='abc' is invalid"),
    "metrics empty": (lambda r: (r / "metrics.csv").write_text(""), "metrics.csv is empty"),
    "metrics binary": (lambda r: (r / "metrics.csv").write_bytes(b"\x86\xff" * 50), "metrics.csv is not UTF-8"),
    "metrics text value": (lambda r: (r / "metrics.csv").write_text("update,reward_mean\n0,0.5\n1,abc\n"),
                           "metrics.csv:3: reward_mean='abc' is not a number"),
    "metrics no update": (lambda r: (r / "metrics.csv").write_text("a,b\n1,2\n"), "has no 'update' column"),
    "events not JSON": (lambda r: (r / "events.jsonl").write_text('{"event": "x"}\n{x\n'),
                        "events.jsonl:2: not a JSON object"),
    "events a list": (lambda r: (r / "events.jsonl").write_text("[1]\n"), "events.jsonl:1: not a JSON object"),
    "sample empty": (lambda r: _first_sample(r).write_bytes(b""), "the sample file is damaged"),
    "sample random bytes": (lambda r: _first_sample(r).write_bytes(bytes(range(256)) * 4),
                            "reading it would mean unpickling, which is never done"),
    "sample pickled objects": (lambda r: _npz(r, log_ratio=np.array([{1: 2}], dtype=object), advantage=np.zeros(1)),
                               "reading it would mean unpickling, which is never done"),
    "sample strings": (lambda r: _npz(r, log_ratio=np.array(["a"]), advantage=np.array(["b"])),
                       "array 'log_ratio' holds <U1 values, not numbers"),
    "sample sizes differ": (lambda r: _npz(r, log_ratio=np.zeros(3), advantage=np.zeros(5)),
                            "log_ratio has 3 values but advantage 5"),
    "sample a folder": (lambda r: _folder_sample(r), "the sample file is damaged"),
}


@pytest.mark.parametrize("case", list(DAMAGES))
def test_a_damaged_run_file_gives_one_line_naming_it(good_run: Path, tmp_path: Path, case: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    damage, message = DAMAGES[case]
    run = damaged(good_run, tmp_path, damage)

    code, _, err = run_cli(["plot", str(run), "--out", str(tmp_path / "figures")], capsys)

    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert message in err and str(run) in err, err
    assert not (tmp_path / "figures").exists() or not any((tmp_path / "figures").iterdir())


@pytest.mark.parametrize(("out", "message"), [
    ("", "--out '' is invalid; valid: a folder path"),
    ("{run}/config.json", "is an existing file; valid: a folder"),
    ("{run}/config.json/figures", "cannot be created: {run}/config.json is a file"),
])
def test_an_output_folder_that_cannot_be_written_is_refused_first(good_run: Path, tmp_path: Path, out: str,
                                                                  message: str, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # an empty --out must not mean "the current folder"
    code, _, err = run_cli(["plot", str(good_run), "--out", out.format(run=good_run)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert message.format(run=good_run) in err
    assert not list(tmp_path.iterdir())


def test_an_unwritable_output_folder_is_refused_first(good_run: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A folder this user may not write (simulated: the tests may run as root, who may write anywhere)."""
    import os

    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == locked else real(path, mode))
    code, _, err = run_cli(["plot", str(good_run), "--out", str(locked / "figures")], capsys)
    assert code == 2 and f"--out {locked / 'figures'} cannot be written: {locked} is not writable" in err
    assert not list(locked.iterdir())


@pytest.mark.parametrize("dpi", ["0", "-5", "100000"])
def test_a_resolution_out_of_range_is_refused(good_run: Path, tmp_path: Path, dpi: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["plot", str(good_run), "--out", str(tmp_path / "f"), "--dpi", dpi], capsys)
    assert code == 2 and f"--dpi {dpi} is out of range; valid: an integer in [10, 600]" in err
    assert not (tmp_path / "f").exists()


@given(data=st.binary(max_size=400), which=st.sampled_from(["config.json", "metrics.csv", "events.jsonl",
                                                             "summary.json", "sample"]))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzzed_run_files_plot_or_give_one_line(good_run: Path, tmp_path_factory: pytest.TempPathFactory,
                                                data: bytes, which: str) -> None:
    """Any bytes in any file of a run directory: the plot command writes its figures (exit 0) or refuses in one
    line (exit 2) — never a traceback."""
    import contextlib
    import io

    from offpolicylab import cli

    tmp_path = tmp_path_factory.mktemp("fuzz")
    run = damaged(good_run, tmp_path, lambda r: (_first_sample(r) if which == "sample" else r / which)
                  .write_bytes(data))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli.main(["plot", str(run), "--out", str(tmp_path / "f"), "--figures", "training_curves",
                             "ratio_histograms"])
        except SystemExit as exc:
            code = int(exc.code or 0)
    lines = err.getvalue().strip().splitlines()
    assert code in (0, 1, 2), err.getvalue()
    assert code == 0 or len(lines) == 1, err.getvalue()


def test_a_damaged_summary_counts_as_no_summary(good_run: Path, tmp_path: Path) -> None:
    """summary.json holding a list, or bytes that are not UTF-8: the run is treated as unfinished (a sweep
    resumes it) instead of the sweep worker crashing on it."""
    for content in (b"[1]", b"\xff\xfe", b"{"):
        run = tmp_path / f"cell{len(content)}"
        shutil.copytree(good_run, run)
        (run / "summary.json").write_bytes(content)
        assert RunDir(run).read_summary() is None
    cell = tmp_path / "cell2"
    (cell / "summary.json").write_bytes(b"[1]")
    summary = run_cell(mdp_config(checkpoint_every=4).to_dict(), str(cell))  # resumes at the last checkpoint
    assert summary["status"] == "completed", summary
