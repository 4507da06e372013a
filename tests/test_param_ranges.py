"""Every documented range is one the code accepts: for each registered world and policy parameter, the finite edges
of its documented range build a world and a policy that train one update; values just outside are refused in one
line.  Schedules with lags far beyond the run finish; config files of any shape are accepted or refused in one
line."""

from __future__ import annotations

import itertools
import math
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offpolicylab.config import TrainConfig, read_mapping
from offpolicylab.policies import POLICIES
from offpolicylab.registry import Param
from offpolicylab.staleness import Schedule, parse_schedule
from offpolicylab.trainer import train
from offpolicylab.worlds import WORLDS, make_world

#: Worlds built with small sizes so that every edge builds in well under a second; the parameter under test
#: replaces its entry.  ``synthetic_lm`` distils nothing (distill_steps=0) into a temporary cache.
SMALL: dict[str, dict[str, Any]] = {
    "bandit": {},
    "three_arm_pitfall": {},
    "token_mdp": {"vocab_size": 3, "length": 3, "num_prompts": 2},
    "synthetic_lm": {"preset": "seed_scale", "vocab_size": 32, "response_len": 4, "num_keys": 4,
                     "num_train_prompts": 8, "d_model": 8, "num_heads": 2, "num_layers": 1, "distill_steps": 0,
                     "distill_batch": 4},
}
#: Documented dependencies between parameters (each says so in its doc): the edge is tried with these set.
DEPENDS: dict[tuple[str, str, Any], dict[str, Any]] = {
    ("synthetic_lm", "vocab_size", 16): {"num_keys": 4},   # vocab_size >= num_keys + 12
    ("synthetic_lm", "d_model", 1): {"num_heads": 1},      # d_model a multiple of num_heads
    ("synthetic_lm", "num_heads", 1): {},
    ("synthetic_lm", "preset", "seed_scale_v6"): {"response_len": 12},  # v6: room for 3 steps, ANS, answer, EOS
    ("synthetic_lm", "preset", "seed_scale_v7"): {"response_len": 12},  # v7 is v6's world: the same room
    ("token_mdp", "num_prompts", 1): {},
}
SKIP_WORLDS = {"gsm8k"}  # needs a language model: its parameters are checked in tests/policies/test_hf_loading.py


def edges(param: Param) -> list[Any]:
    """The finite edges of ``param``'s documented range (the nearest float inside an open edge) and its choices."""
    values: list[Any] = list(param.choices or ())
    if param.kind in (int, float):
        for bound, is_open, inward in ((param.low, param.low_open, math.inf), (param.high, param.high_open, -math.inf)):
            if bound is None or not math.isfinite(bound):
                continue
            if param.kind is int:
                values.append(int(bound) + (0 if not is_open else 1 if inward > 0 else -1))
            else:
                values.append(float(np.nextafter(bound, inward)) if is_open else float(bound))
    return values


def outside(param: Param) -> list[Any]:
    """Values just outside the finite edges of ``param``'s range."""
    values: list[Any] = []
    if param.kind in (int, float):
        for bound, is_open, outward in ((param.low, param.low_open, -math.inf), (param.high, param.high_open, math.inf)):
            if bound is None or not math.isfinite(bound):
                continue
            step = 1 if param.kind is int else 0
            if param.kind is int:
                values.append(int(bound) + (-1 if outward < 0 else 1) * (0 if is_open else step))
            else:
                values.append(float(bound) if is_open else float(np.nextafter(bound, outward)))
    return values


WORLD_EDGES = [(world, name, value) for world in WORLDS.names() if world not in SKIP_WORLDS
               for name, param in WORLDS.params(world).items() if name != "cache_dir" for value in edges(param)]


@pytest.mark.parametrize(("world", "name", "value"), WORLD_EDGES)
def test_every_documented_world_edge_builds_and_trains(world: str, name: str, value: Any, tmp_path: Path) -> None:
    params = {**SMALL[world], **DEPENDS.get((world, name, value), {}), name: value}
    if world == "synthetic_lm":
        params["cache_dir"] = str(tmp_path / "cache")
    policy = "transformer" if world == "synthetic_lm" else "tabular"
    config = TrainConfig(world=world, world_params=params, objective="grpo", policy=policy, updates=1,
                         prompts_per_update=2, group_size=2, eval_every=1, sample_every=1, checkpoint_every=1)
    summary = train(config, tmp_path / "run")
    assert summary["status"] in ("completed", "collapsed")


