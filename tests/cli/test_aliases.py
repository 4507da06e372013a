"""verl's and TRL's parameter names (offpolicylab.aliases) in flags, YAML / JSON configs and Python: each ends as
our name in the config, so the run is the one our names give."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offpolicylab import cli
from offpolicylab.aliases import canonical_config, canonical_params, merge_params
from offpolicylab.config import TrainConfig

BASE = ["run", "--world", "three_arm_pitfall", "--objective", "grpo", "--out", "unused"]


def parsed(argv: list[str]) -> TrainConfig:
    return cli.config_from_args(cli.build_parser().parse_args(argv))


def test_mapping_by_hand() -> None:
    assert canonical_params({"clip_ratio_low": 0.1, "clip_ratio_high": 0.3, "loss_agg_mode": "seq-mean-token-sum",
                             "tau": 1}) == {"eps_low": 0.1, "eps_high": 0.3, "agg": "seq-mean-token-sum", "tau": 1}
    assert canonical_params({"epsilon": 0.1}) == {"eps_low": 0.1, "eps_high": 0.1}  # TRL: epsilon_high = epsilon
    assert canonical_params({"epsilon": 0.1, "epsilon_high": 0.3}) == {"eps_low": 0.1, "eps_high": 0.3}
    assert canonical_config({"max_steps": 7, "clip_ratio_high": 0.3, "objective_params": {"loss_agg_mode": "bnpo"}}) \
        == {"updates": 7, "objective_params": {"agg": "bnpo", "eps_high": 0.3}}
    assert merge_params({"eps_high": 0.28}, {"epsilon": "0.1"}) == {"eps_high": 0.28, "eps_low": "0.1"}
    with pytest.raises(ValueError, match="max_steps=7 and updates=8 name the same setting updates"):
        canonical_config({"max_steps": 7, "updates": 8})
    with pytest.raises(ValueError, match="clip_ratio_high=0.3 and eps_high=0.2"):
        canonical_params({"clip_ratio_high": 0.3, "eps_high": 0.2})


def test_python_and_json_configs(tmp_path: Path) -> None:
    ours = TrainConfig(world="three_arm_pitfall", objective="grpo", updates=7,
                       objective_params={"eps_low": 0.1, "eps_high": 0.3, "agg": "dr_grpo"})
    theirs = TrainConfig.from_dict({"world": "three_arm_pitfall", "objective": "grpo", "max_steps": 7,
                                    "epsilon": 0.1, "objective_params": {"clip_ratio_high": 0.3},
                                    "loss_agg_mode": "dr_grpo"})
    assert theirs == ours
    assert TrainConfig(objective_params={"epsilon_high": 0.3}).objective_params == {"eps_high": 0.3}
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"world": "three_arm_pitfall", "objective": "grpo", "max_steps": 7,
                                "clip_ratio_low": 0.1, "clip_ratio_high": 0.3, "loss_agg_mode": "dr_grpo"}))
    assert parsed(["run", "--config", str(path), "--out", str(tmp_path / "r")]) == ours


def test_yaml_config_and_flags_over_it(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("world: three_arm_pitfall\nobjective: grpo\nmax_steps: 5\nclip_ratio_high: 0.28\n")
    config = parsed(["run", "--config", str(path), "--out", str(tmp_path / "r")])
    assert (config.updates, config.objective_params) == (5, {"eps_high": 0.28})
    config = parsed(["run", "--config", str(path), "--out", str(tmp_path / "r"), "--epsilon-high", "0.3",
                     "--max-steps", "9", "--param", "epsilon=0.1"])
    assert (config.updates, config.objective_params) == (9, {"eps_high": "0.3", "eps_low": "0.1"})  # flags: strings
    config = parsed(["run", "--config", str(path), "--out", str(tmp_path / "r"), "--epsilon", "0.1"])
    assert config.objective_params == {"eps_high": 0.28, "eps_low": "0.1"}  # the file's upper bound stays


def test_flags() -> None:
    config = parsed([*BASE, "--max-steps", "3", "--clip-ratio-low", "0.1", "--clip-ratio-high", "0.3",
                     "--loss-agg-mode", "seq-mean-token-sum-norm"])
    assert config.updates == 3
    assert config.objective_params == {"eps_low": "0.1", "eps_high": "0.3", "agg": "seq-mean-token-sum-norm"}
    assert parsed([*BASE, "--param", "clip_ratio_high=0.3"]).objective_params == {"eps_high": "0.3"}


def test_conflicting_flags_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*BASE[:-1], str(tmp_path / "r"), "--param", "eps_high=0.2", "--clip-ratio-high", "0.3"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "name the same setting eps_high" in err[0]
    assert not (tmp_path / "r").exists()
