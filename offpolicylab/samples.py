"""What a run directory's sample files hold (``samples/update_XXXXXX.npz``, written by
:meth:`~offpolicylab.run_dir.RunDir.write_samples`): the histogram arrays every run writes and the whole token batch
that ``offpolicylab replay`` scores again.

- histogram arrays: valid tokens (at most ``MAX_SAMPLE_TOKENS``, subsampled without replacement by a generator of
  their own) of ``log_ratio`` Δ = log π_θ − log π_behaviour (before any cap), ``advantage``, ``entropy`` and ``kept``
  (1 = the token carried gradient), per sequence ``seq_log_ratio`` (mean Δ) and ``staleness``;
- the whole batch: ``batch_*`` ``[B, T]`` arrays (``log_ratio``, ``advantage``, ``mask``, ``kept`` and, when known,
  ``entropy`` and ``sampler_log_ratio`` = log π_behaviour − log π_sampler), ``batch_rewards``, ``batch_group_ids``
  and ``micro_batch`` ``[B]`` (which micro-batch each row was scored in: one for our own runs, several for a
  recorded verl / TRL step).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from offpolicylab.diagnostics import stats
from offpolicylab.objectives import TokenBatch
from offpolicylab.run_dir import MAX_SAMPLE_TOKENS

UNKNOWN_STALENESS = -1.0
#: the [B, T] arrays of a recorded batch (``batch_`` + name); entropy and sampler_log_ratio only when known
BATCH_FIELDS = ("log_ratio", "advantage", "mask", "kept", "entropy", "sampler_log_ratio")


def sample_arrays(batch: TokenBatch, kept: Tensor | None, seed: int, update: int) -> dict[str, np.ndarray]:
    """The sample file of one update of our own runs: :func:`histogram_samples` and :func:`whole_batch`."""
    return {**histogram_samples(batch, kept, seed, update), **whole_batch(batch, kept)}


def histogram_samples(batch: TokenBatch, kept: Tensor | None, seed: int, update: int) -> dict[str, np.ndarray]:
    """Valid-token samples (≤ MAX_SAMPLE_TOKENS, subsampled without replacement by a generator of its own) of log r,
    advantage, entropy and kept (1 = the token carried gradient), plus per-sequence log ρ and staleness."""
    valid = batch.mask > 0
    log_ratio = batch.log_ratio.detach()
    columns = {
        "log_ratio": log_ratio[valid], "advantage": batch.advantages[valid],
        "entropy": (batch.entropy if batch.entropy is not None else torch.zeros_like(log_ratio))[valid],
        "kept": (kept if kept is not None else batch.mask)[valid],
    }
    arrays = {key: value.detach().cpu().numpy().astype(np.float32) for key, value in columns.items()}
    count = arrays["log_ratio"].shape[0]
    if count > MAX_SAMPLE_TOKENS:
        pick = np.sort(np.random.default_rng([seed, update]).choice(count, MAX_SAMPLE_TOKENS, replace=False))
        arrays = {key: value[pick] for key, value in arrays.items()}
    arrays["seq_log_ratio"] = stats.sequence_log_ratio(log_ratio, batch.mask).cpu().numpy().astype(np.float32)
    arrays["staleness"] = batch.staleness.cpu().numpy().astype(np.float32)
    return arrays


def batch_part(batch: TokenBatch, kept: Tensor | None, staleness: float | None = None) -> dict[str, np.ndarray]:
    """The arrays of one micro-batch (see the module docstring), as CPU NumPy copies."""
    part = {"log_ratio": batch.delta(), "advantage": batch.advantages, "mask": batch.mask,
            "kept": batch.mask if kept is None else kept}
    if batch.entropy is not None:
        part["entropy"] = batch.entropy
    if batch.sampler_logp is not None:
        part["sampler_log_ratio"] = (batch.behavior_logp - batch.sampler_logp) * batch.mask
    if staleness is not None:
        part["staleness"] = torch.full((batch.batch_size,), float(staleness))
    elif batch.staleness is not None:
        part["staleness"] = batch.staleness
    for name in ("rewards", "group_ids"):
        if getattr(batch, name) is not None:
            part[name] = getattr(batch, name)
    return {key: _numpy(value) for key, value in part.items()}


def whole_batch(batch: TokenBatch, kept: Tensor | None) -> dict[str, np.ndarray]:
    """The ``batch_*`` arrays and ``micro_batch`` of one batch scored in one call: what a sample file of our own
    runs needs besides its histogram arrays for ``offpolicylab replay``."""
    return batch_arrays([batch_part(batch, kept)])


def batch_arrays(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Micro-batches joined: ``batch_*`` right-padded to the longest, ``micro_batch`` numbering their rows."""
    width = max(p["log_ratio"].shape[1] for p in parts)
    arrays: dict[str, np.ndarray] = {}
    for name in BATCH_FIELDS:
        if all(name in p for p in parts):
            arrays[f"batch_{name}"] = np.concatenate([_pad(p[name], width) for p in parts])
    for name in ("rewards", "group_ids"):
        if all(name in p for p in parts):
            arrays[f"batch_{name}"] = np.concatenate([p[name] for p in parts])
    arrays["micro_batch"] = np.concatenate([np.full(p["log_ratio"].shape[0], i, dtype=np.int32)
                                            for i, p in enumerate(parts)])
    return arrays


def record_arrays(parts: list[dict[str, np.ndarray]], update: int) -> dict[str, np.ndarray]:
    """One step's micro-batches as one sample file: the histogram arrays of our own runs (the trainer's
    ``histogram_samples`` of the joined batch: valid tokens, subsampled to ``MAX_SAMPLE_TOKENS``) and the whole
    batch (``batch_*``, right-padded to the longest micro-batch; ``micro_batch`` numbers the rows' micro-batches)."""
    arrays = batch_arrays(parts)
    rows = arrays["micro_batch"].shape[0]
    staleness = (np.concatenate([p["staleness"] for p in parts]) if all("staleness" in p for p in parts)
                 else np.full(rows, UNKNOWN_STALENESS))
    log_ratio = torch.from_numpy(arrays["batch_log_ratio"])
    entropy = arrays.get("batch_entropy")
    joined = TokenBatch(logp=log_ratio, behavior_logp=torch.zeros_like(log_ratio),
                        advantages=torch.from_numpy(arrays["batch_advantage"]).to(log_ratio.dtype),
                        mask=torch.from_numpy(arrays["batch_mask"]).to(log_ratio.dtype),
                        entropy=None if entropy is None else torch.from_numpy(entropy).to(log_ratio.dtype),
                        staleness=torch.from_numpy(staleness.astype(np.float32)))
    flat = histogram_samples(joined, torch.from_numpy(arrays["batch_kept"]).to(log_ratio.dtype), 0, update)
    if entropy is None:
        del flat["entropy"]  # not known: no zeros that a histogram would show as entropy 0
    return {**flat, **arrays}


def _numpy(value: Tensor) -> np.ndarray:
    """A CPU copy: float64 stays float64, other floats become float32 (bf16 / fp16 values are exact there)."""
    value = value.detach()
    if torch.is_floating_point(value) and value.dtype != torch.float64:
        value = value.float()
    return value.cpu().numpy().copy()


def _pad(values: np.ndarray, width: int) -> np.ndarray:
    return np.pad(values, ((0, 0), (0, width - values.shape[1])))
