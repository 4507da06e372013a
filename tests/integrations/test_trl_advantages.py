"""GRPO's group-relative advantage against TRL's own code: ``GRPOTrainer._generate_and_score_completions``
(``scale_rewards="group"``) computes A = (r − nanmean_g r) / (nanstd_g r + 1e-4) with TRL's ``nanstd``
(``trl/trainer/utils.py``, Bessel-corrected); our ``std_trl`` estimator is that, and our default ``std`` is the
same std with verl's ε = 1e-6.  Groups of 2, 4 and 8, groups of equal rewards among them."""

from __future__ import annotations

import pytest
import torch

trl_utils = pytest.importorskip("trl.trainer.utils")  # optional extra (installed here and in CI)

from offpolicylab.objectives.advantages import group_advantages  # noqa: E402
from tests.integrations.loss_fixtures import grouped_rewards  # noqa: E402


def trl_advantages(rewards: torch.Tensor, size: int, eps: float = 1e-4) -> torch.Tensor:
    """The three lines of ``GRPOTrainer._generate_and_score_completions`` (TRL 1.16, ``scale_rewards="group"``)
    around TRL's own ``nanstd``; ``eps`` is TRL's 1e-4 unless given."""
    grouped = rewards.view(-1, size)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(size, dim=0)
    std = trl_utils.nanstd(grouped, dim=1).repeat_interleave(size, dim=0)
    return (rewards - mean) / (std + eps)


@pytest.mark.parametrize("size", [2, 4, 8])
def test_std_trl_equals_trl(size: int) -> None:
    rewards, groups = grouped_rewards(size)
    expected = trl_advantages(rewards, size)
    assert torch.equal(expected[-3 * size:], torch.zeros(3 * size))  # TRL too gives equal rewards A = 0
    torch.testing.assert_close(group_advantages(rewards, groups, "std_trl"), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("size", [2, 4, 8])
def test_default_std_is_trls_std_with_verls_epsilon(size: int) -> None:
    rewards, groups = grouped_rewards(size, seed=1)
    torch.testing.assert_close(group_advantages(rewards, groups), trl_advantages(rewards, size, eps=1e-6),
                               rtol=1e-5, atol=1e-6)
