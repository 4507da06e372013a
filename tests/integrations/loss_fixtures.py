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


def grouped_rewards(size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 outcome rewards [B] and group ids [B] of groups of ``size``: random 0/1 rewards, random rewards in
    [0, 1), and groups of equal rewards (all 0, all 1, all 0.5: exactly representable, so the engines' float32 mean
    leaves no residue), in that order."""
    gen = torch.Generator().manual_seed(seed)
    blocks = [torch.randint(0, 2, (4, size), generator=gen).float(), torch.rand(4, size, generator=gen),
              torch.tensor([[0.0], [1.0], [0.5]]).expand(3, size)]
    rewards = torch.cat(blocks).reshape(-1)
    return rewards, torch.arange(len(rewards) // size).repeat_interleave(size)
