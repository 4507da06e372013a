"""Policy-dependent defaults of TrainConfig: unset fields are filled per policy, set ones are kept."""

from __future__ import annotations

from offpolicylab.config import DEFAULTS, POLICY_DEFAULTS, TrainConfig
from offpolicylab.trainer import describe_defaults, progress_line


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
    row = {"update": 2, "reward_mean": 0.125, "loss": -0.5, "grad_norm": 1.0, "response_len": 40.0,
           "eval_reward_greedy": float("nan"), "time_update_s": 12.34}
    assert progress_line(row, 30) == ("update 3/30  reward_mean 0.125  loss -0.5  grad_norm 1  response_len 40"
                                      "  12.3 s")
