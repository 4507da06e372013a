"""``offpolicylab analyze``: logs written by TRL's own Trainer (trainer_state.json and its TensorBoard events) and
by the SummaryWriter that verl's TensorBoard logger uses, for a run that prospers and collapses and a healthy one
(tests/analyze_curves.py); our own run directories; the mapping table in the docs; bad input.

verl's own FileLogger is exercised in the verl environment (tests/integrations/test_verl.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from offpolicylab import analyze, cli, logs
from tests.analyze_curves import SPIKE_STEP, TRL_NAMES, VERL_NAMES, history

ROOT = Path(__file__).resolve().parents[2]


def trl_trainer(output_dir: Path, report_to: str = "tensorboard"):
    """A real TRL GRPO trainer on a tiny model (never trained here: the test drives its logging)."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import GRPOConfig

    from offpolicylab.integrations.trl import OffPolicyLabGRPOTrainer
    from tests.integrations.test_trl import digit_reward, tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    args = GRPOConfig(output_dir=str(output_dir), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=4, report_to=report_to, use_cpu=True, save_strategy="no",
                      logging_steps=1, disable_tqdm=True)
    trainer = OffPolicyLabGRPOTrainer(model=tiny_model(len(tokenizer)), reward_funcs=digit_reward, args=args,
                                      train_dataset=Dataset.from_dict({"prompt": ["add one two"] * 4}),
                                      processing_class=tokenizer, objective="grpo")
    trainer.model.train()
    return trainer


def write_trl_log(output_dir: Path, kind: str) -> Path:
    """TRL's GRPOTrainer logs each step as in training: the loss-side metrics go to its ``_metrics``, then
    ``Trainer.log`` writes ``log_history`` (and, through transformers' TensorBoard callback, event files);
    ``save_state`` writes trainer_state.json."""
    trainer = trl_trainer(output_dir)
    trainer.callback_handler.on_train_begin(trainer.args, trainer.state, trainer.control)  # as train() does
    for row in history(kind):
        trainer.state.global_step = row["step"]
        for ours in ("reward", "kl", "entropy", "clip_frac"):
            trainer._metrics["train"][TRL_NAMES[ours]].append(row[ours])
        trainer.log({"loss": 0.0, "grad_norm": row["grad_norm"], "learning_rate": 1e-6})
    trainer.save_state()
    trainer.callback_handler.on_train_end(trainer.args, trainer.state, trainer.control)
    return output_dir


def write_verl_tensorboard(folder: Path, kind: str) -> Path:
    """What verl's TensorBoard logger does: ``SummaryWriter(dir).add_scalar(name, value, step)`` per metric."""
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder))
    for row in history(kind):
        for ours, name in VERL_NAMES.items():
            writer.add_scalar(name, row[ours], row["step"])
    writer.close()
    return folder


# ------------------------------------------------------------------------------------------------ must-shows
@pytest.mark.parametrize("kind", ["collapsing", "healthy"])
def test_trl_trainer_state_collapse_is_flagged_and_healthy_is_not(tmp_path: Path, kind: str) -> None:
    out = write_trl_log(tmp_path / "trl", kind)
    summary = analyze.write(analyze.analyze(out), tmp_path / "analysis")
    expected = history(kind)
    rewards = {row["step"]: row["reward"] for row in expected}
    assert summary["format"] == "trl" and summary["steps"] == len(expected)
    assert summary["detector"] == {**summary["detector"], "reward": "reward", "kl": "kl", "grad_norm": "grad_norm"}
    peak_step = max(rewards, key=rewards.get)
    assert summary["peak_reward_step"] == peak_step and summary["peak_reward"] == pytest.approx(rewards[peak_step])
    assert summary["final_reward"] == pytest.approx(rewards[max(rewards)])
    if kind == "collapsing":
        assert summary["status"] == "collapsed"
        assert SPIKE_STEP <= summary["collapse_step"] <= SPIKE_STEP + 20
        assert peak_step <= SPIKE_STEP
    else:
        assert summary["status"] == "completed" and summary["collapse_step"] is None
        assert 60 in summary["detector"]["spike_steps"]  # the isolated spike was seen, and not called a collapse
    assert json.loads((tmp_path / "analysis" / "summary.json").read_text()) == summary
    assert {"reward.png", "spikes.png", "clipping.png", "entropy.png"} <= set(summary["figures"])
    assert all((tmp_path / "analysis" / name).stat().st_size > 0 for name in summary["figures"])


