"""The command line: bad input (one line on stderr, exit 2, no run directory), SIGKILL + --resume, list, sweep."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from offpolicylab import cli
from offpolicylab.run_dir import RunDir
from tests.small_runs import read_rows

TINY = ["--world", "token_mdp", "--world-param", "vocab_size=3", "--world-param", "length=3",
        "--world-param", "num_prompts=2", "--prompts-per-update", "2", "--group-size", "4"]


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = cli.main(args)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("args", "named"), [
    (["--world", "nope", "--objective", "grpo"], "valid: bandit, three_arm_pitfall, token_mdp"),
    (["--world", "token_mdp", "--objective", "nope"], "valid: reinforce, grpo"),
    (["--world", "token_mdp", "--objective", "grpo", "--schedule", "sometimes"], "stale_k:K"),
    (["--world", "token_mdp", "--objective", "grpo", "--schedule", "stale_k:-2"], "K=-2 is out of range"),
    (["--world", "token_mdp", "--objective", "mispo", "--param", "tok_bounds=2,0.5"], "min ≤ max"),
    (["--world", "token_mdp", "--objective", "grpo", "--param", "eps_low=abc"], "valid: a float"),
    (["--world", "token_mdp", "--objective", "grpo", "--param", "bogus=1"], "valid: eps_low"),
    (["--world", "token_mdp", "--objective", "grpo", "--world-param", "vocab_size=many"], "valid: an int"),
    (["--world", "token_mdp", "--objective", "grpo", "--updates", "ten"], "valid: an int"),
    (["--world", "token_mdp", "--objective", "grpo", "--lr", "-1"], "valid: a float in (0, inf)"),
    (["--world", "token_mdp"], "--objective"),
])
def test_bad_input_one_line_exit_2_no_run(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                          named: str) -> None:
    code, out, err = run_cli(["run", *args, "--out", str(tmp_path / "run")], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and named in err, err
    assert not (tmp_path / "run").exists()


def test_unknown_command_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["fly"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "list" in err


def test_existing_run_and_corrupt_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = ["run", *TINY, "--objective", "grpo", "--updates", "3", "--out", str(tmp_path)]
    assert run_cli(run, capsys)[0] == 0
    summary_before = (tmp_path / "summary.json").read_text()
    code, _, err = run_cli(run, capsys)
    assert code == 2 and "already holds a run" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "summary.json").unlink()
    (tmp_path / "checkpoint" / "state.pt").write_bytes(b"\x00garbage")
    code, _, err = run_cli([*run, "--resume"], capsys)
    assert code == 2 and "corrupt checkpoint" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "summary.json").exists()  # nothing claims success
    assert json.loads(summary_before)["status"] == "completed"


def test_list_names_worlds_objectives_schedules(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["list"], capsys)
    assert code == 0
    for name in ("token_mdp", "three_arm_pitfall", "m2po", "eps_low=0.2", "stale_k:K", "mixture:P", "tabular"):
        assert name in out


def test_sigkill_then_resume_gives_identical_metrics(tmp_path: Path) -> None:
    args = ["run", *TINY, "--objective", "ac_mispo", "--schedule", "stale_k:3", "--updates", "80", "--seed", "4",
            "--eval-every", "7", "--sample-every", "10"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    command = [sys.executable, "-m", "offpolicylab", *args, "--out", str(tmp_path / "killed")]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = tmp_path / "killed" / "metrics.csv"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and metrics.read_text().count("\n") > 20:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    rows_at_kill = len(read_rows(tmp_path / "killed"))
    assert 20 <= rows_at_kill < 80 and not (tmp_path / "killed" / "summary.json").exists()
    resumed = subprocess.run([*command, "--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert cli.main([*args, "--out", str(tmp_path / "straight")]) == 0

    def strip(rows: list[dict[str, str]]) -> list[dict[str, str]]:
        return [{k: v for k, v in r.items() if not k.startswith("time_")} for r in rows]

    assert strip(read_rows(tmp_path / "killed")) == strip(read_rows(tmp_path / "straight"))
    assert [e["event"] for e in RunDir(tmp_path / "killed").read_events()] == ["resume"]
    assert json.loads((tmp_path / "killed" / "summary.json").read_text())["status"] == "completed"


def test_none_is_a_choice_of_a_string_parameter_and_no_value_of_an_optional_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code, _, err = run_cli(["run", "--world", "bandit", "--world-param", "rewards=0,0.5,1", "--objective", "mu_grpo",
                            "--param", "nav_scope=none", "--param", "tis_cap=none", "--updates", "2",
                            "--eval-every", "1", "--out", str(out)], capsys)
    assert code == 0, err
    stored = json.loads((out / "config.json").read_text())
    assert stored["objective_params"]["nav_scope"] == "none" and stored["objective_params"]["tis_cap"] is None
    assert stored["world_params"] == {"rewards": [0.0, 0.5, 1.0]} and stored["updates"] == 2
