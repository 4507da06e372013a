"""REP and RED families of Yao et al. 2025 ("Group-relative REINFORCE is secretly an off-policy algorithm",
arXiv:2509.24203): regularised and data-reshaped REINFORCE.

Source: Yao, Chen et al. 2025, "Group-Relative REINFORCE Is Secretly an Off-Policy Algorithm" (arXiv:2509.24203),
which re-reads OPMD (Kimi k1.5) and AsymRE as regularised REINFORCE and proposes RED-Drop / RED-Weight; reference
code: Trinity-RFT ``RECPolicyLossFn`` / ``RECGroupedAdvantage`` (``examples/rec_gsm8k``).
The advantage is A_i = r_i − r̄ (group mean, no std: the objectives' ``advantage = "mean"``), given by the caller
in ``batch.advantages``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from offpolicylab.diagnostics import stats
from offpolicylab.objectives.base import Objective, Param, register
from offpolicylab.objectives.batch import LossOutput, TokenBatch


def _require_finite(name: str, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"parameter {name}={value!r} is invalid; valid: a finite float")


OPMD_FORMS = ("sequence", "token")


@register("opmd")
class OPMD(Objective):
    """ℓ = −(1/K) Σᵢ Aᵢ·log π_θ(yᵢ) + β/(2K) Σᵢ (log π_θ(yᵢ) − log π_old(yᵢ))²,  Aᵢ = rᵢ − r̄
    (online policy mirror descent, Kimi k1.5, arXiv:2501.12599; as REP in Yao et al. 2025, arXiv:2509.24203, §4.2).

    ``form="sequence"`` (default, the paper's form): the regulariser acts on the *sequence* log-ratio
    Δᵢ = Σₜ (log π_θ(yᵢₜ) − log π_old(yᵢₜ)).  In the token-level contract it is written as β/2·Δᵢ²/|yᵢ| on each of
    yᵢ's |yᵢ| tokens, so that a sequence's tokens sum to β/2·Δᵢ²: with ``agg="seq-mean-token-sum"`` the loss is the
    formula above exactly, and every ``agg`` keeps the paper's weight of the regulariser relative to the
    policy term (each sequence's two terms are scaled alike).  Per-token gradient: −Aᵢ + β·Δᵢ.
    ``form="token"`` (the reference code's choice, Trinity-RFT ``regularizer="k2"``): β/2·Σₜ Δᵢₜ² per token
    Δᵢₜ = log π_θ(yᵢₜ) − log π_old(yᵢₜ); equal to the sequence form only when every response has one token.

    β: default 0.2.  The paper's Figure 10 "regularization coefficient 0.1" is β/2, not β: the figure's runs use
    the reference code's OPMD config (``regularizer_coef: 0.1``), and that code writes the term as coef·Δ² with the
    comment that Kimi's 1/2 is absorbed into the coefficient, i.e. coef = β/2 = 0.1.  Reports ``opmd_reg``, the
    regulariser's per-token value β/2·Δᵢ²/|yᵢ| (sequence) or β/2·Δᵢₜ² (token) averaged over valid tokens.
    """


    advantage = "mean"  # the REC paper: A = r − r̄, no std (Trinity-RFT std_normalize: false)

    params = {
        "beta": Param(0.2, float, low=0.0, doc="weight β of the β/2·(log π − log π_old)² regulariser"),
        "form": Param("sequence", str, choices=OPMD_FORMS,
                      doc="regulariser on sequence log-ratios (the paper) or per token (the reference code)"),
    }

    def check_params(self) -> None:
        _require_finite("beta", self.beta)

    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        log_ratio = batch.log_ratio
        if self.form == "sequence":
            tokens = batch.mask.sum(dim=-1, keepdim=True)
            sequence_delta = log_ratio.sum(dim=-1, keepdim=True)
            regulariser = (0.5 * self.beta * sequence_delta.square() / tokens.clamp_min(1.0)).expand_as(log_ratio)
        else:
            regulariser = 0.5 * self.beta * log_ratio.square()
        loss = -batch.advantages * batch.logp + regulariser
        return loss, batch.mask, {"opmd_reg": stats.masked_mean(regulariser.detach(), batch.mask)}


@register("asymre")
class AsymRE(Objective):
    """ℓ = −(A + β)·log π_θ, i.e. REINFORCE with baseline r̄ − β: A' = r − (r̄ − β) = A + β
    (Asymmetric REINFORCE, Arnal et al. 2025, arXiv:2506.20520; as REP in Yao et al. 2025, arXiv:2509.24203).

    β > 0 lowers the baseline, tilting updates towards positive samples.  Default β = 0.1, the paper's code
    (Trinity-RFT ``regularizer="forward-kl"``, coefficient 0.1, which adds −β·log π).
    """


    advantage = "mean"  # the REC paper: A = r − r̄, no std (Trinity-RFT std_normalize: false)

    params = {"beta": Param(0.1, float, doc="baseline shift: baseline = r̄ − β (any finite value)")}

    def check_params(self) -> None:
        _require_finite("beta", self.beta)

    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        return -(batch.advantages + self.beta) * batch.logp, batch.mask, {}


def red_drop_advantages(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Return (A' [B], keep [B] bool) of RED-Drop.

    In each group g: positives are r_i ≥ r̄_g (ties count as positive, as in Trinity-RFT), negatives the rest.
    If a group has more negatives than positives, only its first n_pos negatives (in batch order) are kept; then
    r̄_g is recomputed on the kept samples and A'_i = r_i − r̄_g(kept) for kept samples, 0 for dropped ones.
    Vectorised over groups (one-hot [B, G] sums and a cumulative count), no Python loop.
    """
    dtype = rewards.dtype if torch.is_floating_point(rewards) else torch.get_default_dtype()
    rewards = rewards.to(dtype)
    _, inverse = torch.unique(group_ids, return_inverse=True)
    one_hot = torch.nn.functional.one_hot(inverse).to(dtype)  # [B, G]
    counts = one_hot.sum(dim=0)
    group_mean = (one_hot.T @ rewards) / counts
    centred = rewards - group_mean[inverse]
    tolerance = 1e-6 * (1.0 + group_mean.abs()[inverse])  # r_i == r̄ up to rounding counts as positive
    positive = centred >= -tolerance
    positives_per_group = one_hot.T @ positive.to(dtype)
    negative_rank = torch.cumsum(one_hot * (~positive).to(dtype)[:, None], dim=0).gather(1, inverse[:, None])[:, 0]
    keep = positive | (negative_rank <= positives_per_group[inverse])
    kept = keep.to(dtype)
    kept_mean = (one_hot.T @ (rewards * kept)) / (one_hot.T @ kept).clamp_min(1.0)
    advantages = torch.where(keep, rewards - kept_mean[inverse], torch.zeros((), dtype=dtype))
    return advantages, keep


@register("red_drop")
class REDDrop(Objective):
    """L = −(1/|S|) Σ_{i∈S} A'ᵢ·log π_θ(yᵢ),  A'ᵢ = rᵢ − r̄_g(kept), S = the kept sequences (RED-Drop, Yao et al.
    2025, arXiv:2509.24203, eq. 10 and App. B.6; Trinity-RFT ``RECGroupedAdvantage(drop="balance")``).

    Within each group (``group_ids``), surplus negatives (rᵢ < r̄_g) are dropped so that negatives never outnumber
    positives, and the baseline is recomputed on what is kept (see :func:`red_drop_advantages`).  Dropped sequences
    leave the batch: ``agg`` averages over the kept sequences' tokens only (|S| in the paper's normaliser), so a
    group of 1 positive and 7 negatives gets the gradient of a 2-sample group, not 2/8 of it.  Needs
    ``batch.rewards`` and ``batch.group_ids``; ``batch.advantages`` is ignored (recomputed from rewards).
    Differences from Trinity-RFT: Trinity drops a *random* subset of the negatives; we drop all but the first n_pos
    in batch order — samples of a group are exchangeable, so the distribution is the same and the objective stays
    deterministic.  A single-sample group gets A' = 0 (Trinity uses r̄ = 0 there).  Reports ``drop_frac`` (share
    of sequences dropped); ``mask_frac`` counts the dropped sequences' tokens, the ratio metrics cover kept ones.
    """

    advantage = "mean"  # the REC paper: A = r − r̄, no std (Trinity-RFT std_normalize: false)

    def __call__(self, batch: TokenBatch, *, metrics: bool = True) -> LossOutput:
        missing = [name for name in ("rewards", "group_ids") if getattr(batch, name) is None]
        if missing:
            raise ValueError(
                f"objective 'red_drop' needs TokenBatch.{' and TokenBatch.'.join(missing)} ([B] tensors); "
                "got None"
            )
        advantages, keep = red_drop_advantages(batch.rewards, batch.group_ids)
        kept = batch.keep_rows(keep, advantages)
        kept_mask = kept.mask
        out = super().__call__(kept, metrics=metrics)
        if not metrics:
            return out
        out.metrics["mask_frac"] = 1.0 - kept_mask.sum() / batch.mask.sum().clamp_min(1.0)
        out.metrics["drop_frac"] = 1.0 - keep.to(batch.logp.dtype).mean()
        return out

    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """−A'·log π on a batch whose ``advantages`` and ``mask`` :meth:`__call__` has already set to RED-Drop's."""
        return -batch.advantages * batch.logp, batch.mask, {}


@register("red_weight")
class REDWeight(Objective):
    """ℓ = −w·A·log π_θ,  w = exp(A/T) (RED-Weight, Yao et al. 2025, arXiv:2509.24203; Trinity-RFT
    ``weight="advantage"``).

    Unnormalised weights, as in the paper's code (Trinity-RFT: "unnormalized version"); T = 1 by default.
    T = inf gives plain REINFORCE.  Reports ``weight_mean`` over valid tokens.
    """


    advantage = "mean"  # the REC paper: A = r − r̄, no std (Trinity-RFT std_normalize: false)

    params = {"temperature": Param(1.0, float, low=0.0, low_open=True, doc="temperature T of w = exp(A/T)")}

    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        weight = torch.exp(batch.advantages / self.temperature)
        loss = -weight * batch.advantages * batch.logp
        return loss, batch.mask, {"weight_mean": stats.masked_mean(weight, batch.mask)}
