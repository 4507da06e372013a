"""Sequence-level ratios: GSPO and REC-GSPO.

Notation: r_it = exp(logp_it − behavior_logp_it); the sequence ratio is the geometric mean
s_i = exp((1/|y_i|) Σ_t log r_it) (GSPO's length-normalised sequence likelihood ratio), and its token-level
gradient form s_it = sg(s_i) · π_θ(y_it) / sg(π_θ(y_it)) has the value s_i and ∂s_it/∂logp_it = s_i.
"""

from __future__ import annotations

import torch
from torch import Tensor

from offpolicylab.diagnostics import stats
from offpolicylab.objectives.base import Objective, Param, register
from offpolicylab.objectives.batch import TokenBatch
from offpolicylab.objectives.policy_gradient import ppo_clip_loss

GSPO_EPS_LOW = 3e-4
GSPO_EPS_HIGH = 4e-4
#: REC-GSPO's clip edges in Yao et al. 2025 (arXiv:2509.24203), App. B.7: twice GSPO's.
REC_GSPO_EPS_LOW = 6e-4
REC_GSPO_EPS_HIGH = 8e-4


def gspo_token_log_ratio(batch: TokenBatch) -> tuple[Tensor, Tensor]:
    """Return (log s_it [B, T], log s_i [B]) with log s_it = sg(log s_i) + logp_it − sg(logp_it).

    The detached term is added last (as verl does) so the value is exactly log s_i.
    """
    log_seq = batch.sequence_log_ratio()
    log_token = (batch.logp - batch.logp.detach()) + log_seq[:, None]
    return log_token, log_seq


@register("gspo")
class GSPO(Objective):
    """ℓ_it = max(−A_it·s_it, −A_it·clip(s_it, 1−ε_low, 1+ε_high)),
    s_it = sg(s_i)·π_θ(y_it)/sg(π_θ(y_it)), s_i = exp(mean_t log r_it)
    (GSPO-token, Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071).

    With a sequence-level advantage A_i and ``agg="seq-mean-token-mean"`` this is GSPO's sequence objective
    (1/G) Σ_i min(s_i·A_i, clip(s_i)·A_i) exactly, gradient included.  Defaults ε_low = 3e-4, ε_high = 4e-4 are
    the paper's.  The paper aggregates seq-mean-token-mean; here ``agg`` defaults to ``token-mean`` like every
    objective — pass ``agg="seq-mean-token-mean"`` for the paper's form.  verl clamps log s_it at
    10 before exp; we do not (finite for |log s| < 88 in float32).  Reports ``clip_frac``.
    """


    params = {
        "eps_low": Param(GSPO_EPS_LOW, float, low=0.0, doc="sequence-ratio clip: s ≥ 1 − eps_low"),
        "eps_high": Param(GSPO_EPS_HIGH, float, low=0.0, doc="sequence-ratio clip: s ≤ 1 + eps_high"),
    }

    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        sequence_ratio = torch.exp(batch.sequence_log_ratio())[:, None]  # s_i, the value of s_it; ∂s_it/∂logp_it = s_i
        loss, kept = ppo_clip_loss(batch.logp, sequence_ratio, batch.advantages, self.eps_low, self.eps_high)
        return loss, kept, {"clip_frac": stats.fraction(1.0 - kept, batch.mask)}


@register("rec_gspo")
class RECGSPO(Objective):
    """REC one-side mask on GSPO's sequence ratio (Yao et al. 2025, arXiv:2509.24203; Trinity-RFT
    ``clip_mode="gspo-one-side"``):

    k_i = 1(A ≥ 0, s_i ≤ 1+ε_h) + 1(A ≤ 0, s_i ≥ 1−ε_l),  s_i = exp(mean_t log r_it)
    - IS:   ℓ_it = −k_i·A_it·s_it   (s_it the GSPO token form: value s_i, gradient s_i·∇logπ_it)
    - NoIS: ℓ_it = −k_i·A_it·log π_θ(y_it)

    Defaults ε_l = 6e-4, ε_h = 8e-4, the REC paper's REC-GSPO settings (App. B.7); GSPO's own 3e-4 / 4e-4 are the
    ``gspo`` defaults.  Differences from
    Trinity-RFT: Trinity writes IS as −k·A·sg(s_i)·logπ (same gradient; we use the surrogate value) and forces
    seq-mean-token-mean aggregation; here ``agg`` is honoured (default ``token-mean``).  Reports ``clip_frac``.
    """

    advantage = "mean"  # the REC paper: A = r − r̄, no std

    params = {
        "importance_sampling": Param(False, bool, doc="weight by the sequence ratio (IS) or not (NoIS)"),
        "eps_low": Param(REC_GSPO_EPS_LOW, float, low=0.0, high=1.0,
                         doc="keep A ≤ 0 sequences with s ≥ 1 − eps_low"),
        "eps_high": Param(REC_GSPO_EPS_HIGH, float, low=0.0, doc="keep A ≥ 0 sequences with s ≤ 1 + eps_high"),
    }

    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        log_token, log_seq = gspo_token_log_ratio(batch)
        seq_ratio = torch.exp(log_seq)[:, None]
        advantages = batch.advantages
        keep = ((advantages >= 0) & (seq_ratio <= 1.0 + self.eps_high)) | (
            (advantages <= 0) & (seq_ratio >= 1.0 - self.eps_low)
        )
        zero = torch.zeros((), dtype=log_token.dtype, device=log_token.device)
        if self.importance_sampling:
            weight = torch.exp(torch.where(keep, log_token, zero))
        else:
            weight = batch.logp
        loss = torch.where(keep, -advantages * weight, zero)
        return loss, keep.to(batch.mask.dtype), {"clip_frac": stats.fraction(~keep, batch.mask)}
