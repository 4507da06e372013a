"""Every bad input of docs/bad_input.md gets its one-line message and exit code 2, and nothing is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offpolicylab.config import TrainConfig
from offpolicylab.run_dir import RunDir, RunError
from offpolicylab.trainer import train
from tests.cli.test_cli import TINY, run_cli
from tests.small_runs import mdp_config

RUN = ["run", *TINY, "--objective", "grpo", "--updates", "2"]


def without(argv: list[str], flag: str) -> list[str]:
    """``argv`` without ``flag`` and its value (a flag given twice is refused, so a case sets it once)."""
    at = argv.index(flag)
    return argv[:at] + argv[at + 2:]

FILES = {
    "list.json": json.dumps([{"world": "token_mdp"}]),
    "world_list.json": json.dumps({"world": ["token_mdp"], "objective": "grpo"}),
    "bool_as_number.json": json.dumps({"world": "token_mdp", "objective": "grpo", "fsync": 1}),
    "number_as_bool.json": json.dumps({"world": "token_mdp", "objective": "grpo", "updates": True}),
    "float_as_bool.json": json.dumps({"world": "token_mdp", "objective": "grpo", "lr": True}),
    "other.json": json.dumps({"world": "token_mdp", "objective": "m2po"}),
    "a_file": "not a folder",
    "grid.json": json.dumps({"base": {"world": "three_arm_pitfall", "updates": 2}, "axes": {"seed": [0]}}),
}

# (arguments with {tmp} for the test's folder, a fragment of the one-line message)
CASES = [
    (["run", *TINY, "--objective", "grpo", "--out", ""], "--out '' is invalid; valid: a folder path"),
    ([*RUN, "--out", "{tmp}/a_file"], "is an existing file; valid: a folder"),
    (["sweep", "{tmp}", "--out", "{tmp}/out"], "is a directory; valid: a JSON file with keys base and axes"),
    (["sweep", "{tmp}/grid.json", "--out", "{tmp}/a_file"], "is an existing file; valid: a folder"),
    (["sweep", "{tmp}/grid.json", "--out", ""], "--out '' is invalid"),
    (["run", "--config", "{tmp}/list.json", "--out", "{tmp}/out"], "holds a JSON list; valid: a JSON object"),
    (["run", "--config", "{tmp}/world_list.json", "--out", "{tmp}/out"],
     "world=['token_mdp'] is invalid; valid: a string"),
    (["run", "--config", "{tmp}/bool_as_number.json", "--out", "{tmp}/out"], "fsync=1 is invalid; valid: true or false"),
    (["run", "--config", "{tmp}/number_as_bool.json", "--out", "{tmp}/out"],
     "updates=True is invalid; valid: an int in [1, inf]"),
    (["run", "--config", "{tmp}/float_as_bool.json", "--out", "{tmp}/out"], "lr=True is invalid; valid: a float in (0, inf) or none"),
    (["demo", "--updates", "0", "--out", "{tmp}/out"], "updates=0 is out of range; valid: an int in [1, inf]"),
    ([*without(RUN, "--group-size"), "--group-size", "1", "--out", "{tmp}/out"], "group_size=1 is out of range; valid: an int in [2, inf]"),
    ([*RUN, "--seed", str(10**30), "--out", "{tmp}/out"], "valid: an int in [0, 4294967295]"),
    ([*without(RUN, "--prompts-per-update"), "--prompts-per-update", "100000000", "--out", "{tmp}/out"], "GiB but this machine has"),
    ([*RUN, "--resume", "--config", "{tmp}/other.json", "--out", "{tmp}/out"], "cannot be combined with --config"),
    ([*RUN, "--behavior-logp", "engine", "--out", "{tmp}/out"],
     "behavior_logp='engine' is invalid; valid: one of auto, trainer, sampler"),
    ([*RUN, "--policy-param", "sampler_precision=fp4", "--out", "{tmp}/out"],
     "sampler_precision='fp4' is invalid; valid: one of fp32, bf16, fp16, fp8_e4m3, fp8_e5m2"),
    (["run", "--world", "synthetic_lm", "--objective", "grpo", "--world-param", "preset=qwen", "--out", "{tmp}/out"],
     "parameter preset='qwen' is invalid; valid: one of seed_scale, smollm2, seed_scale_v6, seed_scale_v7"),
    (["run", "--world", "synthetic_lm", "--objective", "grpo", "--world-param", "preset=seed_scale", "--world-param",
      "num_rules=2", "--out", "{tmp}/out"],
     "num_rules=2 is a parameter of the chain presets only; valid: leave it unset with preset 'seed_scale'"),
    (["run", "--world", "synthetic_lm", "--objective", "grpo", "--world-param", "ans_prob=0.5", "--out", "{tmp}/out"],
     "ans_prob=0.5 is not a parameter of preset 'seed_scale_v7'; valid: leave it unset, or name a recipe-v5 preset "
     "(preset=seed_scale)"),
    (["demo", "--world", "token_mdp", "--preset", "seed_scale", "--out", "{tmp}/out"],
     "--preset seed_scale is a synthetic_lm option; valid: leave it out with --world token_mdp"),
    (["demo", "--preset", "qwen", "--out", "{tmp}/out"],
     "parameter preset='qwen' is invalid; valid: one of seed_scale, smollm2, seed_scale_v6, seed_scale_v7"),
    (["run", "--world", "synthetic_lm", "--objective", "grpo", "--world-param", "preset=seed_scale_v7",
      "--world-param", "num_rules=65", "--out", "{tmp}/out"],
     "num_rules=65 is invalid; valid: an integer in [1, num_keys] ([1, 64])"),
    (["run", "--world", "synthetic_lm", "--objective", "grpo", "--world-param", "pi0_temperature=0", "--out",
      "{tmp}/out"], "parameter pi0_temperature=0.0 is out of range; valid: a float in [0.05, 10] or none"),
    ([*RUN, "--param", "correction=vllm", "--out", "{tmp}/out"],
     "unknown correction engine 'vllm'; valid: verl, trl, openrlhf, slime, skyrl, areal"),
    ([*RUN, "--param", "correction=verl:rollout_iss=token", "--out", "{tmp}/out"],
     "correction engine 'verl' has no parameter rollout_iss; valid: rollout_is, rollout_is_threshold"),
    ([*RUN, "--param", "correction=openrlhf:is_correction_level=seq:is_correction_mode=clip", "--out", "{tmp}/out"],
     "openrlhf: is_correction_mode=clip requires is_correction_level=token"),
    ([*RUN, "--param", "correction=openrlhf:is_correction_mode=clip", "--out", "{tmp}/out"],
     "openrlhf: is_correction_mode needs is_correction_level; valid: is_correction_level off, token or seq"),
    ([*RUN, "--param", "correction=openrlhf:is_correction_level=token:vllm_is_correction_type=seq-mask-tis", "--out",
      "{tmp}/out"], "is icepop, but vllm_is_correction_type=seq-mask-tis; valid: one of the two spellings"),
    ([*RUN, "--param", "correction=trl", "--param", "tis_cap=2", "--out", "{tmp}/out"],
     "give tis_cap or correction, not both"),
]


@pytest.mark.parametrize(("args", "message"), CASES, ids=[f"{i}-{c[1][:24]}" for i, c in enumerate(CASES)])
def test_bad_input_gets_one_line_exit_2_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           args: list[str], message: str) -> None:
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    before = sorted(p.name for p in tmp_path.iterdir())
    cwd_before = sorted(p.name for p in Path.cwd().iterdir())
    code, _, err = run_cli([a.replace("{tmp}", str(tmp_path)) for a in args], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert sorted(p.name for p in Path.cwd().iterdir()) == cwd_before


def test_a_damaged_metrics_file_is_named_with_its_line(tmp_path: Path) -> None:
    train(mdp_config(updates=4, checkpoint_every=2), tmp_path)
    run = RunDir(tmp_path)
    lines = run.metrics_path.read_text().splitlines(keepends=True)
    columns = lines[0].strip().split(",")
    values = lines[2].split(",")
    values[columns.index("reward_mean")] = "abc"
    run.metrics_path.write_text("".join([*lines[:2], ",".join(values), *lines[3:]]))
    with pytest.raises(RunError, match=r"metrics.csv:3: reward_mean='abc' is not a number"):
        run.write_summary("completed")


def test_config_files_keep_booleans_and_numbers_apart() -> None:
    assert TrainConfig.from_dict({"fsync": True, "lr": 1, "updates": 3}).lr == 1  # an int is a fine float
    assert TrainConfig.from_dict({"fsync": "true"}).fsync is True  # CLI-style strings are still parsed
