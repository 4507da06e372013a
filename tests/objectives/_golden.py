"""Shared helpers for golden-value objective tests: an independent NumPy aggregation and a runner that returns the
loss and its gradient w.r.t. ``logp``.

Golden values are built as Σ w_it·ℓ_it with hand-derived per-token loss ℓ and per-token derivative g = ∂ℓ/∂logp,
so the expected gradient is w_it·g_it, with w the aggregation weights below (derived from the formulas in
``offpolicylab/objectives/aggregation.py``'s docstring, not from its code).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from offpolicylab.objectives import AGG_MODES, LossOutput, TokenBatch, get_objective

__all__ = ["AGG_MODES", "agg_weights", "batch_data", "expected", "extreme_log_ratio_batch", "random_batch", "run", "tensor"]


def tensor(values: Any, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.float64), dtype=dtype)


def agg_weights(mask: np.ndarray, mode: str) -> np.ndarray:
    """w_it such that the aggregated loss is Σ w_it·ℓ_it."""
    mask = np.asarray(mask, dtype=np.float64)
    if mode == "token-mean":
        return mask / max(mask.sum(), 1.0)
    if mode == "seq-mean-token-mean":
        tokens = mask.sum(axis=1, keepdims=True)
        non_empty = max(int((tokens > 0).sum()), 1)
        return np.divide(mask, tokens, out=np.zeros_like(mask), where=tokens > 0) / non_empty
    if mode == "seq-mean-token-sum":
        return mask / mask.shape[0]
    raise AssertionError(mode)


def expected(per_token_loss: np.ndarray, per_token_grad: np.ndarray, mask: np.ndarray, mode: str):
    """(loss, grad [B, T]) from per-token values and derivatives."""
    weights = agg_weights(mask, mode)
    masked_loss = np.where(np.asarray(mask) > 0, per_token_loss, 0.0)
    return float((weights * masked_loss).sum()), weights * np.where(np.asarray(mask) > 0, per_token_grad, 0.0)


def run(
    name: str, data: dict[str, Any], *, dtype: torch.dtype = torch.float64, **params: Any
) -> tuple[float, np.ndarray, LossOutput]:
    """Build a TokenBatch from ``data`` (field name → array; float fields cast to ``dtype``, float64 by default),
    apply objective ``name`` with ``params``; return (loss, d loss / d logp, output)."""
    fields = {}
    for key, value in data.items():
        if value is None or isinstance(value, torch.Tensor):
            fields[key] = value
        else:
            fields[key] = tensor(value, dtype)
    fields["logp"] = fields["logp"].detach().clone().requires_grad_(True)
    batch = TokenBatch(**fields)
    out = get_objective(name, **params)(batch)
    out.loss.backward()
    return float(out.loss.detach()), fields["logp"].grad.numpy().copy(), out


def batch_data(logp: Any, behavior_logp: Any, advantages: Any, mask: Any, **extra: Any) -> dict[str, Any]:
    return {"logp": logp, "behavior_logp": behavior_logp, "advantages": advantages, "mask": mask, **extra}


def random_batch(seed: int, batch: int = 4, length: int = 6, spread: float = 0.5) -> dict[str, np.ndarray]:
    """A random ragged float64 batch (every row has ≥ 1 token) with log-ratios ~ N(0, spread²)."""
    rng = np.random.default_rng(seed)
    logp = np.log(rng.uniform(0.05, 0.95, size=(batch, length)))
    behavior = logp - rng.normal(0.0, spread, size=(batch, length))
    advantages = rng.normal(size=batch)
    lengths = rng.integers(1, length + 1, size=batch)
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.float64)
    return {"logp": logp, "behavior_logp": behavior, "advantages": advantages, "mask": mask}


def extreme_log_ratio_batch(seed: int) -> dict[str, np.ndarray]:
    """A random batch whose log-ratios alternate between +50 and −50."""
    data = random_batch(seed)
    signs = np.where(np.arange(data["logp"].size).reshape(data["logp"].shape) % 2 == 0, 50.0, -50.0)
    data["behavior_logp"] = data["logp"] - signs
    return data