@pytest.mark.parametrize("kind", ["collapsing", "healthy"])
def test_tensorboard_events_of_trl_and_verl_give_the_trainer_state_verdict(tmp_path: Path, kind: str) -> None:
    out = write_trl_log(tmp_path / "trl", kind)
    from_state = analyze.analyze(out).summary
    trl_events = analyze.analyze(out / "runs").summary
    verl_events = analyze.analyze(write_verl_tensorboard(tmp_path / "verl_tb", kind)).summary
    assert (trl_events["format"], trl_events["names"]) == ("tensorboard", "trl")
    assert (verl_events["format"], verl_events["names"]) == ("tensorboard", "verl")
    assert verl_events["detector"]["reward"] == "critic/score/mean"
    assert verl_events["detector"]["kl"] == "actor/ppo_kl" and verl_events["detector"]["kl_as"] == "kl_k1"
    for summary in (trl_events, verl_events):
        assert summary["status"] == from_state["status"]
        assert summary["collapse_step"] == from_state["collapse_step"]
        assert summary["peak_reward_step"] == from_state["peak_reward_step"]
        assert summary["peak_reward"] == pytest.approx(from_state["peak_reward"], rel=1e-6)  # TB stores float32


def test_a_sustained_fall_without_a_spike_is_a_collapse_by_the_fall_alone(tmp_path: Path) -> None:
    """The collapsing reward curve with its KL and gradient-norm spike taken out: no spike, so the spike detector
    stays silent, but the reward r_s = r_90·e^(−(s − 90)/5), r_90 ≈ 0.77, is below a fifth of its peak from
    s = 99 on (90 + 5·ln 5 ≈ 98.1); the median of the last 9 falling values is the one 4 steps back, so the verdict
    is ``collapsed`` at step 103 by the sustained-fall rule."""
    from torch.utils.tensorboard import SummaryWriter

    pytest.importorskip("tensorboard")
    writer = SummaryWriter(str(tmp_path))
    for row in history("collapsing"):
        for ours, name in VERL_NAMES.items():
            calm = {"kl": 0.01, "grad_norm": 0.5}.get(ours, row[ours])
            writer.add_scalar(name, calm, row["step"])
    writer.close()
    summary = analyze.analyze(tmp_path).summary
    assert summary["detector"]["spike_steps"] == []
    assert summary["status"] == "collapsed" and summary["peak_reward"] - summary["final_reward"] > 0.5
    assert summary["collapse_step"] == 103 and "below 0.2 of its peak" in summary["collapse_reason"]


def test_our_run_directory_gives_the_trainers_own_verdict(tmp_path: Path) -> None:
    """A run whose loss turns NaN at update 2 is ``collapsed`` there by the trainer; analyze reads the same."""
    from offpolicylab import trainer
    from offpolicylab.run_dir import RunDir
    from tests.small_runs import mdp_config

    healthy = tmp_path / "healthy"
    trainer.train(mdp_config(updates=6), healthy)
    summary = analyze.analyze(healthy).summary
    rows = RunDir(healthy).read_metrics()
    assert summary["format"] == "offpolicylab" and summary["status"] == "completed"
    assert summary["steps"] == 6 and summary["detector"]["reward"] == "reward_current"
    assert summary["final_reward"] == pytest.approx(float(rows[-1]["reward_current"]))

    broken = tmp_path / "broken"
    run = RunDir(broken)
    run.create({"objective": "grpo"})
    for update, loss in enumerate([0.1, 0.2, math.nan]):
        run.append_metrics({"update": update, "loss": loss, "grad_norm": 0.5, "reward_mean": 0.5, "kl_k3": 0.01})
    run.close()
    summary = analyze.analyze(broken).summary
    assert summary["status"] == "collapsed" and summary["collapse_step"] == 2
    assert summary["collapse_reason"] == "non-finite loss or gradient"


