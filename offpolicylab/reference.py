"""The reference policy of the KL penalty (``kl_coef`` of every objective, :mod:`offpolicylab.objectives.regularization`):
π_ref = π₀, the frozen copy of the initial policy the trainer keeps.  Each batch the penalty needs is scored by π₀
once (no grad) into ``TokenBatch.ref_logp``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from offpolicylab.contracts import Policy, Rollout
from offpolicylab.objectives import Objective


def uses_reference(objectives: Iterable[Objective]) -> bool:
    """Whether any of ``objectives`` adds the KL penalty (β = ``kl_coef`` > 0), so that π₀ must score its batches."""
    return any(getattr(objective, "kl_coef", 0.0) > 0 for objective in objectives)


def reference_logp(reference: Policy | None, rollout: Rollout, objectives: Iterable[Objective]) -> Tensor | None:
    """log π_ref(y_t | x, y_<t) [B, T] of the rollout's response tokens at its temperature (detached, the rollout's
    dtype), or None when no objective uses it."""
    if not uses_reference(objectives):
        return None
    if reference is None:
        raise ValueError("kl_coef > 0 needs the frozen initial policy π₀, which this run does not keep")
    with torch.no_grad():
        logp, _ = reference.score(rollout)
    return logp.detach().to(rollout.behavior_logp.dtype)
