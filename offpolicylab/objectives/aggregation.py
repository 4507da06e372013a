"""Loss aggregation modes (kept apart from the losses, as in verl's ``agg_loss``).

- ``token-mean``:          L = Σ_{i,t} m_it·ℓ_it / Σ_{i,t} m_it
- ``seq-mean-token-mean``: L = (1/B') Σ_i [Σ_t m_it·ℓ_it / Σ_t m_it], B' = sequences with at least one token
- ``seq-mean-token-sum``:  L = (1/B) Σ_i Σ_t m_it·ℓ_it

``m`` is the batch's response mask: tokens an objective masks out still count in the denominator (their loss is 0),
which is how PPO clipping, REC and M2PO ("loss averaged over all tokens") are defined.

Padded tokens may hold anything (even inf / nan): they are masked out with ``torch.where``.  Objectives pass
``finite_padding=True``: ℓ is then known to be finite on padded tokens (a :class:`~offpolicylab.objectives.TokenBatch`
holds 0 in every token field there) and the padding is removed by multiplying with the 0/1 mask instead — the same
sum exactly, and on CPU cheaper than ``torch.where`` (benchmarks/README.md).
"""

from __future__ import annotations

import torch
from torch import Tensor

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def aggregate(per_token_loss: Tensor, mask: Tensor, mode: str = "token-mean", *, finite_padding: bool = False) -> Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar with one of :data:`AGG_MODES` (``finite_padding``: see above)."""
    if finite_padding:
        masked = per_token_loss * mask.to(per_token_loss.dtype)
    else:
        masked = torch.where(mask > 0, per_token_loss, torch.zeros((), dtype=per_token_loss.dtype))
    if mode == "token-mean":
        return masked.sum() / mask.sum().clamp_min(1.0)
    if mode == "seq-mean-token-mean":
        tokens = mask.sum(dim=-1)
        seq_mean = masked.sum(dim=-1) / tokens.clamp_min(1.0)
        return seq_mean.sum() / (tokens > 0).sum().clamp_min(1)
    if mode == "seq-mean-token-sum":
        return masked.sum(dim=-1).mean()
    raise ValueError(f"unknown aggregation mode {mode!r}; valid: {', '.join(AGG_MODES)}")
