"""``offpolicylab run --profile``: the profile files in the run directory, the table on stderr, identical metrics."""

from __future__ import annotations

import pstats
from pathlib import Path

import pytest

from offpolicylab import cli
from offpolicylab.profiling import SECTIONS, breakdown
from offpolicylab.run_dir import RunDir
from tests.trainer.golden_runs import normalized_metrics

TINY = ["--world", "token_mdp", "--objective", "grpo", "--world-param", "vocab_size=3", "--world-param", "length=3",
        "--world-param", "num_prompts=2", "--prompts-per-update", "2", "--group-size", "4", "--updates", "6",
        "--eval-every", "3", "--sample-every", "0"]


def test_profile_writes_its_files_and_prints_the_sections(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", *TINY, "--out", str(tmp_path / "p"), "--profile"]) == 0
    err = capsys.readouterr().err
    assert "outside forward/backward" in err and "top 8 functions by own time" in err
    run = RunDir(tmp_path / "p")
    report = run.profile_path.read_text()
    for name in (*SECTIONS, "unsectioned"):
        assert f"\n{name} " in report
    assert "run_updates" in report  # the loop itself is among the functions by cumulative time
    stats = pstats.Stats(str(tmp_path / "p" / "profile.pstats"))
    assert any(func[2] == "run_updates" for func in stats.stats)  # type: ignore[attr-defined]
    assert not list((tmp_path / "p").glob(".*.tmp-*"))  # atomic writes leave no temp file
    run.clear()  # the profile files are files a run writes: clearing the run deletes them
    assert not run.profile_path.exists()


def test_profiled_run_has_the_metrics_of_a_plain_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", *TINY, "--out", str(tmp_path / "plain")]) == 0
    assert cli.main(["run", *TINY, "--out", str(tmp_path / "profiled"), "--profile"]) == 0
    assert normalized_metrics(tmp_path / "plain") == normalized_metrics(tmp_path / "profiled")
    assert not (tmp_path / "plain" / "profile.txt").exists()


def test_breakdown_shares_from_hand_numbers() -> None:
    """10 updates in 2 s: policy 0.5 + 0.3 s, eval 0.4 s → outside (2 − 0.8)/2 = 60 %, without evaluation
    (1.6 − 0.8)/1.6 = 50 %; 0.1 s in no section."""
    numbers = breakdown(10, 2.0, {"policy_forward": 0.5, "policy_backward": 0.3, "objective": 0.3, "other": 0.4,
                                  "eval": 0.4})
    assert numbers["updates_per_s"] == pytest.approx(5.0)
    assert numbers["outside_share"] == pytest.approx(0.6)
    assert numbers["outside_share_without_eval"] == pytest.approx(0.5)
    assert numbers["ms_per_update_unsectioned"] == pytest.approx(10.0)
    assert numbers["ms_per_update_total"] == pytest.approx(200.0)
