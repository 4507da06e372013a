"""Nothing lost, nothing stale, nothing run that should not be: sweeps reuse only identical cells, resume checks
metrics.csv against the checkpoint, cell names stay under --out, one writer per run directory, a full disk ends
cleanly and resumes, killed sweeps leave no workers behind."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from offpolicylab import cli
from offpolicylab.grid import expand_grid
from offpolicylab.run_dir import RunDir, RunError
from offpolicylab.sweep import run_sweep
from offpolicylab.trainer import train
from tests.cli.test_cli import run_cli
from tests.small_runs import mdp_config, read_rows

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
BANDIT = ["--world", "three_arm_pitfall", "--objective", "reinforce", "--prompts-per-update", "2", "--group-size",
          "4", "--eval-every", "100", "--sample-every", "0"]
GRID: dict[str, Any] = {
    "base": {"world": "three_arm_pitfall", "objective": "reinforce", "updates": 3, "prompts_per_update": 2,
             "group_size": 4, "eval_every": 100, "sample_every": 0, "checkpoint_every": 100},
    "axes": {"seed": [0]},
}


def without_time(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [{k: v for k, v in row.items() if not k.startswith("time_")} for row in rows]


def wait_for(condition: Any, timeout: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie counts as ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def metrics_rows(path: Path) -> int:
    return max(0, path.read_text().count("\n") - 1) if path.exists() else 0


# ============================================================================================ 1. stale sweep cells
def test_rerun_sweep_with_a_changed_config_refuses_then_reruns_when_asked(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    cell = tmp_path / "seed=0"
    run_sweep(GRID, tmp_path)
    first = (cell / "metrics.csv").read_bytes()
    changed = {**GRID, "base": {**GRID["base"], "lr": 0.5}}
    (tmp_path.parent / "changed.json").write_text(json.dumps(changed))

    code, _, err = run_cli(["sweep", str(tmp_path.parent / "changed.json"), "--out", str(tmp_path)], capsys)

    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "seed=0: lr differ" in err and "--rerun-changed" in err
    assert (cell / "metrics.csv").read_bytes() == first  # nothing ran, nothing was reported as done
    assert json.loads((tmp_path / "grid.json").read_text()) == GRID
    rows = run_sweep(changed, tmp_path, rerun_changed=True)
    assert rows[0]["status"] == "completed"
    assert json.loads((cell / "config.json").read_text())["lr"] == 0.5
    assert json.loads((tmp_path / "grid.json").read_text()) == changed
    assert json.loads((tmp_path / "grid.previous-1.json").read_text()) == GRID  # the old grid is kept
    again = run_sweep(changed, tmp_path)  # identical config: reused as it is
    assert again[0]["status"] == "completed" and not (tmp_path / "grid.previous-2.json").exists()


# ============================================================================================ 2. resume consistency
@pytest.fixture
def interrupted(tmp_path: Path) -> RunDir:
    """A finished 8-update token-MDP run (checkpoints every 4) whose summary is removed, as if killed at the end."""
    train(mdp_config(checkpoint_every=4), tmp_path)
    (tmp_path / "summary.json").unlink()
    return RunDir(tmp_path)


@pytest.mark.parametrize(("damage", "message"), [
    (lambda run: run.metrics_path.unlink(), "is missing or empty but the checkpoint is at update 8"),
    (lambda run: run.metrics_path.write_text(""), "is missing or empty but the checkpoint is at update 8"),
    (lambda run: run.metrics_path.write_text(run.metrics_path.read_text().replace("\n3,", "\n9,", 1)),
     "metrics.csv:5: expected the row of update 3"),
    (lambda run: run.metrics_path.write_text(run.metrics_path.read_text().replace(",", ";", 1)),
     "metrics.csv:1: the header differs"),
    (lambda run: _set_next_update(run, 4), "differ from what the checkpoint recorded"),
    (lambda run: _set_next_update(run, 5), "update counter 5"),
    (lambda run: _set_next_update(run, 800), "update counter 800"),
])
def test_resume_refuses_metrics_that_disagree_with_the_checkpoint(interrupted: RunDir, damage: Any,
                                                                  message: str) -> None:
    damage(interrupted)
    with pytest.raises(RunError, match=message):
        train(mdp_config(checkpoint_every=4), interrupted.path, resume=True)
    assert not interrupted.summary_path.exists()  # nothing claims "completed"


def _set_next_update(run: RunDir, value: int) -> None:
    state = torch.load(run.checkpoint_path, weights_only=True)
    torch.save({**state, "next_update": value}, run.checkpoint_path)


# ============================================================================================ 3. cell names
def test_cell_names_are_sanitised_and_confined_under_out(tmp_path: Path) -> None:
    out = tmp_path / "out"
    grid = {"base": GRID["base"], "axes": {"/tmp/x": [{"label": "../../up", "seed": 1}], "../y": [{"seed": 2}]}}
    cells = expand_grid(grid, out)
    assert [c.name for c in cells] == ["tmp-x=..-..-up__..-y=2"]
    assert all(Path(c.out_dir).parent == out for c in cells)
    long = expand_grid({"base": GRID["base"], "axes": {"objective": ["x" * 300]}}, out)[0]
    assert len(long.name) == 200 and Path(long.out_dir).parent == out


def test_a_failed_cell_holding_foreign_files_is_not_deleted(tmp_path: Path) -> None:
    broken = {**GRID, "base": {**GRID["base"], "objective_params": {"eps_low": "abc"}, "objective": "grpo"}}
    assert run_sweep(broken, tmp_path)[0]["status"] == "failed"
    keep = tmp_path / "seed=0" / "notes.txt"
    keep.write_text("mine")

    row = run_sweep(broken, tmp_path)[0]

    assert row["status"] == "failed" and "holds files a run does not write (notes.txt)" in row["error"]
    assert keep.read_text() == "mine"


# ============================================================================================ 5. one writer
def test_two_processes_cannot_both_write_one_run_directory(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "offpolicylab", "run", *BANDIT, "--updates", "1000000",
                              "--checkpoint-every", "2", "--out", str(out)], env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: metrics_rows(out / "metrics.csv") > 3 and (out / "checkpoint" / "state.pt").exists(),
                 what="the first run to checkpoint")
        for extra in (["--resume"], []):
            code, _, err = run_cli(["run", *BANDIT, "--updates", "1000000", "--checkpoint-every", "2",
                                    "--out", str(out), *extra], capsys)
            assert code == 2 and len(err.strip().splitlines()) == 1, err
            assert f"in use by another process (pid {first.pid})" in err
        assert first.poll() is None, "the first run must go on undisturbed"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    with RunDir(out).locked():  # the lock died with its process
        assert not RunDir(out).summary_path.exists()


def test_the_lock_is_reentrant_in_one_process_and_exclusive_across_processes(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    with run.locked(), run.locked():
        holder = subprocess.run([sys.executable, "-c", "import sys; from offpolicylab.run_dir import RunDir, RunLocked\n"
                                 "try:\n  RunDir(sys.argv[1]).locked().__enter__()\n"
                                 "except RunLocked as e: print(e)", str(run.path)],
                                env=ENV, capture_output=True, text=True, timeout=120)
    assert f"in use by another process (pid {os.getpid()})" in holder.stdout, holder.stderr


# ============================================================================================ 6. full disk
def _limit_file_size(limit: int) -> Any:
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_full_disk_ends_in_one_line_and_resumes_from_the_last_good_checkpoint(tmp_path: Path) -> None:
    args = [*BANDIT, "--updates", "100", "--checkpoint-every", "10", "--seed", "3"]
    assert cli.main(["run", *args, "--out", str(tmp_path / "straight")]) == 0
    straight = without_time(read_rows(tmp_path / "straight"))
    limit = (tmp_path / "straight" / "checkpoint" / "state.pt").stat().st_size + 1024
    assert (tmp_path / "straight" / "metrics.csv").stat().st_size > limit + 2000  # the limit is hit mid-run
    out = tmp_path / "full"

    proc = subprocess.run([sys.executable, "-m", "offpolicylab", "run", *args, "--out", str(out)], env=ENV,
                          capture_output=True, text=True, timeout=300, preexec_fn=_limit_file_size(limit))

    # stderr is not a terminal, so the run logs one progress line per update before it fails; the failure itself is
    # one line, the last, and no traceback is printed
    lines = proc.stderr.strip().splitlines()
    progress = [line for line in lines if line.startswith(("update ", "  eval ", "offpolicylab: three_arm_pitfall /"))]
    assert proc.returncode == 1 and len(lines) == len(progress) + 1, proc.stderr
    assert "File too large" in lines[-1] and "Traceback" not in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and "File too large" in summary["error"]
    complete = (out / "metrics.csv").read_text().count("\n") - 1
    assert summary["updates_done"] == complete < 100  # a torn last row is not an update
    assert not list(out.rglob("*.tmp-*")), "orphan temp files"
    assert cli.main(["run", *args, "--out", str(out), "--resume"]) == 0  # space is back
    assert without_time(read_rows(out)) == straight
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    assert [e["event"] for e in RunDir(out).read_events()] == ["failed", "resume"]
    assert RunDir(out).read_events()[1]["update"] == complete // 10 * 10


def test_a_failed_atomic_write_and_a_dead_writer_leave_no_temp_files(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    run = RunDir(tmp_path / "run")
    run.path.mkdir()

    def no_space(*args: Any) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", no_space)
        with pytest.raises(OSError, match="No space"):
            run.save_checkpoint({"next_update": 1})
    assert list(run.checkpoint_path.parent.iterdir()) == []
    orphans = [run.path / ".metrics.csv.tmp-999999", run.checkpoint_path.parent / ".state.pt.tmp-999999"]
    for orphan in orphans:
        orphan.write_bytes(b"half")
    with run.locked():
        assert not any(o.exists() for o in orphans)


# ============================================================================================ 7. stopping sweeps
def _long_sweep(tmp_path: Path) -> tuple[subprocess.Popen[bytes], list[Path]]:
    """A 2-worker local sweep of two endless cells, started and waited for until both workers write (the cells
    differ in lr, not only in seed: the seeds of one configuration would train together in one worker)."""
    grid = {"base": {**GRID["base"], "updates": 1_000_000, "checkpoint_every": 5}, "axes": {"lr": [0.5, 0.25]}}
    (tmp_path / "grid.json").write_text(json.dumps(grid))
    proc = subprocess.Popen([sys.executable, "-m", "offpolicylab", "sweep", str(tmp_path / "grid.json"), "--out",
                             str(tmp_path / "out"), "--workers", "2"], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    cells = [tmp_path / "out" / "lr=0.5", tmp_path / "out" / "lr=0.25"]
    wait_for(lambda: all(metrics_rows(c / "metrics.csv") > 2 for c in cells), what="both workers to write")
    return proc, cells


def _writer(cell: Path) -> int:
    return int((cell / ".lock").read_text())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_a_sweep_stops_its_workers(tmp_path: Path, sig: signal.Signals) -> None:
    proc, cells = _long_sweep(tmp_path)
    workers = [_writer(c) for c in cells]
    assert proc.pid not in workers and len(set(workers)) == 2
    try:
        proc.send_signal(sig)
        proc.wait(timeout=60)
        wait_for(lambda: all(gone(pid) for pid in workers), timeout=30, what="the workers to exit")
    finally:
        for pid in workers:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
    if sig == signal.SIGTERM:
        assert proc.returncode == 130
        assert proc.stderr is not None
        lines = [line for line in proc.stderr.read().decode().strip().splitlines()
                 if not line.startswith("sweep: ")]  # the sweep's progress lines, then one line for the stop
        assert lines == ["offpolicylab: interrupted; run the same command again to continue (--resume for run)"]
    for cell in cells:
        with RunDir(cell).locked():  # nobody writes the cells any more: a re-run cannot race with a survivor
            assert not RunDir(cell).summary_path.exists()
    proc.stderr.close()
