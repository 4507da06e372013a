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
objective's state (checkpointed with it), kept and released through its methods (``DecoupledPPO.keep_proximal``,
``kept_proximal``, ``release_proximal``): this module decides when, the objective holds them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from offpolicylab.contracts import Policy, Rollout
from offpolicylab.staleness import Schedule


def proximal_logp(objective: Any, schedule: Schedule, buffer: dict[int, Rollout], policy: Policy, update: int,
                  total: int, logp: Tensor) -> Tensor:
    """log π_prox of the batch a run consumes at ``update`` (of ``total``), shaped like ``logp`` (its current
    log π_θ; see the module docstring for the rule).

    At the first update of a training step the buffered batches first consumed later in the step are scored here
    by ``policy`` (one no-grad forward per batch) and kept by the objective until the schedule releases them."""
    key = schedule.key(update)
    _score_step(objective, schedule, buffer, policy, update, total, key)
    released = schedule.release_after(update, total)
    current = logp.detach()
    value = objective.kept_proximal(key)
    if value is None:  # first consumption, not scored at the step's start: the current policy
        value = current
        if key not in released:
            objective.keep_proximal(key, value)
    objective.release_proximal(released)
    return _fit(value.to(current.device), current)


def _score_step(objective: Any, schedule: Schedule, buffer: dict[int, Rollout], policy: Policy, update: int,
                total: int, key: int) -> None:
    """At a training step's first update, score with no grad the buffered batches the run will first consume later
    in the step, and keep them in the objective's state."""
    period = int(objective.prox_period)
    if update % period:
        return
    for later in range(update + 1, min(update + period, total)):
        batch = schedule.key(later)
        if batch != key and objective.kept_proximal(batch) is None and batch in buffer:  # else scored when consumed
            with torch.no_grad():
                objective.keep_proximal(batch, policy.score(buffer[batch])[0])


def _fit(value: Tensor, like: Tensor) -> Tensor:
    """``value`` with ``like``'s number of columns: responses are right-padded, so columns beyond a batch's own width
    are padding (cut, or filled with 0; the batch masks them)."""
    if value.shape[0] != like.shape[0]:
        raise RuntimeError(f"log π_prox has {value.shape[0]} rows but the batch has {like.shape[0]}")
    width = like.shape[1]
    if value.shape[1] >= width:
        return value[:, :width]
    return torch.nn.functional.pad(value, (0, width - value.shape[1]))
