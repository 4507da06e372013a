"""Advantage estimators, beside the objectives that read them (as verl keeps its estimators in ``core_algos``):
group-relative advantages, one per sequence — ``mean`` A_i = r_i − mean_{j∈g(i)} r_j (REC paper, Yao et al. 2025)
or ``std`` A_i = (r_i − r̄)/(std_{j∈g(i)} r_j + 1e-6) (GRPO, Shao et al. 2024, DeepSeekMath, arXiv 2402.03300),
the Bessel-corrected std as verl computes it (:data:`ESTIMATORS`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["ESTIMATORS", "group_advantages", "group_min_max"]


#: The group-relative advantage estimators: name → (divide by the group's std, Bessel's correction, ε).
#: ``std`` is verl's ``compute_grpo_outcome_advantage`` (``torch.std``, unbiased, + 1e-6), ``std_trl`` TRL's GRPO
#: trainer (``nanstd``, unbiased, + 1e-4), ``std_population`` the population std (÷ n) + 1e-6.
ESTIMATORS: dict[str, tuple[bool, bool, float]] = {
    "mean": (False, False, 0.0), "std": (True, True, 1e-6), "std_trl": (True, True, 1e-4),
    "std_population": (True, False, 1e-6),
}


def group_advantages(rewards: Tensor, group_ids: Tensor, estimator: str = "std") -> Tensor:
    """A_i = r_i − r̄_{g(i)} (``mean``; the REC paper, Yao et al. 2025), or ÷ (s_{g(i)} + ε) for the std estimators
    (GRPO, Shao et al. 2024, DeepSeekMath, arXiv 2402.03300) as the engines compute it: ``std`` is verl's
    (``compute_grpo_outcome_advantage``: s = ``torch.std``, Bessel's correction s² = Σ (r − r̄)² / (n − 1),
    ε = 1e-6), ``std_trl`` TRL's (``GRPOTrainer``: ``nanstd``, also Bessel-corrected, ε = 1e-4), ``std_population``
    the population std s² = Σ (r − r̄)² / n with ε = 1e-6 (:data:`ESTIMATORS`).

    A group whose rewards are all equal (a group of one included) gets A = 0 exactly, as the formula gives (and as
    both engines give when the rewards are exactly representable): a float32 mean can miss the common value by an
    ulp (three rewards of 0.9 sum to 2.6999998), and that residue divided by s + ε ≈ 1e-6 would be an advantage of
    ≈ −0.007 for every response of the group (verl's ``torch.mean`` leaves the same residue).  For a group of one,
    where the unbiased std is undefined (TRL: NaN; verl: mean 0, std 1, A = r), A = 0: it carries no relative
    information."""
    divide, bessel, eps = ESTIMATORS[estimator]
    if rewards.numel() == 0:
        return rewards.clone()
    groups = int(group_ids.max()) + 1
    zeros = rewards.new_zeros(groups)
    count = zeros.index_add(0, group_ids, torch.ones_like(rewards))
    mean = zeros.index_add(0, group_ids, rewards) / count
    low, high = group_min_max(rewards, group_ids)
    centered = torch.where((low == high)[group_ids], torch.zeros_like(rewards), rewards - mean[group_ids])
    if not divide:
        return centered
    var = zeros.index_add(0, group_ids, centered**2) / ((count - 1).clamp_min(1) if bessel else count)
    return centered / (var.sqrt()[group_ids] + eps)


def group_min_max(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """(min_{j∈g} r_j, max_{j∈g} r_j) of each group g = 0 … max(group_ids), [G] each (±inf for an id with no row)."""
    groups = int(group_ids.max()) + 1
    low = rewards.new_full((groups,), math.inf).scatter_reduce(0, group_ids, rewards, "amin")
    high = rewards.new_full((groups,), -math.inf).scatter_reduce(0, group_ids, rewards, "amax")
    return low, high
