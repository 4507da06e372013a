"""Policy-dependent defaults of TrainConfig (unset fields filled per policy, set ones kept), progress lines, and the
GPU bookkeeping of the trainer that a CPU can check (section synchronization, CUDA RNG state in checkpoints)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from offpolicylab import trainer
from offpolicylab.config import DEFAULTS, POLICY_DEFAULTS, TrainConfig
from offpolicylab.runs import RunDir
from offpolicylab.trainer import Stopwatch, describe_defaults, eval_line, progress_line
from tests.small_runs import mdp_config


def test_unset_fields_take_the_policy_default() -> None:
    toy, filled = TrainConfig(world="token_mdp", policy="tabular").with_defaults()
    assert (toy.lr, toy.eval_samples) == (0.05, 4) and filled == DEFAULTS
    llm, filled = TrainConfig(world="gsm8k", policy="hf").with_defaults()
    assert (llm.lr, llm.eval_samples) == (1e-4, 1) and filled == POLICY_DEFAULTS["hf"]
    assert 1e-5 <= llm.lr <= 2e-4  # the learning rates LoRA fine-tuning uses
    kept, filled = TrainConfig(world="gsm8k", policy="hf", lr=3e-5).with_defaults()
    assert kept.lr == 3e-5 and filled == {"eval_samples": 1}


def test_defaults_and_progress_lines_read_well() -> None:
    line = describe_defaults(TrainConfig(world="gsm8k", policy="hf", objective="m2po", lr=2e-4))
    assert line == "offpolicylab: gsm8k / hf / m2po / on_policy; defaults for policy hf: eval_samples=1"
    line = describe_defaults(TrainConfig(world="gsm8k", policy="hf", lr=2e-4, eval_samples=1), "micro-batches of 4")
    assert line == "offpolicylab: gsm8k / hf / grpo / on_policy; scoring: micro-batches of 4"
    row = {"update": 2, "reward_mean": 0.125, "loss": -0.5, "grad_norm": 1.0, "response_len": 40.0}
    assert progress_line(row, 30, 12.34) == "update 3/30  reward_mean 0.125  loss -0.5  grad_norm 1  response_len 40  12.3 s"
    row.update(eval_reward_sampled=0.25, eval_reward_greedy=float("nan"))
    assert eval_line(row, 3.0) == "  eval  eval_reward_sampled 0.25  3.0 s"


def test_stopwatch_synchronizes_around_each_section() -> None:
    calls: list[str] = []
    watch = Stopwatch(synchronize=lambda: calls.append("sync"))
    with watch("policy_forward"):
        calls.append("work")
    assert calls == ["sync", "work", "sync"] and watch.seconds["policy_forward"] >= 0.0
    assert Stopwatch().synchronize is (torch.cuda.synchronize if torch.cuda.is_available() else None)


def test_checkpoint_carries_the_cuda_rng_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dropout on a GPU draws from the CUDA generators: their states go into the checkpoint (through the
    weights-only loader) and come back on restore (CUDA faked here; the machine has none)."""
    states = [torch.arange(16, dtype=torch.uint8), torch.arange(16, 32, dtype=torch.uint8)]
    restored: list[list[torch.Tensor]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [s.clone() for s in states])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    parts = trainer.build(mdp_config())
    run = RunDir(tmp_path / "run")
    trainer.open_run(run, parts, resume=False)
    run.save_checkpoint(trainer.checkpoint_state(parts, 1))
    trainer.restore_state(parts, run.load_checkpoint())
    assert len(restored) == 1 and all(torch.equal(a, b) for a, b in zip(restored[0], states, strict=True))
