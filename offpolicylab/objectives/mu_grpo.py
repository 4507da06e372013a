"""Mu-GRPO: relaxed PPO clip plus the negative-advantage veto (Tian, Xie, Wei 2026, "How Off-Policy Can GRPO Be?
Mu-GRPO for Efficient LLM Reinforcement Learning", arXiv:2605.17570).

Notation: r = exp(logp − behavior_logp), A = advantage, κ = ``nav_kappa``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from offpolicylab.diagnostics import stats
from offpolicylab.objectives.base import Objective, Param, register
from offpolicylab.objectives.batch import TokenBatch
from offpolicylab.objectives.policy_gradient import ppo_clip_loss, ratio_or_one

NAV_SCOPES = ("none", "trigger", "nontrigger_suffix", "suffix", "response")


def negative_advantage_veto(log_ratio: Tensor, advantages: Tensor, mask: Tensor, kappa: float, scope: str) -> Tensor:
    """[B, T] bool: tokens removed by the negative-advantage veto (:func:`veto_weights` > 0)."""
    return veto_weights(log_ratio, advantages, mask, kappa, scope) > 0


def veto_weights(log_ratio: Tensor, advantages: Tensor, mask: Tensor, kappa: float, scope: str,
                 zero_padded: bool = False) -> Tensor:
    """[B, T] 0/1 floats (``mask``'s dtype): 1 on tokens removed by the negative-advantage veto.

    Trigger tokens: valid tokens with A < 0 and r > κ (compared as log r > log κ).  Scopes:
    ``none`` → nothing; ``trigger`` → every trigger token; ``nontrigger_suffix`` → H_κ, the tokens after the first
    trigger of a response that are not triggers themselves; ``suffix`` → from the first trigger t₀ of a response to
    its end (every valid t ≥ t₀), i.e. trigger ∪ H_κ from there on; ``response`` → every valid token of a response
    that has a trigger.  Nesting: trigger ⊆ suffix, nontrigger_suffix ⊆ suffix ⊆ response, trigger ∩
    nontrigger_suffix = ∅.  Padding (``mask`` 0; the mask holds 0 and 1) is never vetoed.  Float products instead of
    boolean tensors (slow on CPU).  ``zero_padded``: ``log_ratio`` is 0 on padding, where with κ ≥ 1 no token
    triggers (0 > log κ fails), so the triggers need no product with the mask.
    """
    if scope not in NAV_SCOPES:
        raise ValueError(f"unknown nav_scope {scope!r}; valid: {', '.join(NAV_SCOPES)}")
    valid = mask if torch.is_floating_point(mask) else mask.to(torch.get_default_dtype())  # 0/1
    if scope == "none":
        return torch.zeros_like(valid)
    trigger = (stats.indicator(torch.lt, advantages.detach().to(valid.dtype), 0.0)
               * stats.indicator(torch.gt, log_ratio.detach().to(valid.dtype), math.log(kappa)))
    if not (zero_padded and kappa >= 1.0):
        trigger = valid * trigger
    if scope == "trigger":
        return trigger
    # from the first trigger on: t ≥ t₀ ⟺ T − t ≤ T − t₀ = max_t trigger_t·(T − t) (0, so never, without a trigger);
    # the same tokens as cumsum(trigger) > 0, without the scan (a slow kernel along the contiguous dimension)
    countdown = torch.arange(trigger.shape[-1], 0, -1, dtype=trigger.dtype, device=trigger.device)  # T − t
    first = (trigger * countdown).amax(dim=-1, keepdim=True)
    suffix = valid * stats.indicator(torch.le, countdown.expand_as(trigger), first)
    if scope == "suffix":
        return suffix
    if scope == "nontrigger_suffix":
        return suffix - trigger  # trigger ⊆ suffix
    return valid * trigger.amax(dim=-1, keepdim=True)


@register("mu_grpo")
class MuGRPO(Objective):
    """Mu-GRPO (Tian, Xie, Wei 2026, arXiv:2605.17570): ℓ = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high)) with the relaxed range [0, 5]
    (ε_low = 1, ε_high = 4), and ℓ = 0 on tokens removed by the negative-advantage veto: in a response with A < 0
    the first token whose ratio exceeds κ is the trigger, and ``nav_scope`` decides what is removed —
    ``trigger`` (the trigger tokens: *all* tokens with r > κ in A < 0 responses, our reading, so that no exploding
    token is left in the gradient and the scopes nest), ``nontrigger_suffix`` (the paper's H_κ alone: the tokens
    after the first trigger that are not triggers; the trigger tokens keep their clipped-PPO gradient), ``suffix``
    (the first trigger and everything after it, H_κ plus the triggers; the default), ``response`` (the whole
    response) or ``none``.  The paper (Figure 3) reports that masking the triggers alone still collapses while
    masking H_κ, or more, keeps training stable.

    κ: the paper's value is not public; the default κ = 2 is our choice (the upper token bound of MIS-PO, and well
    inside the relaxed clip range); ``nav_kappa = inf`` disables the veto.  Vetoed tokens count in the ``agg``
    denominator with ℓ = 0 and get exactly zero gradient.

    Metrics: ``clip_frac`` (clip, outside the veto), ``nav_frac`` (vetoed share of valid tokens),
    ``nav_response_frac`` (share of responses with a veto).
    """


    params = {
        "eps_low": Param(1.0, float, low=0.0, doc="lower clip ε_low (ratio ≥ 1 − ε_low); 1 = no lower clip"),
        "eps_high": Param(4.0, float, low=0.0, doc="upper clip ε_high (ratio ≤ 1 + ε_high)"),
        "nav_kappa": Param(2.0, float, low=1.0, doc="veto threshold κ on the ratio (inf = no veto)"),
        "nav_scope": Param("suffix", str, choices=NAV_SCOPES, doc="tokens the veto removes"),
    }
    rowwise = True

    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        vetoed = veto_weights(batch.delta(), batch.advantages, batch.mask, self.nav_kappa, self.nav_scope,
                              zero_padded=True)
        allowed = 1.0 - vetoed
        safe_ratio = ratio_or_one(batch.ratio(), vetoed, allowed)  # e^0 on vetoed tokens: no overflow leaks
        loss, kept = ppo_clip_loss(batch.logp, safe_ratio, batch.advantages, self.eps_low, self.eps_high)
        token_mask = kept * allowed
        tokens = batch.mask.sum(dim=-1)
        count = batch.total(tokens).clamp_min(1.0)
        vetoed_responses = vetoed.amax(dim=-1)  # 0/1 per response; 0 for empty ones (padding is never vetoed)
        metrics = {  # the clipped tokens are allowed − kept·allowed; vetoed and clipped tokens are never padding
            "clip_frac": (batch.total(1.0 - vetoed) - batch.total(token_mask)) / count,  # Σ allowed − Σ kept
            "nav_frac": batch.total(vetoed) / count,
            "nav_response_frac": batch.total(vetoed_responses) / batch.total(tokens > 0).clamp_min(1),
        }
        return allowed * loss, token_mask, metrics
