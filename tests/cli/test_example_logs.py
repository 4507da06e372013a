"""The example logs of examples/logs/ (written by make_logs.py) read as their engines' logs: analyze finds the
format, the steps and the reward, replay reads the recorded batches."""

from __future__ import annotations

import json
from pathlib import Path

from offpolicylab import analyze, cli

LOGS = Path(__file__).resolve().parents[2] / "examples" / "logs"


def test_verl_example_is_a_file_logger_log_of_sixty_steps() -> None:
    lines = (LOGS / "verl_m2po.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert set(first) == {"step", "data"} and first["step"] == 1  # verl's FileLogger record, steps from 1
    summary = analyze.analyze(LOGS / "verl_m2po.jsonl").summary
    assert (summary["format"], summary["steps"]) == ("verl", 60)
    rewards = [json.loads(line)["data"]["critic/score/mean"] for line in lines]
    assert summary["final_reward"] == rewards[-1] and summary["peak_reward"] == max(rewards)


def test_trl_example_is_a_trainer_state_of_twelve_steps() -> None:
    state = json.loads((LOGS / "trl_m2po" / "trainer_state.json").read_text())
    assert state["global_step"] == 12
    summary = analyze.analyze(LOGS / "trl_m2po").summary
    assert (summary["format"], summary["steps"]) == ("trl", 12)
    rewards = [record["reward"] for record in state["log_history"] if "reward" in record]
    assert summary["final_reward"] == rewards[-1]


def test_recorded_example_replays(tmp_path: Path) -> None:
    assert cli.main(["replay", str(LOGS / "trl_m2po_recorded"), "--objectives", "reinforce,grpo,m2po",
                     "--out", str(tmp_path / "replay")]) == 0
    assert (tmp_path / "replay" / "replay.csv").is_file()
