"""Preset ``seed_scale_v7``: v6's world with an 8-layer π₀ (v6's recipe with ``num_layers = 8``, its file shipped
with the package) and the engines of docs/synthetic_lm_v7.md (parts 7 and 12) as the transformer's defaults; an
option given explicitly wins."""

from __future__ import annotations

from dataclasses import replace

import torch

from offpolicylab.policies import make_policy
from offpolicylab.worlds import make_world
from offpolicylab.worlds import synthetic_lm as v5
from offpolicylab.worlds.synthetic_lm_v6 import CHAIN_PRESETS
from tests.cli.test_hostile_inputs import refused


def test_v7_is_v6s_recipe_at_depth_8_and_its_pi0_is_shipped(tmp_path, monkeypatch) -> None:
    """The recipe differs from v6's in the depth alone; an empty user cache still builds the world from the
    package's π₀ file (nothing is distilled: distillation would raise here)."""
    assert CHAIN_PRESETS["seed_scale_v7"] == replace(CHAIN_PRESETS["seed_scale_v6"], num_layers=8)
    assert (v5.PACKAGED_DIR / f"{CHAIN_PRESETS['seed_scale_v7'].digest()[:32]}.pt").is_file()

    def no_distillation(*args, **kwargs):
        raise AssertionError("v7's π₀ was distilled instead of loaded")

    monkeypatch.setattr(v5, "distill", no_distillation)
    world = make_world("synthetic_lm", preset="seed_scale_v7", cache_dir=str(tmp_path))
    layers = {key.split(".")[1] for key in world.pretrained_state if key.startswith("blocks.")}
    assert len(layers) == 8
    v6 = make_world("synthetic_lm", preset="seed_scale_v6", cache_dir=str(tmp_path))
    assert torch.equal(world._prompts(torch.arange(4)).ids, v6._prompts(torch.arange(4)).ids)


def test_v7_trains_with_its_engines_unless_told_otherwise() -> None:
    world = make_world("synthetic_lm", preset="seed_scale_v7")
    policy = make_policy("transformer", world)
    assert (policy.trainer_precision, policy.sampler_precision, policy.logp_micro_batch) == ("bf16", "bf16", 16)
    assert (policy.trainer_weights, policy.recompute_split_k) == ("cast", 4)
    assert torch.equal(policy.model.head.bias, world.pretrained_state["head.bias"] + 12.0)  # logit_offset 12
    policy = make_policy("transformer", world, trainer_precision="fp16", sampler_precision="fp16",
                         logp_micro_batch=8)
    assert (policy.trainer_precision, policy.sampler_precision, policy.logp_micro_batch) == ("fp16", "fp16", 8)
    plain = make_policy("transformer", make_world("synthetic_lm", preset="seed_scale_v6"))
    assert (plain.trainer_precision, plain.sampler_precision, plain.logp_micro_batch) == ("fp32", "fp32", 0)
    assert (plain.trainer_weights, plain.recompute_split_k) == ("master", 1)


def test_an_engine_option_given_at_its_registered_default_is_kept() -> None:
    """``trainer_precision=fp32`` on v7 trains in fp32 (it used to read as "unset" and become bf16), taking the
    preset's 16-bit weight copies and split-K recompute with it; the sampler and the recompute stay the preset's."""
    world = make_world("synthetic_lm", preset="seed_scale_v7")
    policy = make_policy("transformer", world, trainer_precision="fp32")
    assert (policy.trainer_precision, policy.trainer_weights, policy.recompute_split_k) == ("fp32", "master", 1)
    assert (policy.sampler_precision, policy.logp_micro_batch) == ("bf16", 16)
    policy = make_policy("transformer", world, logp_micro_batch="0", logit_offset="0")
    assert (policy.trainer_precision, policy.logp_micro_batch, policy.recompute_split_k) == ("bf16", 0, 1)
    assert torch.equal(policy.model.head.bias, world.pretrained_state["head.bias"])  # logit_offset 0 given
    every = {"trainer_precision": "fp32", "sampler_precision": "fp32", "logp_micro_batch": 0,
             "trainer_weights": "master", "logit_offset": 0.0, "score_padding": "fixed", "recompute_split_k": 1}
    policy = make_policy("transformer", world, **every)
    assert {name: getattr(policy, name) for name in every if name != "logit_offset"} == {
        name: value for name, value in every.items() if name != "logit_offset"}


def test_compiled_blocks_refuse_the_presets_split_k_recompute(tmp_path, capsys) -> None:
    """docs/bad_input.md: the preset's split-K recompute cannot run compiled; with recompute_split_k=1 it can."""
    world = make_world("synthetic_lm", preset="seed_scale_v7")
    err = refused(["run", "--world", "synthetic_lm", "--world-param", "preset=seed_scale_v7", "--objective", "grpo",
                   "--policy-param", "compiled=true", "--updates", "2", "--out", str(tmp_path / "out")], capsys)
    assert "recompute_split_k=4 cannot run with compiled=true" in err
    assert not (tmp_path / "out").exists()
    policy = make_policy("transformer", world, compiled="true", recompute_split_k="1")
    assert (policy.trainer_precision, policy.recompute_split_k) == ("bf16", 1)


def test_the_default_world_is_v7_and_its_pi0_meets_target_a(tmp_path, capsys) -> None:
    """Held-out check of the default world, (a): ``make_world("synthetic_lm")`` with no preset is recipe v7, and its
    shipped π₀ (fp32 statistics, temperature-1 samples) has v6's profile windows — 45–60 % of tokens below
    0.01 nat and the 80th percentile in [0.5, 0.85] nat (Qwen3-8B's chain of thought: 50.64 %, 0.672 nat; Wang et
    al. 2025, arXiv:2506.01939) — and an initial success in [5, 30] % (docs/synthetic_lm_v6.md, target (e);
    measured 52.5 %, 0.514 nat, 21.9 % in docs/synthetic_lm_v7.md, part 13)."""
    from offpolicylab.synthetic_lm_calibration import (
        SEED_SCALE_TARGETS,
        initial_success,
        policy_token_profile,
    )

    world = make_world("synthetic_lm", cache_dir=str(tmp_path))
    assert world.recipe == CHAIN_PRESETS["seed_scale_v7"] and not any(tmp_path.iterdir())
    pi0 = world.pretrained_policy()
    assert pi0.trainer_precision == "fp32" and pi0.sampler_precision == "fp32"
    profile = policy_token_profile(world, pi0)
    success = initial_success(world, pi0, samples=8)
    print(profile["share_entropy_below_0.01"], profile["entropy_p80"], success["success"], success["success_se"])
    (low_s, high_s), (low_p, high_p) = SEED_SCALE_TARGETS.values()
    assert low_s <= profile["share_entropy_below_0.01"] <= high_s
    assert low_p <= profile["entropy_p80"] <= high_p
    assert 0.05 <= success["success"] <= 0.30
