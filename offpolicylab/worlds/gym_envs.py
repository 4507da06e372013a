"""Gymnasium ``Env`` wrappers of the toy worlds, registered under the ``offpolicylab/`` namespace.

- :class:`BanditEnv`: one step; observation = a constant ``Box(0, 1, (1,))`` zero (the dummy prompt), action = an
  arm in ``Discrete(K)``, reward r_a (or a Bernoulli(r_a) draw from the env's ``np_random``), then terminated.
- :class:`TokenMDPEnv`: observation = the prefix ``[prompt (P), generated tokens (T)]`` as ``MultiDiscrete``, where
  not-yet-generated positions hold ``PAD = max(prompt vocab, V)``; action = the next token in ``Discrete(V)``;
  reward 0 until the episode ends (after T tokens or at EOS), then the world's terminal reward.  ``reset`` draws the
  prompt from ``np_random`` unless ``options={"prompt_index": i}``.
- :class:`SyntheticLMEnv`: the same for the synthetic-LM world (V = 256 tokens, T = 32, reward 1 / 0.1 / 0).

Registered ids (:data:`ENV_IDS`) are created on ``import offpolicylab.worlds``; ``gymnasium.make("offpolicylab/TokenMDP-v0")``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from offpolicylab.worlds.bandits import PITFALL_BEHAVIOR, PITFALL_REWARDS, SoftmaxBandit
from offpolicylab.worlds.synthetic_lm_presets import build_synthetic_lm
from offpolicylab.worlds.token_mdp import TokenMDP


class BanditEnv(gym.Env):
    """A K-arm bandit as a one-step episode (see module docstring)."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, rewards: Sequence[float] = (0.1, 0.3, 0.5, 0.7, 0.9), bernoulli: bool = False,
                 behavior_probs: Sequence[float] | None = None) -> None:
        self.world = SoftmaxBandit(rewards, bernoulli=bernoulli, behavior_probs=behavior_probs)
        self.observation_space = spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float32)
        self.action_space = spaces.Discrete(self.world.vocab_size)
        self._rewards = self.world.rewards.double().numpy()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return np.zeros(1, dtype=np.float32), {}

    def step(self, action: int):
        if not self.action_space.contains(action):
            raise ValueError(f"action must be an arm in [0, {self.world.vocab_size - 1}], got {action!r}")
        mean = float(self._rewards[int(action)])
        reward = float(self.np_random.random() < mean) if self.world.bernoulli else mean
        return np.zeros(1, dtype=np.float32), reward, True, False, {"expected_reward": mean}


class TokenMDPEnv(gym.Env):
    """A :class:`~offpolicylab.worlds.token_mdp.TokenMDP` as a token-by-token episode; keyword arguments go to ``TokenMDP``."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, **world: Any) -> None:
        self._attach(TokenMDP(**world))

    def _attach(self, world: Any) -> None:
        """Spaces and buffers for ``world`` (fixed-length prompts ``prompt_tokens`` [N, P], ``num_prompts``)."""
        self.world = world
        self.pad = max(self.world.prompt_vocab_size, self.world.vocab_size)
        self.prompt_len, self.length = self.world.prompt_len, self.world.max_response_len
        self.observation_space = spaces.MultiDiscrete(np.full(self.prompt_len + self.length, self.pad + 1))
        self.action_space = spaces.Discrete(self.world.vocab_size)
        self._obs = np.full(self.prompt_len + self.length, self.pad, dtype=np.int64)
        self._prompt_index, self._t, self._done = 0, 0, True

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        index = (options or {}).get("prompt_index")
        if index is None:
            index = int(self.np_random.integers(self.world.num_prompts))
        elif not 0 <= int(index) < self.world.num_prompts:
            raise ValueError(f"prompt_index must be in [0, {self.world.num_prompts - 1}], got {index!r}")
        self._prompt_index, self._t, self._done = int(index), 0, False
        self._obs = np.full(self.prompt_len + self.length, self.pad, dtype=np.int64)
        self._obs[: self.prompt_len] = self.world.prompt_tokens[self._prompt_index].numpy()
        return self._obs.copy(), {"prompt_index": self._prompt_index}

    def step(self, action: int):
        if self._done:
            raise RuntimeError("episode is over; call reset()")
        if not self.action_space.contains(action):
            raise ValueError(f"action must be a token in [0, {self.world.vocab_size - 1}], got {action!r}")
        self._obs[self.prompt_len + self._t] = int(action)
        self._t += 1
        self._done = self._t == self.length or (self.world.eos_id is not None and int(action) == self.world.eos_id)
        reward = self._terminal_reward() if self._done else 0.0
        return self._obs.copy(), reward, self._done, False, {"prompt_index": self._prompt_index}

    def _terminal_reward(self) -> float:
        fill = 0 if self.world.eos_id is None else self.world.eos_id
        response = np.where(self._obs[self.prompt_len:] == self.pad, fill, self._obs[self.prompt_len:])
        mask = np.zeros(self.length, dtype=np.float32)
        mask[: self._t] = 1.0
        reward = self.world.reward(torch.tensor([self._prompt_index]), torch.from_numpy(response)[None],
                                  torch.from_numpy(mask)[None])
        return float(reward[0])


class SyntheticLMEnv(TokenMDPEnv):
    """The :mod:`offpolicylab.worlds.synthetic_lm` world token by token (as :class:`TokenMDPEnv`); keyword arguments are the
    world's parameters (``make_world("synthetic_lm", ...)``); the first build of a recipe distils π₀."""

    def __init__(self, **world: Any) -> None:
        self._attach(build_synthetic_lm(**world))


ENV_IDS: dict[str, tuple[str, dict[str, Any]]] = {
    "offpolicylab/Bandit-v0": ("offpolicylab.worlds.gym_envs:BanditEnv", {}),
    "offpolicylab/BernoulliBandit-v0": ("offpolicylab.worlds.gym_envs:BanditEnv", {"bernoulli": True}),
    "offpolicylab/ThreeArmPitfall-v0": (
        "offpolicylab.worlds.gym_envs:BanditEnv", {"rewards": PITFALL_REWARDS, "behavior_probs": PITFALL_BEHAVIOR}),
    "offpolicylab/TokenMDP-v0": ("offpolicylab.worlds.gym_envs:TokenMDPEnv", {"family": "target"}),
    "offpolicylab/TokenMDPEos-v0": ("offpolicylab.worlds.gym_envs:TokenMDPEnv", {"family": "target", "eos": True}),
    "offpolicylab/TokenMDPArithmetic-v0": ("offpolicylab.worlds.gym_envs:TokenMDPEnv", {"family": "arithmetic", "eos": True,
                                                                         "length": 3, "vocab_size": 5}),
    "offpolicylab/TokenMDPForking-v0": ("offpolicylab.worlds.gym_envs:TokenMDPEnv", {"family": "forking"}),
    "offpolicylab/SyntheticLM-v0": ("offpolicylab.worlds.gym_envs:SyntheticLMEnv", {}),
}


def register_envs() -> list[str]:
    """Register every id of :data:`ENV_IDS` once (idempotent); returns the ids."""
    for env_id, (entry_point, kwargs) in ENV_IDS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, kwargs=kwargs)
    return list(ENV_IDS)
