"""A sweep's (and the demo's) progress from the first second: a line at once, then updates done with an ETA."""

from __future__ import annotations

from pathlib import Path

from offpolicylab.progress import SweepProgress, duration


def write_rows(run_dir: Path, rows: int) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.csv").write_text("update,loss\n" + "".join(f"{u},0.5\n" for u in range(rows)))


def test_sweep_progress_counts_updates_and_gives_an_eta(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    lines: list[str] = []
    now = [100.0]
    view = SweepProgress(2, "lines", write=lines.append, clock=lambda: now[0], run_dirs=dirs, updates=[50, 50],
                         poll=0)  # poll=0: no thread; the test asks for the lines itself
    assert lines == ["sweep: 2 cells, 100 updates in all; progress with an ETA follows every few seconds"]
    assert view.status().endswith("0s elapsed, ETA once the first updates are done")
    now[0] += 10.0  # start-up: 10 s without an update
    write_rows(dirs[0], 10)
    assert view.status() == "sweep: 10/100 updates (10%), 0/2 cells done, 10s elapsed, ETA 1m30s"  # rate since start
    now[0] += 10.0
    write_rows(dirs[0], 30)
    write_rows(dirs[1], 10)
    # rate since the first look that saw updates: 30 updates in 10 s → 60 left take 20 s
    assert view.status() == "sweep: 40/100 updates (40%), 0/2 cells done, 20s elapsed, ETA 20s"
    write_rows(dirs[0], 80)  # more rows than the run's updates (never counted beyond them)
    view.finished([{"status": "completed"}], running=1)
    assert lines[-1] == "sweep: 1/2 cells done, 1 running, 0 failed, ETA 8s"  # 50 in 10 s, 40 left
    view.close()


def test_cells_already_done_are_not_counted_in_the_rate(tmp_path: Path) -> None:
    write_rows(tmp_path / "done", 40)
    lines: list[str] = []
    now = [0.0]
    view = SweepProgress(2, "lines", write=lines.append, clock=lambda: now[0],
                         run_dirs=[tmp_path / "done", tmp_path / "new"], updates=[40, 40], poll=0)
    assert lines[0].startswith("sweep: 2 cells, 80 updates in all (40 done before)")
    now[0] = 4.0
    write_rows(tmp_path / "new", 4)
    assert view.status().endswith("ETA 36s")  # 4 updates in 4 s, 36 left


def test_durations_read_as_a_person_writes_them() -> None:
    assert [duration(s) for s in (0.4, 45, 185, 3720)] == ["0s", "45s", "3m05s", "1h02m"]


def test_the_live_reward_is_the_one_reward() -> None:
    """A run's progress line shows the reward its summary and analyze report: the current policy's where the update
    has it, else the consumed batch's."""
    from offpolicylab.progress import progress_line

    stale = {"update": 3, "reward_mean": 0.25, "reward_current": 0.75}
    assert "reward 0.75" in progress_line(stale, 10, 1.0)
    assert "reward 0.25" in progress_line({**stale, "reward_current": float("nan")}, 10, 1.0)