WORLD_OUTSIDE = [(world, name, value) for world in WORLDS.names() if world not in SKIP_WORLDS
                 for name, param in WORLDS.params(world).items() for value in outside(param)]


@pytest.mark.parametrize(("world", "name", "value"), WORLD_OUTSIDE)
def test_values_outside_a_world_range_are_refused_in_one_line(world: str, name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"parameter {name}=.* is out of range; valid: ") as info:
        make_world(world, **{**SMALL[world], name: value})
    assert "\n" not in str(info.value)


POLICY_WORLDS = {"tabular": "token_mdp", "sequence_model": "token_mdp", "transformer": "token_mdp"}
POLICY_DEPENDS: dict[tuple[str, str, Any], dict[str, Any]] = {
    ("transformer", "d_model", 1): {"num_heads": 1, "init": "random"},  # a multiple of num_heads
    ("sequence_model", "max_prompt_len", 1): {},  # shorter than the world's prompts: refused (below)
    ("transformer", "max_prompt_len", 1): {},
    ("transformer", "trainer_weights", "cast"): {"trainer_precision": "bf16"},  # 16-bit weight copies need a 16-bit trainer
    ("transformer", "recompute_split_k", 16): {"trainer_precision": "bf16", "logp_micro_batch": 2},  # splits a recompute
}
POLICY_EDGES = [(policy, name, value) for policy in POLICY_WORLDS for name, param in POLICIES.params(policy).items()
                for value in edges(param) if param.kind is not bool]


@pytest.mark.parametrize(("policy", "name", "value"), POLICY_EDGES)
def test_every_documented_policy_edge_trains(policy: str, name: str, value: Any, tmp_path: Path) -> None:
    world = POLICY_WORLDS[policy]
    params = {**POLICY_DEPENDS.get((policy, name, value), {}), name: value}
    world_params = dict(SMALL[world])
    if name == "max_prompt_len":  # the world's prompts must fit: a bandit-sized world whose prompts are 1 token long
        world, world_params = "bandit", {}
    config = TrainConfig(world=world, world_params=world_params, objective="grpo", policy=policy,
                         policy_params=params, updates=1, prompts_per_update=2, group_size=2, eval_every=1,
                         sample_every=1, checkpoint_every=1)
    summary = train(config, tmp_path / "run")
    assert summary["status"] in ("completed", "collapsed")


