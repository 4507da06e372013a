"""REC: group-relative REINFORCE with clipping as regularization (Yao et al. 2025, "Group-relative REINFORCE is
secretly an off-policy algorithm", arXiv:2509.24203).

Source: Yao, Chen et al. 2025, "Group-Relative REINFORCE Is Secretly an Off-Policy Algorithm: Demystifying Some
Myths About GRPO and Its Friends" (arXiv:2509.24203); reference code: Trinity-RFT ``RECPolicyLossFn``
(``examples/rec_gsm8k``).  Notation: r = exp(logp − behavior_logp), A = advantage (r_i − r̄ in the paper, no std).
"""

from __future__ import annotations

import torch
from torch import Tensor

from offpolicylab.diagnostics import stats
from offpolicylab.formulas import clip_bounds
from offpolicylab.objectives.base import Objective, Param, register
from offpolicylab.objectives.batch import TokenBatch

REC_MASKS = ("one_side", "two_side", "ring")


def rec_keep_mask(
    ratio: Tensor,
    advantages: Tensor,
    mask: str,
    eps_low: float,
    eps_high: float,
    ring_low: float,
    ring_high: float,
) -> Tensor:
    """REC's token mask k (boolean), computed on a detached ratio:

    - ``one_side``: k = 1(A ≥ 0, r ≤ 1+ε_h) + 1(A ≤ 0, r ≥ 1−ε_l)
    - ``two_side``: k = 1(1−ε_l ≤ r ≤ 1+ε_h)
    - ``ring``:     k = two_side + 1(A ≥ 0, r ≤ 1−ε'_l) + 1(A ≤ 0, r ≥ 1+ε'_h)

    A = 0 counts on both sides, as in Trinity-RFT (so one-side never masks an A = 0 token; its loss is 0 anyway).
    """
    positive = advantages >= 0
    negative = advantages <= 0
    low, high = clip_bounds(eps_low, eps_high)
    below_high = ratio <= high
    above_low = ratio >= low
    if mask == "one_side":
        return (positive & below_high) | (negative & above_low)
    inside = above_low & below_high
    if mask == "two_side":
        return inside
    if mask == "ring":
        return inside | (positive & (ratio <= 1.0 - ring_low)) | (negative & (ratio >= 1.0 + ring_high))
    raise ValueError(f"unknown REC mask {mask!r}; valid: {', '.join(REC_MASKS)}")


def check_rec_bounds(eps_low: float, eps_high: float, ring_low: float, ring_high: float) -> None:
    """The ring's outer band must lie outside the inner interval: ε'_l ≥ ε_l and ε'_h ≥ ε_h."""
    if ring_low < eps_low:
        raise ValueError(
            f"parameter ring_low={ring_low!r} must be ≥ eps_low={eps_low!r} (ring lower edge 1−ring_low must not "
            "exceed the inner lower edge 1−eps_low)"
        )
    if ring_high < eps_high:
        raise ValueError(
            f"parameter ring_high={ring_high!r} must be ≥ eps_high={eps_high!r} (ring upper edge 1+ring_high must "
            "not be below the inner upper edge 1+eps_high)"
        )


@register("rec")
class REC(Objective):
    """REC-{OneSide, TwoSide, Ring}-{IS, NoIS} (Yao et al. 2025, arXiv:2509.24203):

    - IS:   ℓ = −k·A·r         (gradient −k·A·r·∇logπ)
    - NoIS: ℓ = −k·A·log π_θ   (gradient −k·A·∇logπ; the ratio only decides the mask)

    with k the mask of :func:`rec_keep_mask` (one-side: 1(A ≥ 0, r ≤ 1+ε_h) + 1(A ≤ 0, r ≥ 1−ε_l); two-side:
    1(1−ε_l ≤ r ≤ 1+ε_h); ring: two-side + 1(A ≥ 0, r ≤ 1−ε'_l) + 1(A ≤ 0, r ≥ 1+ε'_h)).  REC-OneSide-IS has
    exactly GRPO's gradient.  Defaults ε_l = ε_h = 0.2, (ε'_l, ε'_h) = (0.6, 2.0) are the paper's / Trinity-RFT's
    ``examples/rec_gsm8k`` values; the default variant is OneSide-NoIS, the paper's headline finding that IS is
    not needed.

    Difference from Trinity-RFT: Trinity writes the IS variant as −k·A·sg(r)·log π_θ; we use the surrogate −k·A·r,
    which has the same gradient and a loss value comparable with GRPO's.
    Reports ``clip_frac``: share of valid tokens the mask removed.
    """


    advantage = "mean"  # the paper: A = r − r̄, no std (Trinity-RFT std_normalize: false)

    params = {
        "mask": Param("one_side", str, choices=REC_MASKS, doc="REC clipping mask"),
        "importance_sampling": Param(False, bool, doc="keep the ratio weight (IS) or drop it (NoIS)"),
        "eps_low": Param(0.2, float, low=0.0, high=1.0, doc="inner lower edge: ratio ≥ 1 − eps_low"),
        "eps_high": Param(0.2, float, low=0.0, doc="inner upper edge: ratio ≤ 1 + eps_high"),
        "ring_low": Param(0.6, float, low=0.0, high=1.0, doc="ring (A ≥ 0) also keeps ratio ≤ 1 − ring_low"),
        "ring_high": Param(2.0, float, low=0.0, doc="ring (A ≤ 0) also keeps ratio ≥ 1 + ring_high"),
    }
    rowwise = True

    def check_params(self) -> None:
        if self.mask == "ring":
            check_rec_bounds(self.eps_low, self.eps_high, self.ring_low, self.ring_high)

    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        log_ratio = batch.log_ratio
        keep = rec_keep_mask(
            batch.ratio(), batch.advantages, self.mask, self.eps_low, self.eps_high,
            self.ring_low, self.ring_high,
        )
        zero = torch.zeros((), dtype=log_ratio.dtype, device=log_ratio.device)
        # masked tokens get log r = 0 before exp, so an overflowing ratio there cannot leak nan into the gradient
        weight = torch.exp(torch.where(keep, log_ratio, zero)) if self.importance_sampling else batch.logp
        loss = torch.where(keep, -batch.advantages * weight, zero)
        return loss, keep.to(batch.mask.dtype), {"clip_frac": stats.fraction(~keep, batch.mask, batch.runs)}
