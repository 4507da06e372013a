"""AReaL's rejection sampling (``actor.rejection_sampling``, used with ``use_decoupled_loss``).

Source: ``areal/utils/functional/functional.py`` (``apply_rejection_sampling``, ``_check_bounds``),
``areal/utils/data.py`` (``KLEstimator._compute_approx_kl``), options and their checks in ``areal/api/cli_args.py``
(``RejectionSamplingConfig``).  A *default run* of AReaL applies no correction (``actor.rejection_sampling: None``); the
parameter defaults here are ``RejectionSamplingConfig``'s, its *recommended* setting when enabled: token-level mask
of ratios above 5.0.  Checked against AReaL 1.0.4's own code in ``.ci/run``'s engine
environment (``tests/integrations/test_areal_engine.py``) and by hand (``tests/corrections/test_by_hand.py``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from offpolicylab.corrections.base import Engine, Result, finish, zero_padding
from offpolicylab.formulas import k3
from offpolicylab.registry import Param

PARAMS: dict[str, Param] = {
    "level": Param("token", str, choices=("token", "sequence")),
    "action": Param("mask", str, choices=("mask", "clamp")),
    "metric": Param("ratio", str, choices=("ratio", "kl_k1", "kl_k2", "kl_k3")),
    "agg": Param("mean", str, choices=("sum", "mean", "max"), doc="sequence aggregation (log space for ratio)"),
    "upper": Param(5.0, float),
    "lower": Param(None, float, optional=True),
}


def _check(values: dict[str, Any]) -> None:
    """``RejectionSamplingConfig.__post_init__``'s checks (its token-level agg warning is not repeated)."""
    lower, upper, metric = values["lower"], values["upper"], values["metric"]
    if lower is not None and lower > upper:
        raise ValueError(f"lower ({lower}) cannot be greater than upper ({upper})")
    if metric == "ratio" and (upper <= 1.0 or (lower is not None and lower <= 0)):
        raise ValueError(f"for 'ratio' metric upper must be > 1.0 and lower positive, got {lower}, {upper}")
    if metric in ("kl_k2", "kl_k3") and upper <= 0:
        raise ValueError(f"upper must be positive for '{metric}' metric, got {upper}")
    if values["action"] == "clamp":
        if metric != "ratio":
            raise ValueError(f"action='clamp' only supports metric='ratio'. Got metric='{metric}'.")
        if lower is None:
            values["lower"] = 0.0


def _inside(metric: Tensor, lower: float | None, upper: float) -> Tensor:
    return (metric >= lower) & (metric <= upper) if lower is not None else metric <= upper


def correct(logp: Tensor, sampler_logp: Tensor, mask: Tensor, *, advantages: Tensor | None = None,
            current_logp: Tensor | None = None, level: str = "token", action: str = "mask", metric: str = "ratio",
            agg: str = "mean", upper: float = 5.0, lower: float | None = None) -> Result:
    """log r_t = log π_prox − log π_behave (float32, non-finite → 0), r_t = exp(log r_t); metric: ratio r_t, or
    k1 = log r_t, k2 = ½(log r_t)², k3 = exp(−log r_t) − 1 + log r_t (:func:`~offpolicylab.formulas.k3` of −log r_t; AReaL's KLEstimator signs — k1 and k3 are
    not verl's); token level: mask keeps l ≤ metric ≤ u, clamp w_t = clip(r_t, l, u); sequence level aggregates
    the metric with sum / mean / max (for ratio in log space: exp(Σ log r), exp(mean log r)), and for ratio the
    weight itself becomes the geometric mean exp(mean_t log r_t) on every token (GSPO-style, Zheng et al. 2025,
    arXiv:2507.18071); clamp clips the weights of out-of-bounds sequences.  Truncation after TIS (Yao et al. 2025),
    masking after MIS (Liu, Li et al. 2025, "When speed kills stability").

    Masking edits AReaL's ``loss_mask`` and zeroes the weight there, but ``ppo_actor_loss_fn`` counts the mask
    *before* rejection (``loss_mask_count``, "without this, mask mode would inflate per-token gradients by
    N_original / N_kept"): a dropped token stays in the denominator.  Source: ``areal/utils/functional/functional.py``
    (``apply_rejection_sampling``, ``ppo_actor_loss_fn``).
    """
    logp, sampler_logp = zero_padding(logp, mask), zero_padding(sampler_logp, mask)
    valid = mask.bool()
    log_ratio = logp.float() - sampler_logp.float()
    log_ratio = torch.where(torch.isfinite(log_ratio), log_ratio, 0.0)
    raw = logp.float() - sampler_logp.float()
    if metric == "ratio":
        value = torch.exp(log_ratio)
    elif metric == "kl_k1":
        value = raw
    elif metric == "kl_k2":
        value = raw**2 / 2.0
    else:
        value = k3(-raw, cap=None)  # AReaL clamps nothing
    weights = torch.exp(log_ratio)
    keep = valid
    low = lower if lower is not None else 0.0
    if level == "sequence":
        use_log = metric == "ratio"
        source = log_ratio if use_log else value
        masked = torch.where(valid, source, 0.0)
        count = mask.sum(dim=-1, keepdim=True).clamp(min=1)
        if use_log:
            weights = torch.exp(masked.sum(dim=-1, keepdim=True) / count).expand_as(log_ratio)
        if agg == "sum":
            seq = masked.sum(dim=-1, keepdim=True)
        elif agg == "mean":
            seq = masked.sum(dim=-1, keepdim=True) / count
        else:
            peak = source.masked_fill(~valid, float("-inf")).max(dim=-1, keepdim=True)[0]
            seq = torch.where(mask.sum(dim=-1, keepdim=True) == 0, torch.zeros_like(peak), peak)
        seq = torch.exp(seq) if use_log else seq
        inside = _inside(seq, lower, upper).expand_as(valid)
        if action == "mask":
            keep = valid & inside
        else:
            weights = torch.where(~inside, weights.clamp(min=low, max=upper), weights)
    elif action == "mask":
        keep = valid & _inside(value, lower, upper)
    else:
        weights = weights.clamp(min=low, max=upper)
    weights = torch.where(keep, weights, 0.0)
    return finish(weights, keep, logp, mask)


ENGINE = Engine("areal", PARAMS, correct, "areal/utils/functional/functional.py", check=_check)
