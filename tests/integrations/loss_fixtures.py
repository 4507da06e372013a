"""Shared fixtures of the aggregation golden tests against TRL's and verl's own code: ragged completion masks (one
full row, shorter ones, a one-token row), old / new log-probs and per-sequence advantages, in float64."""

from __future__ import annotations

import torch


def ragged_batch(seed: int, batch: int = 5, length: int = 7, spread: float = 0.3) -> dict[str, torch.Tensor]:
    """``old`` / ``new`` [B, T] log-probs (``new`` requires grad), ``advantages`` [B], 0/1 float ``mask`` [B, T]
    with row lengths T, T−2, 1, T−1, 3 (then T); padding holds finite junk (−7), as the engines' tensors do."""
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=gen, dtype=torch.float64) * 2.0 - 0.1
    new = (old + spread * torch.randn(batch, length, generator=gen, dtype=torch.float64)).requires_grad_(True)
    advantages = torch.randn(batch, generator=gen, dtype=torch.float64)
    lengths = torch.tensor(([length, length - 2, 1, length - 1, 3] + [length] * batch)[:batch])
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(torch.float64)
    old = torch.where(mask > 0, old, torch.full_like(old, -7.0))
    return {"old": old, "new": new, "advantages": advantages, "mask": mask}
