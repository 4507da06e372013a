"""World- and policy-dependent defaults of TrainConfig (unset fields filled in one place, set ones kept), the start
and progress lines, and the
GPU bookkeeping of the trainer that a CPU can check (section synchronization, CUDA RNG state in checkpoints)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from offpolicylab.build import build
from offpolicylab.config import DEFAULTS, POLICY_DEFAULTS, TrainConfig, chosen_defaults
from offpolicylab.lifecycle import checkpoint_state, open_run, restore_state
from offpolicylab.profiling import Stopwatch
from offpolicylab.progress import describe_run, eval_line, progress_line
from offpolicylab.run_dir import RunDir
from offpolicylab.worlds import WORLDS
from tests.small_runs import mdp_config


def test_unset_fields_take_the_world_then_the_policy_default() -> None:
    toy = TrainConfig(world="token_mdp", policy="tabular")
    assert (toy.lr, toy.eval_samples, toy.optimizer) == (0.05, 4, "adam") and toy.sources()["lr"] == "default"
    llm = TrainConfig(world="gsm8k", policy="hf")
    assert (llm.lr, llm.eval_samples) == (1e-4, 1) and llm.sources()["lr"] == "policy hf"
    assert 1e-5 <= llm.lr <= 2e-4  # the learning rates LoRA fine-tuning uses
    kept = TrainConfig(world="gsm8k", policy="hf", lr=3e-5)
    assert kept.lr == 3e-5 and "lr" not in kept.sources() and kept.eval_samples == POLICY_DEFAULTS["hf"]["eval_samples"]
    lm = TrainConfig(world="synthetic_lm")  # the default preset, seed_scale_v7: its calibrated rate
    assert (lm.policy, lm.optimizer, lm.lr) == ("transformer", "adamw", 1.5e-5)
    assert lm.sources()["optimizer"] == "world synthetic_lm" and lm.with_defaults() == (lm, {})
    assert lm.sources()["lr"] == "world synthetic_lm"
    assert TrainConfig(world="synthetic_lm", lr="none").lr == 1.5e-5  # none: the world's choice
    v5 = {"preset": "seed_scale"}
    assert TrainConfig(world="synthetic_lm", world_params=v5).lr == 3e-5  # recipe v5's rate
    assert TrainConfig.from_dict({"world": "synthetic_lm", "world_params": {"preset": "seed_scale_v6"}}).lr == 1.5e-5
    assert TrainConfig(world="synthetic_lm", world_params=v5, lr=1e-4).lr == 1e-4  # an explicit rate wins


def test_constructor_and_mapping_apply_the_same_defaults() -> None:
    """One place fills the defaults: the constructor, from_dict and the command line agree for every world."""
    for world in WORLDS.names():
        assert TrainConfig(world=world) == TrainConfig.from_dict({"world": world})
        built = TrainConfig(world=world)
        assert {name: getattr(built, name) for name in DEFAULTS} == {
            name: value for name, (value, _) in chosen_defaults(world, None).items()}


def test_start_line_names_what_the_world_and_policy_chose() -> None:
    line = describe_run(TrainConfig(world="synthetic_lm", objective="m2po", updates=40))
    assert line.startswith("offpolicylab: synthetic_lm / transformer / m2po / on_policy, 40 updates (0..39); "
                           "prompts_per_update 8, group_size 8, temperature 1, advantage std, optimizer adamw, "
                           "lr 1.5e-05, grad_clip 1, eval_samples 4 (chosen by world synthetic_lm: policy, ")
    line = describe_run(TrainConfig(world="gsm8k", policy="hf", lr=2e-4, eval_samples=1), "micro-batches of 4")
    assert line.endswith("lr 0.0002, grad_clip 1, eval_samples 1 (chosen by policy hf: eval_samples); "
                         "scoring: micro-batches of 4")
    row = {"update": 2, "reward_mean": 0.125, "loss": -0.5, "grad_norm": 1.0, "clip_frac": 0.05, "ratio_p999": 1.31,
           "ess": 0.98, "entropy": 1.2}
    assert progress_line(row, 30, 1.234) == ("update 2 (3/30 done)  reward 0.125  clip 0.05  r_p99.9 1.31  ess 0.98  "
                                             "entropy 1.2  loss -0.5  1.2 s/update")
    row.update(eval_reward_sampled=0.25, eval_reward_greedy=float("nan"))
    assert eval_line(row) == "  eval update 2  eval_reward_sampled 0.25"


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
    parts = build(mdp_config())
    run = RunDir(tmp_path / "run")
    open_run(run, parts, resume=False)
    run.save_checkpoint(checkpoint_state(parts, 1))
    restore_state(parts, run.load_checkpoint())
    assert len(restored) == 1 and all(torch.equal(a, b) for a, b in zip(restored[0], states, strict=True))
