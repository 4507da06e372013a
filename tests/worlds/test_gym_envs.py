"""Gymnasium wrappers: check_env over every env registered under offpolicylab/, plus episode semantics."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import offpolicylab.worlds  # noqa: F401  (registers the offpolicylab/ ids)

# SyntheticLM-v0's default recipe distils a π₀ (minutes, cached); test_synthetic_lm.py checks it with a tiny recipe.
REGISTERED = sorted(env_id for env_id in gym.registry
                    if env_id.startswith("offpolicylab/") and env_id != "offpolicylab/SyntheticLM-v0")


def test_expected_ids_are_registered():
    assert {"offpolicylab/ThreeArmPitfall-v0", "offpolicylab/TokenMDP-v0", "offpolicylab/Bandit-v0",
            "offpolicylab/TokenMDPArithmetic-v0", "offpolicylab/TokenMDPForking-v0"} <= set(REGISTERED)


@pytest.mark.parametrize("env_id", REGISTERED)
def test_check_env(env_id):
    env = gym.make(env_id)
    check_env(env.unwrapped, skip_render_check=True)
    env.close()


def test_token_mdp_episode_reaches_the_target():
    env = gym.make("offpolicylab/TokenMDP-v0").unwrapped
    obs, info = env.reset(seed=0, options={"prompt_index": 3})
    assert info["prompt_index"] == 3
    target = env.world.targets[3].tolist()
    rewards = []
    for t, token in enumerate(target):
        obs, reward, terminated, truncated, _ = env.step(token)
        rewards.append(reward)
        assert terminated == (t == len(target) - 1) and not truncated
    assert rewards == [0.0] * (len(target) - 1) + [1.0]
    assert obs[env.prompt_len:].tolist() == target


def test_eos_ends_the_episode_and_pitfall_rewards():
    env = gym.make("offpolicylab/TokenMDPEos-v0").unwrapped
    env.reset(seed=1)
    _, _, terminated, _, _ = env.step(env.world.eos_id)
    assert terminated
    pitfall = gym.make("offpolicylab/ThreeArmPitfall-v0")
    pitfall.reset(seed=0)
    assert [pitfall.unwrapped.step(a)[1] for a in range(3)] == pytest.approx([0.0, 0.8, 1.0])
