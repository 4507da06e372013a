"""SkyRL's off-policy correction (``trainer.algorithm.off_policy_correction``).

Source: ``skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py`` (``compute_off_policy_correction``,
``compute_tis_ratio``, ``compute_sequence_mask``, ``compute_outlier_token_mask``, ``compute_token_mask``),
defaults in ``skyrl/train/config/config.py`` (``OffPolicyCorrectionConfig``), guide
``docs/content/docs/algorithms/off_policy_correction.mdx``.  A *default run* of SkyRL applies no correction (every
``OffPolicyCorrectionConfig`` field that switches one on is None, as here); the guide *recommends* the geometric
sequence mask in [0.99, 1.01] (``sequence_mask_metric: geometric``) when enabling one.  Checked against SkyRL 0.3.0's own code in
``.ci/run``'s engine environment (``tests/integrations/test_skyrl_engine.py``) and by hand
(``tests/corrections/test_by_hand.py``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from offpolicylab.corrections.base import Engine, Result, finish, zero_padding
from offpolicylab.registry import Param

PARAMS: dict[str, Param] = {
    "tis_ratio_type": Param(None, str, choices=("token", "sequence"), optional=True, doc="TIS level; none: off"),
    "token_tis_ratio_clip_high": Param(2.0, float, doc="token TIS cap"),
    "sequence_tis_ratio_clip_high": Param(5.0, float, doc="sequence TIS cap"),
    "sequence_mask_metric": Param(None, str, choices=("geometric", "product"), optional=True,
                                  doc="sequence mask on the geometric mean or the product of the ratios"),
    "geo_mask_high": Param(1.01, float), "geo_mask_low": Param(0.99, float),
    "product_mask_high": Param(2.0, float), "product_mask_low": Param(0.5, float),
    "outlier_token_is_threshold_low": Param(None, float, optional=True,
                                            doc="drop a sequence with any token ratio below it"),
    "outlier_token_is_threshold_high": Param(None, float, optional=True,
                                             doc="drop a sequence with any token ratio above it"),
    "token_mask_is_threshold_low": Param(None, float, optional=True, doc="drop tokens with ratio below it"),
    "token_mask_is_threshold_high": Param(None, float, optional=True, doc="drop tokens with ratio above it"),
}


def _check(values: dict[str, Any]) -> None:
    low, high = values["token_mask_is_threshold_low"], values["token_mask_is_threshold_high"]
    if (low is None) != (high is None):  # SkyRL silently ignores a half-set token mask; say so instead
        raise ValueError("skyrl's token mask needs both token_mask_is_threshold_low and token_mask_is_threshold_high "
                         "(with one alone SkyRL applies no token mask)")


def _safe_exp(delta: Tensor, dtype: torch.dtype) -> Tensor:
    """SkyRL's ``safe_exp_delta``: exp(clip(δ, ±20)) computed in float32, returned in ``dtype``."""
    return torch.clamp(delta.to(torch.float32), -20.0, 20.0).exp().to(dtype)


def correct(logp: Tensor, sampler_logp: Tensor, mask: Tensor, *, advantages: Tensor | None = None,
            current_logp: Tensor | None = None, tis_ratio_type: str | None = None,
            token_tis_ratio_clip_high: float = 2.0, sequence_tis_ratio_clip_high: float = 5.0,
            sequence_mask_metric: str | None = None, geo_mask_high: float = 1.01, geo_mask_low: float = 0.99,
            product_mask_high: float = 2.0, product_mask_low: float = 0.5,
            outlier_token_is_threshold_low: float | None = None, outlier_token_is_threshold_high: float | None = None,
            token_mask_is_threshold_low: float | None = None,
            token_mask_is_threshold_high: float | None = None) -> Result:
    """With log ρ_t = log π_old − log π_rollout and ρ_t = exp(clip(log ρ_t, ±20)) (float32), in SkyRL's order:
    outlier mask (drop a sequence if any token's ρ_t leaves [low, high]); token mask (drop tokens with ρ_t
    outside [low, high], IcePop-style); TIS token w_t = min(ρ_t, C_tok) or sequence w = min(exp(Σ_t m'_t log ρ_t),
    C_seq) over the tokens m' that survived the masks (TIS, Yao et al. 2025, "Your efficient RL framework secretly
    brings you off-policy RL training"); sequence mask on exp(Σ m' log ρ / max(Σ m', 1)) ∈ [geo_low, geo_high]
    (geometric RS, Liu, Li et al. 2025, "When speed kills stability") or exp(Σ m' log ρ) ∈ [prod_low, prod_high].

    Masks edit SkyRL's ``loss_mask``, which zeroes the dropped token's loss in ``ppo_utils.reduce_loss``
    (Σ loss · loss_mask); the denominator is not that mask: the trainer divides the advantages beforehand by the
    mini-batch's original ``loss_mask`` (``ppo_utils.apply_loss_reduction_to_advantages_minibatch``: token_mean
    ÷ Σ loss_mask, sequence_mean ÷ B·Σ_t loss_mask), so a dropped token stays in the denominator.  Source:
    ``skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py`` (``compute_off_policy_correction``).
    """
    logp, sampler_logp = zero_padding(logp, mask), zero_padding(sampler_logp, mask)
    log_ratio = logp - sampler_logp
    loss_mask = mask.to(logp.dtype)
    ratio = _safe_exp(log_ratio, logp.dtype)
    weights: Tensor = loss_mask
    if outlier_token_is_threshold_low is not None or outlier_token_is_threshold_high is not None:
        valid = loss_mask > 0
        bad = torch.zeros_like(valid)
        if outlier_token_is_threshold_high is not None:
            bad = bad | ((ratio > outlier_token_is_threshold_high) & valid)
        if outlier_token_is_threshold_low is not None:
            bad = bad | ((ratio < outlier_token_is_threshold_low) & valid)
        loss_mask = loss_mask * (~bad | ~valid).all(dim=-1, keepdim=True).to(loss_mask.dtype)
    if token_mask_is_threshold_low is not None and token_mask_is_threshold_high is not None:
        inside = (ratio >= token_mask_is_threshold_low) & (ratio <= token_mask_is_threshold_high)
        loss_mask = loss_mask * (inside | (loss_mask == 0)).to(loss_mask.dtype)
    if tis_ratio_type == "token":
        weights = torch.clamp(ratio, max=token_tis_ratio_clip_high)
    elif tis_ratio_type == "sequence":
        total = (log_ratio * loss_mask).sum(dim=-1, keepdim=True)
        weights = torch.clamp(_safe_exp(total, logp.dtype), max=sequence_tis_ratio_clip_high)
    if sequence_mask_metric is not None:
        total = (log_ratio * loss_mask).sum(dim=-1, keepdim=True)
        if sequence_mask_metric == "geometric":
            stat = _safe_exp(total / loss_mask.sum(dim=-1, keepdim=True).clamp(min=1.0), logp.dtype)
            low, high = geo_mask_low, geo_mask_high
        else:
            stat = _safe_exp(total, logp.dtype)
            low, high = product_mask_low, product_mask_high
        loss_mask = loss_mask * (~(stat > high) & ~(stat < low)).to(loss_mask.dtype)
    return finish(weights, loss_mask, logp, mask)


ENGINE = Engine("skyrl", PARAMS, correct, "skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py",
                check=_check)
