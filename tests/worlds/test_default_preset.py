"""The synthetic-LM world's default preset is recipe v7 (``seed_scale_v7``): a run that names no preset gets it and
its calibrated learning rate; config.json records the preset even when it was left unset, and a run directory
written while the default was recipe v5 (``seed_scale``, no preset recorded) still reads, compares and resumes as
the v5 run it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offpolicylab.config import TrainConfig, upgrade_stored_config
from offpolicylab.lifecycle import checked_resume, resolve_config
from offpolicylab.run_dir import RunDir, RunError
from offpolicylab.worlds import WORLDS
from offpolicylab.worlds.synthetic_lm_presets import DEFAULT_PRESET, EARLIER_DEFAULT_PRESET


def test_the_default_preset_is_v7_and_the_earlier_one_v5() -> None:
    assert (DEFAULT_PRESET, EARLIER_DEFAULT_PRESET) == ("seed_scale_v7", "seed_scale")
    assert WORLDS.get("synthetic_lm").params["preset"].default == "seed_scale_v7"


def test_a_run_records_its_preset_even_when_left_unset() -> None:
    resolved = resolve_config(TrainConfig(world="synthetic_lm", objective="grpo"))
    assert resolved["world_params"] == {"preset": "seed_scale_v7"} and resolved["lr"] == 1.5e-5
    named = resolve_config(TrainConfig(world="synthetic_lm", objective="grpo", world_params={"preset": "smollm2"}))
    assert named["world_params"] == {"preset": "smollm2"} and named["lr"] == 3e-5
    assert resolve_config(TrainConfig(world="token_mdp", objective="grpo"))["world_params"] == {}


def test_a_stored_config_without_a_preset_ran_the_earlier_default() -> None:
    assert upgrade_stored_config({"world": "synthetic_lm", "world_params": {}})["world_params"] == {
        "preset": "seed_scale"}
    kept = {"world": "synthetic_lm", "world_params": {"preset": "seed_scale_v6", "num_rules": 4}}
    assert upgrade_stored_config(kept) == kept
    other = {"world": "token_mdp", "world_params": {"length": 3}}
    assert upgrade_stored_config(other) == other
    renamed = upgrade_stored_config({"world": "synthetic_lm", "world_params": {"d_model": 16},
                                     "recompute_behavior_logp": True})
    assert renamed["world_params"] == {"preset": "seed_scale", "d_model": 16}
    assert renamed["behavior_logp"] == "trainer" and "recompute_behavior_logp" not in renamed


def _earlier_run(path: Path) -> RunDir:
    """A run directory as the version before v7's default wrote it: config.json without a preset, killed before
    its first checkpoint."""
    config = TrainConfig(world="synthetic_lm", objective="grpo", world_params={"preset": "seed_scale"}, updates=5)
    stored = resolve_config(config)
    stored["world_params"] = {}  # the earlier version recorded only the parameters given
    path.mkdir()
    (path / "config.json").write_text(json.dumps(stored))
    return RunDir(path)


def test_an_earlier_run_reads_resumes_and_compares_as_the_v5_run_it_was(tmp_path: Path) -> None:
    run = _earlier_run(tmp_path / "run")
    assert run.read_config()["world_params"] == {"preset": "seed_scale"} and run.read_config()["lr"] == 3e-5
    as_it_ran = TrainConfig(world="synthetic_lm", objective="grpo", world_params={"preset": "seed_scale"},
                            updates=5)
    assert checked_resume(run, resolve_config(as_it_ran), as_it_ran) is None  # same config, no checkpoint yet
    today = TrainConfig(world="synthetic_lm", objective="grpo", lr=3e-5, updates=5)  # the default is v7 now
    with pytest.raises(RunError, match=r"different configuration \(world_params differ"):
        checked_resume(run, resolve_config(today), today)
