"""The one reward call, :func:`offpolicylab.contracts.rewards_of`: the world's ``reward`` of a rollout's responses."""

from __future__ import annotations

import torch

from offpolicylab.contracts import Rollout, rewards_of


class CountingWorld:
    """Reward = number of response tokens + the prompt index / 4, in float64 (values worked by hand below); records
    the generator it was given."""

    def __init__(self) -> None:
        self.generators: list[torch.Generator | None] = []

    def reward(self, prompt_index, response_ids, response_mask, generator=None):
        self.generators.append(generator)
        return response_mask.sum(-1).double() + prompt_index.double() / 4


def test_rewards_of_calls_reward_once_and_returns_float32() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    rollout = Rollout(prompt_ids=torch.zeros(2, 1, dtype=torch.long), prompt_mask=torch.ones(2, 1),
                      response_ids=torch.zeros(2, 3, dtype=torch.long), response_mask=mask,
                      behavior_logp=torch.zeros(2, 3), group_ids=torch.tensor([0, 1]),
                      prompt_index=torch.tensor([1, 2]))
    world, generator = CountingWorld(), torch.Generator()
    rewards = rewards_of(world, rollout, generator)  # type: ignore[arg-type]
    assert rewards.dtype == torch.float32 and rewards.tolist() == [2.25, 1.5]
    assert rewards_of(world, rollout).tolist() == [2.25, 1.5]  # type: ignore[arg-type]
    assert world.generators == [generator, None]
