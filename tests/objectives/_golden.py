"""Shared helpers for golden-value objective tests: an independent NumPy aggregation and a runner that returns the
loss and its gradient w.r.t. ``logp``.

Golden values are built as Σ w_it·ℓ_it with hand-derived per-token loss ℓ and per-token derivative g = ∂ℓ/∂logp,
so the expected gradient is w_it·g_it, with w the aggregation weights below (derived from the formulas in
``offpolicylab/objectives/aggregation.py``'s docstring, not from its code).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from offpolicylab.objectives import AGG_MODES, LossOutput, TokenBatch, get_objective

__all__ = [
    "AGG_MODES",
    "agg_weights",
    "assert_finite_at_extreme_log_ratios",
    "assert_padding_is_inert",
    "assert_ratio_one_equals_reinforce",
    "batch_data",
    "expected",
    "extreme_log_ratio_batch",
    "log_ratio_batch",
    "random_batch",
    "run",
    "tensor",
]


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


def log_ratio_batch(
    log_ratio: Any, advantages: Any, mask: Any = None, *, behavior: float
) -> tuple[TokenBatch, torch.Tensor]:
    """A float32 TokenBatch with logp = behavior + log_ratio (behavior constant; mask all ones when None), and its
    leaf ``logp`` (requires grad) for gradient checks."""
    log_ratio = torch.as_tensor(log_ratio, dtype=torch.float32)
    behavior_logp = torch.full_like(log_ratio, behavior)
    logp = (behavior_logp + log_ratio).clone().requires_grad_(True)
    mask = torch.ones_like(log_ratio) if mask is None else torch.as_tensor(mask, dtype=torch.float32)
    advantages = torch.as_tensor(advantages, dtype=torch.float32)
    return TokenBatch(logp=logp, behavior_logp=behavior_logp, advantages=advantages, mask=mask), logp


def assert_ratio_one_equals_reinforce(name: str, seed: int, agg: str, **params: Any) -> None:
    """At π = μ (behavior_logp = logp) on ``random_batch(seed)``, objective ``name`` has REINFORCE's gradient and
    clips nothing (clip_frac = 0)."""
    data = random_batch(seed)
    data["behavior_logp"] = data["logp"].copy()
    _, grad, out = run(name, data, agg=agg, **params)
    _, reinforce_grad, _ = run("reinforce", data, agg=agg)
    np.testing.assert_allclose(grad, reinforce_grad, rtol=1e-12, atol=1e-15)
    assert float(out.metrics["clip_frac"]) == 0.0


def assert_finite_at_extreme_log_ratios(
    name: str, data: dict[str, Any], dtype: torch.dtype, **params: Any
) -> None:
    """Loss and gradient of objective ``name`` on ``data`` (e.g. ``extreme_log_ratio_batch``) are finite."""
    loss, grad, _ = run(name, data, dtype=dtype, **params)
    assert np.isfinite(loss) and np.all(np.isfinite(grad))


def assert_padding_is_inert(
    name: str, clean: dict[str, Any], *, behavior_garbage: float = -np.inf, **params: Any
) -> None:
    """logp = nan and behavior_logp = ``behavior_garbage`` on the padded tokens of ``clean`` change neither loss
    nor gradient, and padded tokens get zero gradient."""
    pad = np.asarray(clean["mask"]) == 0
    dirty = dict(
        clean,
        logp=np.array(clean["logp"], copy=True),
        behavior_logp=np.array(clean["behavior_logp"], copy=True),
    )
    dirty["logp"][pad] = np.nan
    dirty["behavior_logp"][pad] = behavior_garbage
    loss_c, grad_c, _ = run(name, clean, **params)
    loss_d, grad_d, _ = run(name, dirty, **params)
    assert loss_d == pytest.approx(loss_c, rel=1e-12)
    np.testing.assert_allclose(grad_d, grad_c, rtol=1e-12)
    assert np.all(grad_d[pad] == 0.0)
