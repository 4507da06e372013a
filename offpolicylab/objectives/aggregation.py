"""Loss aggregation modes (kept apart from the losses, as in verl's ``agg_loss``).

- ``token-mean``:              L = Σ_{i,t} m_it·ℓ_it / Σ_{i,t} m_it
- ``seq-mean-token-mean``:     L = (1/B') Σ_i [Σ_t m_it·ℓ_it / Σ_t m_it], B' = sequences with at least one token
- ``seq-mean-token-sum``:      L = (1/B) Σ_i Σ_t m_it·ℓ_it
- ``seq-mean-token-sum-norm``: L = (1/(B·C)) Σ_i Σ_t m_it·ℓ_it, C = ``norm`` (the constant ``agg_norm``; default
  T, the batch's padded length — verl's ``loss_scale_factor`` default)

and TRL's ``GRPOConfig.loss_type`` names, accepted as aliases (:data:`TRL_LOSS_TYPES`):

- ``dr_grpo`` (Dr. GRPO, Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective",
  arXiv:2503.20783): L = (1/(B·L_max)) Σ_i Σ_t m_it·ℓ_it — the length bias of the per-sequence 1/|o_i| removed by a
  constant; L_max is TRL's ``max_completion_length`` (here ``agg_norm``), so it is ``seq-mean-token-sum-norm``.
- ``bnpo``: L = Σ_{i,t} m_it·ℓ_it / Σ_{i,t} m_it over the local batch — ``token-mean``.
- ``dapo`` (DAPO, Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
  arXiv:2503.14476, token-level policy-gradient loss): L = Σ_{i,t} m_it·ℓ_it / N, N the valid tokens of the whole
  optimizer step (TRL: ``num_items_in_batch``, over processes and gradient accumulation).  offpolicylab's trainer
  scores an update's batch in one loss, so N = Σ m_it and it is ``token-mean``; ``dapo`` and ``bnpo`` differ only
  when a step is split across micro-batches or processes.

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

from offpolicylab.diagnostics.stats import total

#: The three base modes (verl's ``loss_agg_mode`` names); every objective's golden tests run over these.
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
#: TRL's ``loss_type`` names that are aggregations → the mode that computes them (see the module docstring).
TRL_LOSS_TYPES = {"dr_grpo": "seq-mean-token-sum-norm", "bnpo": "token-mean", "dapo": "token-mean"}
#: Every value ``agg`` accepts: the base modes, verl's ``seq-mean-token-sum-norm`` and TRL's loss types.
AGG_CHOICES = (*AGG_MODES, "seq-mean-token-sum-norm", *TRL_LOSS_TYPES)


def canonical_agg(mode: str) -> str:
    """The mode that computes ``mode`` (a TRL loss type → its mode; any other name unchanged)."""
    return TRL_LOSS_TYPES.get(mode, mode)


def aggregate(
    per_token_loss: Tensor,
    mask: Tensor,
    mode: str = "token-mean",
    *,
    finite_padding: bool = False,
    norm: float | None = None,
    blocks: int = 1,
    tokens: Tensor | None = None,
) -> Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar with one of :data:`AGG_CHOICES` (``finite_padding``: see
    above; ``norm``: the constant C of ``seq-mean-token-sum-norm`` / ``dr_grpo``, None = T); with ``blocks`` > 1 to
    a [blocks] tensor, each of ``blocks`` equal consecutive row blocks (several runs' batches joined row-wise)
    reduced as it is alone (:func:`~offpolicylab.diagnostics.stats.total`).  ``tokens``: Σ m per block
    (``total(mask, blocks)``) when the caller already has it (``token-mean`` reads it instead of summing the mask)."""
    mode = canonical_agg(mode)
    if finite_padding:
        masked = per_token_loss * mask.to(per_token_loss.dtype)
    else:
        masked = torch.where(mask > 0, per_token_loss, torch.zeros((), dtype=per_token_loss.dtype))
    if mode == "token-mean":
        return total(masked, blocks) / (total(mask, blocks) if tokens is None else tokens).clamp_min(1.0)
    if mode == "seq-mean-token-mean":
        tokens = mask.sum(dim=-1)
        seq_mean = masked.sum(dim=-1) / tokens.clamp_min(1.0)
        return total(seq_mean, blocks) / total(tokens > 0, blocks).clamp_min(1)
    if mode == "seq-mean-token-sum":
        sums = masked.sum(dim=-1)
        return sums.mean() if blocks == 1 else sums.reshape(blocks, -1).mean(-1)
    if mode == "seq-mean-token-sum-norm":
        rows = masked.shape[0] // blocks
        return total(masked, blocks) / (rows * (masked.shape[-1] if norm is None else norm))
    raise ValueError(f"unknown aggregation mode {mode!r}; valid: {', '.join(AGG_CHOICES)}")
