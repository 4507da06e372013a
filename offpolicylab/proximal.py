"""log π_prox for decoupled PPO: which policy is "proximal" in this training loop, and when its log-probs are taken.

Decoupled PPO (AReaL: Fu et al. 2025, arXiv:2505.24298; the ``decoupled_ppo`` objective) clips π_θ/π_prox and
weights each token by π_prox/π_behavior.  AReaL's π_prox is the policy at the start of the training step that
consumes a rollout batch: before the step's P mini-batch updates it recomputes the batch's log-probs with the
current parameters (no grad), and every mini-batch of the batch uses those numbers.  This loop consumes one batch per
optimizer update (:mod:`offpolicylab.staleness`), so with P = the objective's ``prox_period``:

    a training step   = the updates u₀ … u₀+P−1, u₀ a multiple of P
    log π_prox(batch) = log π_{θ_u₀}(y_t | x, y_<t), scored with no grad at u₀, for every batch first consumed
                        during the step and already generated at u₀ (the batch consumed at u₀ uses that update's
                        own log π_θ, detached: the same numbers without a second forward);
                      = log π_{θ_u}(y_t | x, y_<t) at the batch's first consumption u, for a batch generated later
                        within its step (e.g. ``on_policy``: π_prox is then the current policy, u = 1 exactly);
                        and kept for every later consumption of the batch (``epochs:E``, ``offline:D``).

With P = 1 and a schedule that consumes every batch once (``stale_k:K``), π_prox = π_θ: nothing is clipped and the
loss is importance sampling against the behaviour policy without a trust region.  The numbers live in the
objective's state (``DecoupledPPO.proximal``, checkpointed with it) and are dropped when the schedule releases the
batch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from offpolicylab.staleness import Schedule


def needs_proximal(group: Any) -> bool:
    """Whether some member of ``group`` (a :class:`~offpolicylab.seeds.SeedGroup`) trains an objective that reads
    ``prox_logp`` (:attr:`Objective.needs_prox`)."""
    return any(getattr(member.objective, "needs_prox", False) for member in group.members)


def proximal_logp(group: Any, schedule: Schedule, update: int, total: int, logp: Tensor) -> Tensor:
    """log π_prox of the batches the members of ``group`` consume at ``update`` (of ``total``), joined row-wise as
    ``logp`` is ([S·B, T], the current log π_θ of those batches; see the module docstring for the rule).

    Members whose objective does not read ``prox_logp`` get their own ``logp``, detached (never read).  At the first
    update of a training step the batches first consumed later in the step are scored here (one no-grad forward of
    the group's policy per batch) and kept in the objectives' state until the schedule releases them."""
    key = schedule.key(update)
    _score_step(group, schedule, update, total, key)
    released = schedule.release_after(update, total)
    blocks = []
    for member, current in zip(group.members, group.split(logp.detach()), strict=True):
        objective = member.objective
        if not getattr(objective, "needs_prox", False):
            blocks.append(current)
            continue
        value = objective.proximal.get(key)
        if value is None:  # first consumption, not scored at the step's start: the current policy
            value = current
            if key not in released:
                objective.proximal[key] = value
        blocks.append(_fit(value.to(current.device), current))
        for done in released:
            objective.proximal.pop(done, None)
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks)


def _score_step(group: Any, schedule: Schedule, update: int, total: int, key: int) -> None:
    """At a training step's first update, score with no grad the buffered batches that members needing π_prox will
    first consume later in the step, and keep each member's rows in its objective's state."""
    wanted: dict[int, list[Any]] = {}  # batch key → the objectives that want its log π_prox now
    for member in group.members:
        objective = member.objective
        period = int(getattr(objective, "prox_period", 1))
        if not getattr(objective, "needs_prox", False) or update % period:
            continue
        for later in range(update + 1, min(update + period, total)):
            batch = schedule.key(later)
            if batch != key and batch not in objective.proximal:
                wanted.setdefault(batch, []).append(objective)
    for batch, objectives in wanted.items():
        if not all(batch in member.buffer for member in group.members):
            continue  # generated later in the step: scored at its first consumption
        joined = group.join_rollouts([member.buffer[batch] for member in group.members])
        with torch.no_grad():
            scored, _ = group.policy.score(joined)
        for member, rows in zip(group.members, group.split(scored.detach()), strict=True):
            if member.objective in objectives:
                member.objective.proximal[batch] = rows


def _fit(value: Tensor, like: Tensor) -> Tensor:
    """``value`` with ``like``'s number of columns: responses are right-padded, so columns beyond a batch's own width
    are padding (cut, or filled with 0; the batch masks them)."""
    if value.shape[0] != like.shape[0]:
        raise RuntimeError(f"log π_prox has {value.shape[0]} rows but the batch has {like.shape[0]}")
    width = like.shape[1]
    if value.shape[1] >= width:
        return value[:, :width]
    return torch.nn.functional.pad(value, (0, width - value.shape[1]))
