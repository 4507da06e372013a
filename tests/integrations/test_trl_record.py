"""A real TRL GRPOTrainer run (tiny random Llama, CPU) recorded into an offpolicylab run directory: the recorded
log-ratios are the ones the test computes itself from the model, ``replay`` reproduces the mask fractions TRL
logged for the run, and ``analyze`` reads the run's trainer_state.json, TensorBoard events and record alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

pytest.importorskip("trl")  # optional extra (installed here and in CI)

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from offpolicylab import analyze, cli  # noqa: E402
from offpolicylab.run_records import load_run, load_samples  # noqa: E402
from tests.integrations.test_trl import (  # noqa: E402
    RecordingTrainer,
    completion_logp,
    digit_reward,
    tiny_model,
    tiny_tokenizer,
)

STEPS = 4
TAU = 0.01


class CheckingTrainer(RecordingTrainer):
    """Computes, before each training loss, log π_θ − log π_old of the completion tokens straight from the logits
    (an oracle independent of the trainer's own scoring)."""

    expected: list[np.ndarray]

    def _compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        if model.training:
            with torch.no_grad():
                logp = completion_logp(model, inputs)
            old = inputs.get("old_per_token_logps")
            old = logp if old is None else old.double()
            mask = inputs["completion_mask"].bool()
            self.expected.append((logp - old)[mask].numpy())
        return super()._compute_loss(model, inputs)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("trl_record")
    tokenizer = tiny_tokenizer()
    dataset = Dataset.from_dict({"prompt": ["add one two", "add two three", "the answer is", "add three one"]})
    args = GRPOConfig(output_dir=str(root / "out"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=6, max_steps=STEPS, learning_rate=5e-2, temperature=1.0,
                      report_to="tensorboard", use_cpu=True, save_strategy="no", logging_steps=1, seed=0,
                      disable_tqdm=True, num_iterations=2)
    trainer = CheckingTrainer(model=tiny_model(len(tokenizer)), reward_funcs=digit_reward, args=args,
                              train_dataset=dataset, processing_class=tokenizer, objective="m2po",
                              objective_params={"tau": TAU}, record_dir=root / "record")
    trainer.expected = []
    trainer.train()
    trainer.save_state()
    logged = {record["step"]: record for record in trainer.state.log_history if "loss" in record}
    return {"root": root, "record": root / "record", "out": root / "out", "logged": logged,
            "expected": trainer.expected}


def test_record_holds_the_log_ratios_of_the_run(recorded: dict[str, Any]) -> None:
    run = load_run(recorded["record"])
    assert run.config["engine"] == "trl" and run.objective == "m2po" and run.config["objective_params"]["tau"] == TAU
    assert len(run.sample_files) == STEPS and len(recorded["expected"]) == STEPS
    for path, expected in zip(run.sample_files, recorded["expected"], strict=True):
        arrays = load_samples(path)
        got = arrays["batch_log_ratio"][arrays["batch_mask"] > 0]
        np.testing.assert_allclose(got, expected, atol=2e-5)
    assert max(np.abs(e).max() for e in recorded["expected"]) > 0.05  # off-policy steps, not ratios of 1


def test_record_rows_are_what_trl_logged(recorded: dict[str, Any]) -> None:
    """Update u is TRL's step u + 1: same mask fraction; num_iterations = 2 alternates fresh and one-step-old data,
    and TRL logs the reward when it generates (the step after trains on the same batch, so it keeps that reward)."""
    metrics = load_run(recorded["record"]).metrics
    logged = recorded["logged"]
    assert list(metrics["update"]) == list(range(STEPS))
    assert list(metrics["staleness_mean"]) == [0.0, 1.0] * (STEPS // 2)
    for update in range(STEPS):
        step = logged[update + 1]
        generated = logged[update + 1 - update % 2]
        assert ("reward" in step) == (update % 2 == 0)
        assert metrics["reward_mean"][update] == pytest.approx(generated["reward"], rel=1e-6)
        assert metrics["mask_frac"][update] == pytest.approx(step["offpolicylab/mask_frac"], abs=1e-6)
    assert max(metrics["mask_frac"]) > 0  # M2PO masked something in this run


def test_replay_reproduces_the_runs_mask_fractions(recorded: dict[str, Any], tmp_path: Path) -> None:
    logged = recorded["logged"]
    for update in range(STEPS):
        out = tmp_path / f"u{update}"
        assert cli.main(["replay", str(recorded["record"]), "--objectives", "m2po,grpo", "--updates",
                         f"{update}:{update}", "--out", str(out)]) == 0
        rows = {row["objective"]: row for row in json.loads((out / "replay.json").read_text())["rows"]}
        assert rows["m2po"]["as_run"] == 1.0
        assert rows["m2po"]["silenced"] == pytest.approx(logged[update + 1]["offpolicylab/mask_frac"], abs=1e-6)


def test_analyze_reads_the_trl_run_three_ways(recorded: dict[str, Any]) -> None:
    rewards = {step: record["reward"] for step, record in recorded["logged"].items() if "reward" in record}
    peak = max(rewards.values())
    state = analyze.analyze(recorded["out"]).summary
    events = analyze.analyze(recorded["out"] / "runs").summary
    record = analyze.analyze(recorded["record"]).summary
    assert (state["format"], events["format"], record["format"]) == ("trl", "tensorboard", "offpolicylab")
    for summary in (state, events, record):
        assert summary["status"] == "completed" and summary["steps"] == STEPS
        assert summary["peak_reward"] == pytest.approx(peak, rel=1e-6)
    assert state["metrics"]["mask_frac"] == "offpolicylab/mask_frac"  # our plug-in's metric under its own name
    assert record["peak_reward_step"] == state["peak_reward_step"] - 1  # update u = TRL step u + 1


def test_replay_shows_the_trl_runs_raw_ratios_before_any_truncation(recorded: dict[str, Any], tmp_path: Path) -> None:
    """The forensics TRL users ask for (its logged ratios are already truncated or masked) on a real TRL run:
    ``replay`` writes the raw log π_θ − log π_old of every recorded token (no clip, cap or mask applied), binned;
    the counts are the histogram of the log-ratios this test computed itself from the model's logits at each
    training step.  The run recorded no sampler log-probs (no vLLM), so ``--corrections`` is refused, naming why."""
    from offpolicylab.recorded import RAW_EDGES

    out = tmp_path / "forensics"
    assert cli.main(["replay", str(recorded["record"]), "--objectives", "grpo", "--out", str(out)]) == 0
    rows = [row for row in pd.read_csv(out / "replay_raw_log_ratios.csv").to_dict("records")
            if row["ratio"] == "staleness"]
    got = np.zeros(RAW_EDGES.size - 1, dtype=np.int64)
    for row in rows:
        got[int(np.searchsorted(RAW_EDGES, row["bin_low"]))] += row["count"]
    expected, _ = np.histogram(np.concatenate(recorded["expected"]), bins=RAW_EDGES)
    assert got.tolist() == expected.tolist() and got.sum() > 0
    assert {row["lag"] for row in rows} == {0.0, 1.0}  # num_iterations = 2: fresh and one-step-old batches
    with pytest.raises(SystemExit) as refused:
        cli.main(["replay", str(recorded["record"]), "--objectives", "grpo", "--corrections", "trl",
                  "--out", str(tmp_path / "corrections")])
    assert refused.value.code == 2 and not (tmp_path / "corrections").exists()
    figures = tmp_path / "figures"  # the same forensics as a figure: plot on the recorded run
    assert cli.main(["plot", str(recorded["record"]), "--figures", "raw_log_ratios", "--out", str(figures)]) == 0
    assert (figures / "raw_log_ratios.png").stat().st_size > 0
    table = pd.read_csv(figures / "raw_log_ratios.csv")
    assert int(table[table["ratio"] == "staleness"]["count"].sum()) == int(expected.sum())