@pytest.mark.parametrize("policy", ["sequence_model", "transformer"])
def test_prompts_longer_than_max_prompt_len_are_refused_before_the_run(policy: str, tmp_path: Path) -> None:
    config = TrainConfig(world="token_mdp", world_params=SMALL["token_mdp"], objective="grpo", policy=policy,
                         policy_params={"max_prompt_len": 1, **({"init": "random"} if policy == "transformer" else {})})
    with pytest.raises(ValueError, match=r"max_prompt_len=1 is shorter than the world's prompts \(2 tokens\); "
                                         r"valid: an int in \[2, inf\]"):
        train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("world", "params", "message"), [
    ("token_mdp", {"vocab_size": 2, "length": 10**18}, "exceeds 100000: the world must stay enumerable"),
    ("token_mdp", {"vocab_size": 10, "length": 5, "num_prompts": 101}, re.escape("num_prompts × vocab_size^length")),
    ("bandit", {"num_arms": 10**11}, "parameter num_arms=100000000000 is out of range"),
    ("token_mdp", {"seed": 2**70}, "parameter seed=1180591620717411303424 is out of range"),
    ("synthetic_lm", {"alpha": 1e308}, "parameter alpha=1e\\+308 is out of range; valid: a float in \\(0, 1000\\]"),
    ("synthetic_lm", {"sharpness_spread": 100.0}, "parameter sharpness_spread=100.0 is out of range"),
])
def test_values_that_crashed_or_hung_the_build_are_refused(world: str, params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_world(world, **params)


@pytest.mark.parametrize(("policy", "params"), [("tabular", {"sampler_noise_std": 1e300}),
                                                ("sequence_model", {"logit_scale": 1e300}),
                                                ("sequence_model", {"seed": 2**70})])
def test_policy_values_that_crashed_training_are_refused(policy: str, params: dict[str, Any]) -> None:
    world = make_world("token_mdp", **SMALL["token_mdp"])
    with pytest.raises(ValueError, match="is out of range; valid: "):
        POLICIES.build(policy, world, **params)


def test_a_temperature_that_overflows_the_logits_is_refused() -> None:
    with pytest.raises(ValueError, match=r"parameter temperature=1e-300 is out of range; valid: a float in \[1e-06"):
        TrainConfig.from_dict({"world": "bandit", "objective": "grpo", "temperature": 1e-300})


# ============================================================================================ schedules
def brute_generate(schedule: Schedule, u: int, total: int) -> list[int]:
    """generate_at by definition: every update c < total whose batch version(c) is u, scanned up to the horizon."""
    keys: list[int] = []
    for c in range(u, min(u + schedule.horizon + 1, total)):
        if schedule.version(c) == u and schedule.key(c) not in keys:
            keys.append(schedule.key(c))
    return keys


def brute_release(schedule: Schedule, u: int, total: int) -> list[int]:
    key = schedule.key(u)
    return [] if any(schedule.key(c) == key for c in range(u + 1, min(u + schedule.horizon + 1, total))) else [key]


def test_the_schedule_window_equals_the_scan_by_definition() -> None:
    for lag, period, reuse, dataset in itertools.product(range(5), range(1, 5), range(1, 5), (0, 1, 2, 3, 5)):
        schedule = Schedule("x", "x", lag=lag, period=period, reuse=reuse, dataset=dataset)
        for total in (1, 2, 7, 20):
            for u in range(total + 3):
                assert schedule.generate_at(u, total) == brute_generate(schedule, u, total), (schedule, u, total)
                if u < total:
                    assert schedule.release_after(u, total) == brute_release(schedule, u, total), (schedule, u)


@pytest.mark.parametrize("spec", ["stale_k:1000000000", "epochs:1000000000", "offline:1000000000",
                                  "sync:1000000000,1000000000", "stages:1000000000"])
def test_lags_far_beyond_the_run_finish(spec: str, tmp_path: Path) -> None:
    """The largest documented values hung (the trainer scanned every update up to the lag); each is now a short
    run, and one more is refused in one line."""
    assert parse_schedule(spec).horizon >= 10**9
    bigger = spec.replace("1000000000", "1000000001", 1)
    with pytest.raises(ValueError, match="is out of range; valid: an int in") as info:
        parse_schedule(bigger)
    assert "\n" not in str(info.value)
    config = TrainConfig(world="three_arm_pitfall", objective="reinforce", schedule=spec, updates=4,
                         prompts_per_update=2, group_size=4, eval_every=100, sample_every=0)
    assert train(config, tmp_path / "run")["status"] in ("completed", "collapsed")


# ============================================================================================ config files
json_values = st.recursive(st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.floats()
                           | st.text(max_size=10), lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=10)
FIELDS = list(TrainConfig().to_dict())


@given(st.dictionaries(st.sampled_from(FIELDS + ["nope"]), json_values, max_size=5))
@settings(max_examples=300, deadline=None)
def test_fuzzed_config_mappings_are_accepted_or_refused_in_one_line(data: dict[str, Any]) -> None:
    try:
        TrainConfig.from_dict({"world": "bandit", "objective": "grpo", **data})
    except ValueError as exc:
        assert str(exc).strip() and "\n" not in str(exc)


@given(st.binary(max_size=300), st.sampled_from([".json", ".yaml", ".txt"]))
@settings(max_examples=200, deadline=None)
def test_fuzzed_config_files_are_read_or_refused_in_one_line(content: bytes, suffix: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"config{suffix}"
        path.write_bytes(content)
        try:
            read_mapping(path, f"--config {path}", "config fields")
        except ValueError as exc:
            assert "\n" not in str(exc).strip()


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_config_file_nested_too_deeply_is_refused(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"deep{suffix}"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="nested too deeply|is not valid"):
        read_mapping(path, f"--config {path}", "config fields")
