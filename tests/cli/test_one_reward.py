"""One reward vocabulary (docs/metrics.md, "One reward"): a run's ``summary.json``, the ``run`` console line,
``analyze`` on the run directory and on its own ``--report-to tensorboard`` folder report the same reward; our
``kl_ref`` column is the KL ``analyze`` reads; the TensorBoard tags do not repeat their group; verl's
``val-core/*`` and TRL's ``eval_*`` evaluation rewards are read; summaries of earlier versions read in today's
words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offpolicylab import analyze, cli, logs
from offpolicylab.run_dir import RunDir, upgrade_summary
from offpolicylab.tracking import scalar_name
from offpolicylab.trainer import train
from tests.small_runs import mdp_config


def test_tensorboard_tags_name_their_group_once() -> None:
    expected = {"eval_reward_sampled": "eval/reward_sampled", "exact_return": "eval/exact_return",
                "time_update_s": "time/update_s", "reward_current": "train/reward_current", "m2_tr": "train/m2_tr"}
    for column, tag in expected.items():
        assert scalar_name(column) == tag and logs.column_of_tag(tag) == column
    # the doubled tags of earlier versions read back as the same columns; histograms and text are no column
    assert logs.column_of_tag("eval/eval_reward_sampled") == "eval_reward_sampled"
    assert logs.column_of_tag("time/time_update_s") == "time_update_s"
    assert logs.column_of_tag("hist/log_ratio") is None and logs.column_of_tag("config/text_summary") is None


def test_run_summary_console_and_analyze_report_one_reward(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A stale run with the KL penalty on, tracked to TensorBoard: summary.json's final_reward (the current policy's
    reward, ``reward_current``), the number ``run`` prints, and analyze's final reward on the run directory and on
    its TensorBoard folder agree; collapse_update is null when nothing collapsed; analyze reads our ``kl_ref``."""
    pytest.importorskip("tensorboard")
    out = tmp_path / "run"
    assert cli.main(["run", "--world", "token_mdp", "--objective", "grpo", "--schedule", "stale_k:2", "--updates", "6",
                     "--param", "kl_coef=0.1", "--world-param", "vocab_size=3", "--world-param", "length=3",
                     "--world-param", "num_prompts=2", "--prompts-per-update", "2", "--group-size", "4",
                     "--eval-every", "3", "--report-to", "tensorboard", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    summary = RunDir(out).read_summary()
    assert summary is not None and summary["reward_column"] == "reward_current"
    assert summary["final_reward"] == summary["final_reward_current"] != summary["final_reward_mean"]
    assert summary["collapse_update"] is None and json.loads((out / "summary.json").read_text())["collapse_update"] is None
    assert f"final_reward={summary['final_reward']:.4g}" in printed

    from_dir = analyze.analyze(out)
    assert from_dir.summary["final_reward"] == summary["final_reward"]
    assert from_dir.summary["peak_reward"] == summary["peak_reward"]
    assert from_dir.summary["peak_reward_step"] == summary["peak_reward_update"]
    assert from_dir.sources["kl_ref"] == "kl_ref"  # the KL penalty's own column, not the evaluation's KL to π₀
    assert from_dir.summary["final_eval_reward"] == summary["final_eval_reward_sampled"]

    from_tb = analyze.analyze(out / "tracking" / "tensorboard")
    assert (from_tb.summary["format"], from_tb.summary["names"]) == ("tensorboard", "offpolicylab")
    assert from_tb.summary["final_reward"] == pytest.approx(summary["final_reward"], rel=1e-6)  # float32 events
    assert from_tb.summary["status"] == from_dir.summary["status"] and from_tb.sources["kl_ref"] == "kl_ref"
    assert set(from_tb.metrics) == set(from_dir.metrics)


def test_an_offline_runs_empty_current_reward_falls_back_to_the_batch_reward(tmp_path: Path) -> None:
    """A column of NaN (no current-policy responses) is passed over for the next name of the metric."""
    run = RunDir(tmp_path / "run")
    run.create({"objective": "grpo"})
    for update in range(3):
        run.append_metrics({"update": update, "reward_mean": 0.1 * update, "reward_current": float("nan")})
    summary = run.write_summary("completed")
    run.close()
    assert summary["reward_column"] == "reward_mean" and summary["final_reward"] == pytest.approx(0.2)
    analysis = analyze.analyze(run.path)
    assert analysis.sources["reward_mean"] == "reward_mean" and analysis.summary["final_reward"] == pytest.approx(0.2)


def test_summaries_of_earlier_versions_read_in_todays_words() -> None:
    old = {"status": "completed", "final_reward_mean": 0.5, "peak_reward_mean": 0.75, "peak_reward_mean_update": 3,
           "final_reward_current": 0.625, "peak_reward_current": 0.875, "peak_reward_current_update": 4,
           "collapse_update": -1}
    new = upgrade_summary(old)
    assert (new["final_reward"], new["peak_reward"], new["peak_reward_update"]) == (0.625, 0.875, 4)
    assert new["collapse_update"] is None and upgrade_summary(new) == new
    assert upgrade_summary({"final_reward_mean": 0.5})["final_reward"] == 0.5


def test_verl_validation_and_trl_evaluation_rewards_are_read(tmp_path: Path) -> None:
    verl = tmp_path / "verl.jsonl"
    verl.write_text("".join(json.dumps({"step": step, "data": {
        "critic/score/mean": 0.1 * step, **({"val-core/openai/gsm8k/reward/mean@4": 0.2 * step} if step % 2 else {})}})
        + "\n" for step in range(1, 6)))
    summary = analyze.analyze(verl).summary
    assert summary["metrics"]["eval_reward"] == "val-core/openai/gsm8k/reward/mean@4"
    assert (summary["final_eval_reward"], summary["final_eval_reward_step"]) == (pytest.approx(1.0), 5)

    state = tmp_path / "trl" / "trainer_state.json"
    state.parent.mkdir()
    history = [{"step": step, "reward": 0.1 * step, "loss": 0.0} for step in range(1, 5)]
    history += [{"step": 2, "eval_reward": 0.5, "eval_loss": 1.0}, {"step": 4, "eval_reward": 0.25}]
    state.write_text(json.dumps({"log_history": history}))
    summary = analyze.analyze(state.parent).summary
    assert summary["metrics"]["eval_reward"] == "eval_reward" and summary["final_reward"] == pytest.approx(0.4)
    assert (summary["peak_eval_reward"], summary["peak_eval_reward_step"], summary["final_eval_reward"]) == (0.5, 2,
                                                                                                        0.25)


def test_trl_tensorboard_evaluation_tags_are_read(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "tb"))
    for step in range(1, 5):
        writer.add_scalar("train/reward", 0.1 * step, step)
    writer.add_scalar("eval/reward", 0.75, 4)
    writer.close()
    summary = analyze.analyze(tmp_path / "tb").summary
    assert summary["names"] == "trl" and summary["metrics"]["eval_reward"] == "eval_reward"
    assert summary["final_eval_reward"] == pytest.approx(0.75)


def test_docs_list_every_column_a_run_writes(tmp_path: Path) -> None:
    """docs/metrics.md names every metrics.csv column of every objective (m2po in both variants), with the KL
    penalty and evaluation on; the sampler columns of the LLM path are named too."""
    from offpolicylab.objectives import OBJECTIVES
    from tests.small_runs import read_rows

    page = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    runs = [(name, {"kl_coef": 0.1}) for name in OBJECTIVES.names()] + [("m2po", {"kl_coef": 0.1, "variant": "cap"})]
    columns: set[str] = {"sampler_log_ratio_abs_mean", "sampler_log_ratio_abs_max", "sampler_kl"}
    for index, (name, params) in enumerate(runs):
        out = tmp_path / f"{index}"
        train(mdp_config(objective=name, objective_params=params, updates=1, eval_every=1, sample_every=0), out)
        columns |= set(read_rows(out)[0])
    assert {"m2_tr", "tr_frac", "m2_tr_after", "m2po_bound", "kl_ref"} <= columns
    missing = sorted(column for column in columns if f"`{column}`" not in page)
    assert not missing, f"docs/metrics.md does not name {missing}"
