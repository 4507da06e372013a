"""GRPO's group-relative advantage against verl's own ``core_algos.compute_grpo_outcome_advantage`` (``torch.std``:
Bessel-corrected, ε = 1e-6), our default ``std``, and its ``norm_adv_by_std_in_grpo=False`` (Dr. GRPO), our
``mean``.  Groups of 2, 4 and 8, groups of equal rewards among them.  Needs verl: skipped where it is not importable
(it runs in the verl environment of ``.ci/run``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")

from offpolicylab.objectives.advantages import group_advantages  # noqa: E402
from tests.integrations.loss_fixtures import grouped_rewards  # noqa: E402


def verl_advantages(rewards: torch.Tensor, groups: torch.Tensor, std: bool) -> torch.Tensor:
    """verl's advantage of outcome rewards placed on the last of three response tokens (its scores are the row
    sums), read from the first token."""
    token_rewards = torch.zeros(len(rewards), 3)
    token_rewards[:, -1] = rewards
    advantages, _ = core_algos.compute_grpo_outcome_advantage(
        token_rewards, torch.ones(len(rewards), 3), np.array([f"prompt{g}" for g in groups.tolist()], dtype=object),
        norm_adv_by_std_in_grpo=std)
    return advantages[:, 0]


@pytest.mark.parametrize("size", [2, 4, 8])
@pytest.mark.parametrize(("estimator", "std"), [("std", True), ("mean", False)])
def test_group_advantages_equal_verl(size: int, estimator: str, std: bool) -> None:
    rewards, groups = grouped_rewards(size)
    expected = verl_advantages(rewards, groups, std)
    assert torch.equal(expected[-3 * size:], torch.zeros(3 * size))  # verl too gives equal rewards A = 0
    torch.testing.assert_close(group_advantages(rewards, groups, estimator), expected, rtol=1e-5, atol=1e-6)


def test_population_std_is_not_verls() -> None:
    """The population std is a named option only: for groups of 2 its advantages are √2 times verl's."""
    rewards, groups = grouped_rewards(2)
    expected = verl_advantages(rewards, groups, True)
    varied = expected != 0
    ratio = group_advantages(rewards, groups, "std_population")[varied] / expected[varied]
    torch.testing.assert_close(ratio, torch.full_like(ratio, 2**0.5), rtol=1e-4, atol=0)  # ε shifts it by ε/σ
