"""Stop-gradient importance weights on a REINFORCE loss: CISPO and TOPR.

Both keep every token's gradient (nothing is masked); the ratio only rescales it through a detached weight.
Notation: r = exp(logp − behavior_logp), A = advantage, sg = stop-gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from offpolicylab.diagnostics import stats
from offpolicylab.formulas import clip_ratio
from offpolicylab.objectives.base import Objective, Param, register
from offpolicylab.objectives.batch import TokenBatch


@register("cispo")
class CISPO(Objective):
    """ℓ = −sg(clip(r, 1−ε_low, 1+ε_high))·A·log π_θ
    (CISPO, MiniMax-M1: MiniMax 2025, arXiv:2506.13585, eq. 4–5).

    The paper sets ε_low^IS large ("no lower bound on the IS weight") and tunes only ε_high^IS: default
    ε_low = 1 (bound 0, vacuous; ``inf`` is the same) and ε_high = 0.28 (Trinity-RFT's CISPO default).
    Differences from public code: Trinity-RFT additionally zeroes tokens with (A > 0, r > 1+ε_h) or
    (A < 0, r < 1−ε_l) — the token mask of the paper's *unified* formulation, not CISPO itself — and verl clamps
    the log-ratio at ±20 before exp; we follow the paper (no mask, no clamp).  Reports ``clip_frac``: share of
    valid tokens whose weight was clipped.
    """


    params = {
        "eps_low": Param(1.0, float, low=0.0, doc="IS-weight floor 1 − eps_low (≥ 1 means no floor)"),
        "eps_high": Param(0.28, float, low=0.0, doc="IS-weight cap 1 + eps_high"),
    }

    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        ratio = batch.ratio()
        weight = clip_ratio(ratio, self.eps_low, self.eps_high)
        loss = -weight * batch.advantages * batch.logp
        clipped = stats.indicator(torch.ne, weight, ratio)  # 0 on padding: r = 1 there, inside every clip
        return loss, batch.mask, {"clip_frac": batch.total(clipped) / batch.total(batch.mask).clamp_min(1.0)}


TOPR_LEVELS = ("sequence", "token")


@register("topr")
class TOPR(Objective):
    """ℓ = −c·A·log π_θ with c = 1 if A ≥ 0 and c = sg(clip(π_θ(τ)/μ(τ), 0, 1)) if A < 0
    (Tapered Off-Policy REINFORCE, Le Roux et al. 2025, arXiv:2503.14286, eq. for ∇J_TOPR).

    Positive samples get the plain SFT-like REINFORCE gradient (no IS); negative ones a truncated IS weight ≤ 1.
    The paper's ratio is the *trajectory* ratio π_θ(τ)/μ(τ) = Π_t r_t (``ratio_level="sequence"``, default),
    computed as exp(min(Σ_t log r_t, 0)) so it never overflows; ``ratio_level="token"`` uses each token's own
    r_t instead (the per-token variant many LLM codebases use).  With ``agg="seq-mean-token-sum"`` and a sequence
    advantage the sequence level is the paper's estimator exactly.  Reports ``clip_frac``: share of valid tokens
    in A < 0 samples whose weight was truncated (ratio > 1).
    """


    advantage = "mean"  # the paper: reward minus a baseline, no std normalisation

    params = {
        "ratio_level": Param("sequence", str, choices=TOPR_LEVELS, doc="trajectory ratio (paper) or per-token"),
    }

    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        log_ratio = batch.delta()
        if self.ratio_level == "sequence":
            log_ratio = log_ratio.sum(dim=-1, keepdim=True).expand_as(log_ratio)
        negative = batch.advantages < 0
        weight = torch.where(negative, torch.exp(log_ratio.clamp(max=0.0)), torch.ones_like(log_ratio))
        loss = -weight * batch.advantages * batch.logp
        truncated = negative & (log_ratio > 0)
        return loss, batch.mask, {"clip_frac": stats.fraction(truncated, batch.mask)}
