"""TRL's and verl's words on the command line: every alias of :mod:`offpolicylab.aliases` as a flag, a config key
and a ``KEY=VALUE`` override (verl's dotted paths included) lands on our setting with the value worked out from
TRL's / verl's documentation; ``run --print-config`` writes YAML that ``--config`` reads back to the same config;
``sweep`` takes overrides of its base; ``run --help`` is grouped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from offpolicylab import cli
from offpolicylab.config import TrainConfig


def printed(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert cli.main(["run", *args, "--print-config"]) == 0
    return yaml.safe_load(capsys.readouterr().out)


def refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(args)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


BASE = ["--world", "token_mdp", "--objective", "grpo"]

# (their name, their value, our field or objective parameter, our value) — from TRL's GRPOConfig /
# TrainingArguments and verl's ppo_trainer.yaml documentation, written out by hand.
RUN_FIELDS = [
    ("max_steps", "7", "updates", 7),
    ("total_training_steps", "7", "updates", 7),
    ("learning_rate", "0.003", "lr", 0.003),
    ("num_generations", "6", "group_size", 6),
    ("train_batch_size", "3", "prompts_per_update", 3),
    ("max_grad_norm", "0.5", "grad_clip", 0.5),
    ("eval_steps", "4", "eval_every", 4),
    ("test_freq", "4", "eval_every", 4),
    ("save_steps", "9", "checkpoint_every", 9),
    ("save_freq", "9", "checkpoint_every", 9),
    ("scale_rewards", "false", "advantage", "mean"),  # TRL: no scaling by the group std
    ("scale_rewards", "group", "advantage", "std_trl"),  # TRL's nanstd + 1e-4
    ("norm_adv_by_std_in_grpo", "false", "advantage", "mean"),  # verl: Dr. GRPO's advantage
    ("norm_adv_by_std_in_grpo", "true", "advantage", "std"),
    ("max_num_gen_batches", "3", "dynamic_sampling_max_batches", 3),
]
OBJECTIVE_PARAMS = [
    ("clip_ratio_high", "0.28", {"eps_high": 0.28, "eps_low": 0.2}),
    ("clip_ratio", "0.3", {"eps_low": 0.3, "eps_high": 0.3}),  # verl: both bounds
    ("clip_ratio_c", "3.0", {"dual_clip": 3.0}),
    ("epsilon", "0.1", {"eps_low": 0.1, "eps_high": 0.1}),  # TRL: epsilon_high defaults to epsilon
    ("loss_type", "grpo", {"agg": "seq-mean-token-mean"}),  # TRL's grpo: mean per sequence, then over sequences
    ("loss_type", "dr_grpo", {"agg": "dr_grpo"}),
    ("loss_agg_mode", "seq-mean-token-sum", {"agg": "seq-mean-token-sum"}),
    ("beta", "0.04", {"kl_coef": 0.04}),
    ("kl_loss_coef", "0.04", {"kl_coef": 0.04}),
    ("use_kl_loss", "true", {"kl_coef": 0.001}),  # verl's default kl_loss_coef
    ("kl_loss_type", "low_var_kl", {"kl_estimator": "low_var_kl"}),
    ("entropy_coeff", "0.01", {"entropy_coef": 0.01}),
    ("vllm_importance_sampling_cap", "2.0", {"tis_cap": 2.0}),
]


@pytest.mark.parametrize(("name", "value", "ours", "expected"), RUN_FIELDS)
def test_run_field_aliases_as_flag_override_and_config_key(name: str, value: str, ours: str, expected: object,
                                                           tmp_path: Path, capsys: pytest.CaptureFixture[str]) \
        -> None:
    flag = printed([*BASE, "--" + name.replace("_", "-"), value], capsys)
    override = printed([*BASE, f"{name}={value}"], capsys)
    (tmp_path / "c.yaml").write_text(f"world: token_mdp\nobjective: grpo\n{name}: {value}\n")
    from_file = printed(["--config", str(tmp_path / "c.yaml")], capsys)
    assert flag[ours] == override[ours] == from_file[ours] == expected


@pytest.mark.parametrize(("name", "value", "expected"), OBJECTIVE_PARAMS)
def test_objective_parameter_aliases_as_flag_override_and_config_key(name: str, value: str, expected: dict,
                                                                     tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    flag = printed([*BASE, "--" + name.replace("_", "-"), value], capsys)["objective_params"]
    override = printed([*BASE, f"{name}={value}"], capsys)["objective_params"]
    (tmp_path / "c.yaml").write_text(f"world: token_mdp\nobjective: grpo\n{name}: {value}\n")
    from_file = printed(["--config", str(tmp_path / "c.yaml")], capsys)["objective_params"]
    for key, number in expected.items():
        assert flag[key] == override[key] == from_file[key] == number


def test_verl_dotted_paths_and_our_nested_keys(capsys: pytest.CaptureFixture[str]) -> None:
    config = printed(["--world", "token_mdp", "--objective", "m2po",
                      "actor_rollout_ref.actor.optim.lr=0.002", "actor_rollout_ref.rollout.n=5",
                      "actor_rollout_ref.actor.kl_loss_coef=0.01", "actor_rollout_ref.actor.kl_loss_type=mse",
                      "algorithm.norm_adv_by_std_in_grpo=false", "objective_params.tau=0.5",
                      "world_params.family=forking", "data.train_batch_size=2", "schedule=stale_k:4",
                      "reward.reward_kwargs.overlong_buffer_cfg.len=2",
                      "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5"], capsys)
    assert (config["lr"], config["group_size"], config["advantage"], config["prompts_per_update"]) == \
        (0.002, 5, "mean", 2)
    assert config["objective_params"]["tau"] == 0.5
    assert (config["objective_params"]["kl_coef"], config["objective_params"]["kl_estimator"]) == (0.01, "mse")
    assert config["world_params"] == {"family": "forking"}
    assert config["schedule"] == "stale_k:4"
    assert (config["overlong_buffer"], config["overlong_penalty"]) == (2, 0.5)


def test_use_kl_loss_false_turns_the_penalty_off(capsys: pytest.CaptureFixture[str]) -> None:
    config = printed([*BASE, "use_kl_loss=false", "--param", "kl_coef=0.5"], capsys)  # verl ignores the coef
    assert config["objective_params"]["kl_coef"] == 0.0


def test_overrides_win_over_files_and_may_not_repeat_a_flag(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "c.yaml").write_text("world: token_mdp\nobjective: grpo\nlr: 0.1\nupdates: 30\n")
    config = printed(["--config", str(tmp_path / "c.yaml"), "--updates", "20", "lr=0.3"], capsys)
    assert (config["updates"], config["lr"]) == (20, 0.3)  # the flag and the override over the file's values
    assert "--updates 20 and updates=10 name the same setting updates; valid: one of them" in \
        refused(["run", "--config", str(tmp_path / "c.yaml"), "--updates", "20", "updates=10", "--print-config"],
                capsys)


def test_bad_overrides_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert "override tau names no setting; valid: a config field (world, " in \
        refused(["run", *BASE, "tau=0.1", "--print-config"], capsys)
    assert "overrides beta=0.1 and kl_loss_coef=0.2 name the same setting; valid: one of them" in \
        refused(["run", *BASE, "beta=0.1", "kl_loss_coef=0.2", "--print-config"], capsys)
    assert "parameter lr='fast' is invalid" in refused(["run", *BASE, "lr=fast", "--print-config"], capsys)
    assert "run: unrecognized arguments: stray" in refused(["run", *BASE, "stray", "--print-config"], capsys)


def test_print_config_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = printed(["--world", "synthetic_lm", "--objective", "m2po", "--schedule", "stale_k:8",
                     "--param", "tau=0.05", "--param", "kl_coef=0.01", "--learning-rate", "1e-4",
                     "report_to=none"], capsys)
    path = tmp_path / "printed.yaml"
    path.write_text(yaml.safe_dump(first, sort_keys=False))
    again = printed(["--config", str(path)], capsys)
    assert again == first
    assert first["world"] == "synthetic_lm" and first["policy"] == "transformer"  # the world's choice, filled in
    assert first["objective_params"]["tau"] == 0.05 and first["lr"] == 1e-4
    assert TrainConfig.from_dict(again).to_dict() == TrainConfig.from_dict(first).to_dict()


def test_print_config_of_the_defaults_reads_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    defaults = printed([], capsys)
    assert (defaults["world"], defaults["objective"], defaults["updates"]) == ("token_mdp", "grpo", 200)
    path = tmp_path / "defaults.yaml"
    path.write_text(yaml.safe_dump(defaults))
    assert printed(["--config", str(path)], capsys) == defaults


def test_sweep_overrides_its_base_and_refuses_an_axis(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text("base: {world: bandit, updates: 50, prompts_per_update: 2, group_size: 4}\n"
                    "axes: {objective: [grpo, m2po]}\n")
    out = tmp_path / "sweep"
    assert cli.main(["sweep", str(grid), "--out", str(out), "updates=3", "learning_rate=0.2",
                     "eval_steps=3"]) == 0
    for cell in ("objective=grpo", "objective=m2po"):
        config = json.loads((out / cell / "config.json").read_text())
        assert (config["updates"], config["lr"], config["eval_every"]) == (3, 0.2, 3)
    header = capsys.readouterr().out.splitlines()[0].split()
    # evaluation first; the training batches' reward under its own name (the sweep table's columns)
    assert header == ["cell", "status", "final_exact_return", "peak_exact_return", "final_eval_reward",
                      "peak_eval_reward", "final_batch_reward", "peak_batch_reward"]
    assert "override objective is an axis of the grid; valid: overrides of settings the axes do not set" in \
        refused(["sweep", str(grid), "--out", str(tmp_path / "s2"), "objective=reinforce"], capsys)


def test_run_help_is_grouped(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = capsys.readouterr().out
    titles = [line[:-1] for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert titles == ["options", "world", "policy", "objective", "schedule", "training", "evaluation", "output",
                      "tracking", "config"]
    assert "--world STR" in text.split("\nworld:")[1].split("\npolicy:")[0]
    assert "--learning-rate" in text.split("\ntraining:")[1].split("\nevaluation:")[0]
    assert "--beta VALUE" in text.split("\nobjective:")[1].split("\nschedule:")[0]
    assert "--report-to STR" in text.split("\ntracking:")[1].split("\nconfig:")[0]
    assert "--print-config" in text.split("\nconfig:")[1]
