"""Preset ``seed_scale_v7``: v6's world and π₀ (target (a): the same recipe, so the same π₀ file) with the engines
of docs/synthetic_lm_v7.md as the transformer's defaults; an option given explicitly wins."""

from __future__ import annotations

import torch

from offpolicylab.policies import make_policy
from offpolicylab.worlds import make_world
from offpolicylab.worlds.synthetic_lm_v6 import CHAIN_PRESETS


def test_v7_has_v6s_recipe_and_pi0() -> None:
    assert CHAIN_PRESETS["seed_scale_v7"].digest() == CHAIN_PRESETS["seed_scale_v6"].digest()
    v6, v7 = make_world("synthetic_lm", preset="seed_scale_v6"), make_world("synthetic_lm", preset="seed_scale_v7")
    assert v7.threshold == v6.threshold
    assert all(torch.equal(v6.pretrained_state[k], v7.pretrained_state[k]) for k in v6.pretrained_state)


def test_v7_trains_with_its_engines_unless_told_otherwise() -> None:
    world = make_world("synthetic_lm", preset="seed_scale_v7")
    policy = make_policy("transformer", world)
    assert (policy.trainer_precision, policy.sampler_precision, policy.logp_micro_batch) == ("bf16", "bf16", 16)
    policy = make_policy("transformer", world, trainer_precision="fp16", sampler_precision="fp16",
                         logp_micro_batch=8)
    assert (policy.trainer_precision, policy.sampler_precision, policy.logp_micro_batch) == ("fp16", "fp16", 8)
    assert make_policy("transformer", world).trainer_weights == "master"  # the preset's forward: autocast alone
    cast = make_policy("transformer", world, trainer_weights="cast")
    assert (cast.trainer_precision, cast.trainer_weights) == ("bf16", "cast")
    plain = make_policy("transformer", make_world("synthetic_lm", preset="seed_scale_v6"))
    assert (plain.trainer_precision, plain.sampler_precision, plain.logp_micro_batch) == ("fp32", "fp32", 0)
    assert plain.trainer_weights == "master"