def test_cli_analyze_writes_summary_and_prints_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = write_trl_log(tmp_path / "trl", "collapsing")
    assert cli.main(["analyze", str(out), "--out", str(tmp_path / "a")]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert printed[-1].startswith(f"{out} (trl, 150 steps): collapsed at step {summary['collapse_step']}")


# ------------------------------------------------------------------------------------------------ mapping
def test_docs_show_the_mapping_table_of_the_code() -> None:
    page = (ROOT / "docs" / "diagnosing.md").read_text()
    assert logs.mapping_table() in page


def test_mapping_prefers_our_plugin_metrics_and_reads_every_name_in_the_table(tmp_path: Path) -> None:
    log = logs.Log(tmp_path, "verl")
    for metric in logs.METRIC_NAMES:
        for number, name in enumerate(metric.verl):
            log.add(1, name, float(number))
    log.add(1, "actor/offpolicylab/clip_frac", 0.25)
    metrics, sources = logs.canonical(log)
    assert sources["clip_frac"] == "actor/offpolicylab/clip_frac" and metrics["clip_frac"] == {1: 0.25}
    for metric in logs.METRIC_NAMES:
        if metric.verl and metric.ours != "clip_frac":
            assert sources[metric.ours] == metric.verl[0] and metrics[metric.ours] == {1: 0.0}


# ------------------------------------------------------------------------------------------------ bad input
def bad_cases(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """input → (path, the start of the expected message)."""
    csv = tmp_path / "metrics_export.csv"
    csv.write_text("step,reward\n1,0.5\n")
    events = tmp_path / "events.jsonl"
    events.write_text('{"event": "resume", "update": 2}\n{"event": "collapse", "update": 3}\n')
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]\n")
    other = tmp_path / "other.json"
    other.write_text('{"model": "x"}\n')
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    state = tmp_path / "state" / "trainer_state.json"
    state.parent.mkdir()
    state.write_text(json.dumps({"log_history": [{"step": 1, "reward": 0.5}, {"step": 2, "reward": 0.6}]},
                                indent=2)[:40])
    verl_mid = tmp_path / "torn_middle.jsonl"
    verl_mid.write_text('{"step": 1, "data": {"critic/score/mean": 0.5}}\n{"step": 2, "da\n'
                        '{"step": 3, "data": {"critic/score/mean": 0.5}}\n')
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    (nothing / "notes.txt").write_text("hello\n")
    no_reward = tmp_path / "no_reward"
    no_reward.mkdir()
    (no_reward / "trainer_state.json").write_text(json.dumps({"log_history": [{"step": 1, "loss": 2.0}]}))
    two_jsonl = tmp_path / "two_jsonl"
    two_jsonl.mkdir()
    for name in ("a", "b"):
        (two_jsonl / f"{name}.jsonl").write_text('{"step": 1, "data": {"critic/score/mean": 0.5}}\n')
    two_runs = tmp_path / "two_runs"
    for name in ("run1", "run2"):
        write_verl_tensorboard(two_runs / name, "healthy")
    blank_events = tmp_path / "blank_events"
    blank_events.mkdir()
    (blank_events / "events.out.tfevents.1.host").write_bytes(b"")
    return {
        "several .jsonl files": (two_jsonl, "holds 2 .jsonl files (a.jsonl, b.jsonl)"),
        "event files of several runs": (two_runs, "holds the event files of 2 runs (run1, run2)"),
        "event files without scalars": (blank_events, "holds event files without scalars"),
        "wrong format (CSV)": (csv, "is not a log analyze reads (it does not start with a JSON object)"),
        "wrong format (our events.jsonl)": (events, "events.jsonl:1: not a verl FileLogger record"),
        "wrong format (a JSON list)": (listed, "is not a log analyze reads"),
        "wrong format (another JSON object)": (other, "is a JSON object without log_history (TRL) or step and data"),
        "empty file": (empty, "is empty"),
        "truncated JSON (trainer_state.json)": (state, "is truncated or damaged JSON"),
        "damaged line (verl)": (verl_mid, "torn_middle.jsonl:2: not valid JSON"),
        "a folder with none of the files": (nothing, "holds none of the logs analyze reads"),
        "no reward": (no_reward, "logs no reward"),
        "missing path": (tmp_path / "absent", "does not exist"),
    }


def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for case, (path, message) in bad_cases(tmp_path).items():
        out = tmp_path / f"out-{abs(hash(case))}"
        with pytest.raises(SystemExit) as stop:
            cli.main(["analyze", str(path), "--out", str(out)])
        err = capsys.readouterr().err
        assert stop.value.code == 2, case
        assert err.count("\n") == 1 and err.startswith("offpolicylab: error: ") and message in err, (case, err)
        assert "valid" in err, (case, err)
        assert not out.exists(), case


def test_a_torn_last_verl_line_is_left_out_with_a_note(tmp_path: Path) -> None:
    """verl writes each line in one unbuffered write; a kill can cut the last one (no newline after it)."""
    from offpolicylab.run_dir import write_text_atomically

    path = tmp_path / "run.jsonl"
    lines = [json.dumps({"step": s, "data": {"critic/score/mean": 0.1 * s}}) for s in (1, 2, 3)]
    write_text_atomically(path, "\n".join(lines)[:-7])
    log = logs.read_log(path)
    assert log.format == "verl" and log.series["critic/score/mean"] == {1: 0.1, 2: 0.2}
    assert log.notes == [f"{path}:3: a torn last line (no newline, not JSON) was left out"]


def test_out_must_not_be_the_analysed_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from offpolicylab import trainer
    from tests.small_runs import mdp_config

    trainer.train(mdp_config(updates=2, eval_every=2, sample_every=0), tmp_path / "run")
    with pytest.raises(SystemExit):
        cli.main(["analyze", str(tmp_path / "run"), "--out", str(tmp_path / "run")])
    assert "is the log's own folder" in capsys.readouterr().err


def test_a_trl_output_folder_is_read_from_its_latest_checkpoint(tmp_path: Path) -> None:
    """Without a trainer_state.json of its own, the checkpoint with the highest step number (10 > 9 > 2)."""
    for step in (2, 9, 10):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        history = [{"step": s, "reward": 0.1 * s, "loss": 1.0} for s in range(1, step + 1)]
        (folder / "trainer_state.json").write_text(json.dumps({"log_history": history, "global_step": step}))
    log = logs.read_log(tmp_path)
    assert log.path == tmp_path / "checkpoint-10" / "trainer_state.json" and log.steps == list(range(1, 11))


def test_non_finite_values_count_as_not_logged(tmp_path: Path) -> None:
    """An fp16 run's infinite gradient norm at a skipped step is not a spike, and a null reward is not a drop."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    for row in history("healthy"):
        grad = math.inf if row["step"] % 25 == 0 else row["grad_norm"]
        reward = math.nan if row["step"] % 30 == 0 else row["reward"]
        for name, value in (("critic/score/mean", reward), ("actor/grad_norm", grad), ("actor/ppo_kl", row["kl"])):
            writer.add_scalar(name, value, row["step"])
    writer.close()
    summary = analyze.analyze(tmp_path).summary
    assert summary["status"] == "completed"
    assert summary["not_finite"] == {"grad_norm": 6, "reward_mean": 5}
    assert not set(summary["detector"]["spike_steps"]) & {25, 50, 75, 100, 125, 150}


def test_analyze_reports_the_collapse_warning_of_the_chosen_detector(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A verl log whose gradient norm jumps 1 → 10 at step 50: ess_grad (20-step average above 3 × the median for
    5 steps) first holds at the k-th high step, (1 − α)^k < 7/9 with α = 2/21, and fires 4 steps later; the default
    (kl_slope) stays silent on a flat KL; --detector names another detector."""
    log = tmp_path / "run.jsonl"
    with open(log, "w") as fh:
        for step in range(100):
            data = {"critic/score/mean": 0.5, "actor/grad_norm": 1.0 if step < 50 else 10.0, "actor/ppo_kl": 0.001}
            fh.write(json.dumps({"step": step, "data": data}) + "\n")
    k = math.floor(math.log(7 / 9) / math.log(1 - 2 / 21)) + 1
    assert cli.main(["analyze", str(log), "--out", str(tmp_path / "d")]) == 0
    assert json.loads((tmp_path / "d" / "summary.json").read_text())["warning"]["steps"] == []
    capsys.readouterr()
    assert cli.main(["analyze", str(log), "--out", str(tmp_path / "a"), "--detector", "ess_grad"]) == 0
    warned = json.loads((tmp_path / "a" / "summary.json").read_text())["warning"]
    assert warned["detector"] == "ess_grad" and warned["first_step"] == 50 + k - 1 + 4
    assert "gradient norm" in warned["reason"]
    assert f"collapse warning (ess_grad) at step {50 + k + 3}" in capsys.readouterr().out
    assert cli.main(["analyze", str(log), "--out", str(tmp_path / "b"), "--detector", "reward_spike"]) == 0
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["warning"]["steps"] == []
