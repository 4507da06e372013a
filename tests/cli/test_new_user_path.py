"""The path a new user walks, as separate ``offpolicylab`` processes (what a shell runs): the demo in its small mode
(``--world token_mdp --updates 10``, with ``--report-to tensorboard``), ``analyze`` on one of its run directories
and on that run's TensorBoard folder, ``replay`` on the run, ``plot`` on the run, and one ``run``.  No
command prints a warning (or a traceback) on stderr, and the reward is one value everywhere: summary.json's
``final_reward``, the demo's table, sweep_results.csv, ``analyze`` (run directory and TensorBoard folder) and the
line ``run`` prints."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WARNING = re.compile(r"warn|traceback|error", re.IGNORECASE)


def offpolicylab(*args: str, cwd: Path) -> tuple[str, str]:
    """Run one command as a user would; its stdout and stderr (it must succeed)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    env.pop("PYTHONWARNINGS", None)
    done = subprocess.run([sys.executable, "-m", "offpolicylab", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, f"offpolicylab {' '.join(args)} exited {done.returncode}:\n{done.stderr[-2000:]}"
    return done.stdout, done.stderr


def no_warnings(stderr: str, command: str) -> None:
    lines = [line for line in stderr.splitlines() if WARNING.search(line)]
    assert not lines, f"{command} printed on stderr: {lines}"


def test_demo_analyze_replay_plot_run_without_warnings_and_with_one_reward(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    out, err = offpolicylab("demo", "--world", "token_mdp", "--updates", "10", "--workers", "1", "--out", "demo",
                            "--report-to", "tensorboard", cwd=tmp_path)
    no_warnings(err, "demo")
    assert err.splitlines()[0].startswith("demo: 4 runs of 10 updates on token_mdp")  # said before anything runs
    assert "figure: demo/demo.png" in out and (tmp_path / "demo" / "demo.png").is_file()
    cell = "objective=m2po"
    run = tmp_path / "demo" / cell
    summary = json.loads((run / "summary.json").read_text())
    final = summary["final_reward"]
    assert summary["reward_column"] == "reward_current" and summary["collapse_update"] is None

    table = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("objective=")}
    header = next(line.split() for line in out.splitlines() if line.startswith("cell "))
    assert table[cell][header.index("final_reward")] == f"{final:.4g}"  # as run and analyze print it
    with open(tmp_path / "demo" / "sweep_results.csv", newline="") as fh:
        results = {row["cell"]: row for row in csv.DictReader(fh)}
    assert float(results[cell]["final_reward"]) == pytest.approx(final, rel=1e-6)

    for name, source in (("a_run", str(run.relative_to(tmp_path))),
                         ("a_tb", str((run / "tracking" / "tensorboard").relative_to(tmp_path)))):
        out, err = offpolicylab("analyze", source, "--out", name, cwd=tmp_path)
        no_warnings(err, f"analyze {source}")
        assert f"final {final:.4g}" in out
        analysis = json.loads((tmp_path / name / "summary.json").read_text())
        assert analysis["final_reward"] == pytest.approx(final, rel=1e-6) and analysis["status"] == summary["status"]
        assert analysis["final_eval_reward"] == pytest.approx(summary["final_eval_reward_sampled"], rel=1e-6)

    out, err = offpolicylab("replay", str(run.relative_to(tmp_path)), "--out", "replay", cwd=tmp_path)
    no_warnings(err, "replay")
    assert (tmp_path / "replay" / "replay.csv").is_file()
    out, err = offpolicylab("plot", str(run.relative_to(tmp_path)), "--out", "figures", cwd=tmp_path)
    no_warnings(err, "plot")
    assert (tmp_path / "figures" / "training_curves.png").is_file()

    out, err = offpolicylab("run", "--world", "token_mdp", "--world-param", "family=target", "--world-param",
                            "vocab_size=4", "--world-param", "length=5", "--world-param", "num_prompts=4", "--policy",
                            "tabular", "--objective", "m2po", "--schedule", "stale_k:2", "--updates", "10",
                            "--prompts-per-update", "4", "--group-size", "8", "--lr", "0.1", "--eval-every", "5",
                            "--sample-every", "20", "--checkpoint-every", "20", "--seed", "0", "--out", "again",
                            cwd=tmp_path)  # the demo's m2po cell (stale_k:2 at 10 updates), as one run
    no_warnings(err, "run")
    again = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert again["final_reward"] == final  # the same config gives the same run
    assert f"final_reward={final:.4g}" in out
