"""verl's rollout correction (``algorithm.rollout_correction``, verl 0.9.1).

Source: ``verl/trainer/ppo/rollout_corr_helper.py`` (``compute_rollout_correction_and_rejection_mask``,
``compute_rollout_correction_weights``, ``compute_rollout_rejection_mask``, ``_parse_rollout_is_threshold``,
``_parse_rollout_rs_thresholds``), defaults in ``verl/trainer/config/algorithm.py`` (``RolloutCorrectionConfig``),
documentation ``docs/algo/rollout_corr.md``; checked against verl's own functions in
``tests/integrations/test_verl_corrections.py`` (CI's verl environment).

A *default run* of verl applies no correction: its trainer config ships ``algorithm.rollout_correction.rollout_is:
null`` and ``rollout_rs: null``.  The parameter defaults here are ``RolloutCorrectionConfig``'s dataclass defaults —
sequence TIS at 2.0 (the ``decoupled_seq_is`` preset), verl's *recommended* setting when the correction is enabled.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from offpolicylab.corrections.base import Engine, Result, finish, zero_padding
from offpolicylab.formulas import k3
from offpolicylab.registry import Param

#: verl's ``SAFETY_BOUND``: log-ratios are clamped to [−20, 20] before exponentiating.
SAFETY_BOUND = 20.0
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
              "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


class Threshold:
    """Param kind for verl's ``str | float`` thresholds (a number, "2.0", "0.5_2.0", "0.5_2.0,3.0"); the numbers
    it holds are range-checked by :meth:`~offpolicylab.registry.Param.validate` like any other parameter's."""

    description = 'a number, "lower_upper" or comma-separated ones (each in (0, inf])'

    def __new__(cls, value: Any) -> Any:  # noqa: D102 - a coercion, not a class instance
        if not isinstance(value, (int, float, str)) or isinstance(value, bool):
            raise TypeError(value)
        return value

    @staticmethod
    def numbers(value: str | float) -> list[float]:
        """The bounds a threshold spells ("0.5_2.0,3" → [0.5, 2.0, 3.0]); text that is no number is left to
        verl's own parser, whose message names it."""
        if not isinstance(value, str):
            return [float(value)]
        found = []
        for part in value.replace("_", ",").split(","):
            try:
                found.append(float(part))
            except ValueError:
                continue
        return found


PARAMS: dict[str, Param] = {
    "rollout_is": Param("sequence", str, choices=("token", "sequence"), optional=True,
                        doc="IS level: token (per-token ratio) or sequence (product of the token ratios); none: off"),
    "rollout_is_threshold": Param(2.0, Threshold, low=0.0, low_open=True, optional=True,
                                  doc='a number: TIS truncation at it; "lower_upper": IcePop, weight 0 outside'),
    "rollout_is_batch_normalize": Param(False, bool, doc="divide the weights by their batch mean"),
    "rollout_rs": Param(None, str, optional=True, doc="comma-chained rejection options: " + ", ".join(RS_OPTIONS)),
    "rollout_rs_threshold": Param(None, Threshold, low=0.0, low_open=True, optional=True,
                                  doc='one per option (or one shared); *_k1 take "lower_upper" ratio bounds'),
    "bypass_mode": Param(False, bool, doc="verl's bypass mode (rollout log-probs used as the old log-probs)"),
    "loss_type": Param("ppo_clip", str, choices=("ppo_clip", "reinforce"), doc="policy loss in bypass mode"),
}


def parse_is_threshold(spec: str | float) -> tuple[float, float | None]:
    """(upper, lower or None) from ``rollout_is_threshold``, as verl's ``_parse_rollout_is_threshold``."""
    if isinstance(spec, (int, float)):
        upper, lower = float(spec), None
    else:
        text = spec.strip()
        if not text:
            raise ValueError("rollout_is_threshold must not be an empty string.")
        try:
            if "_" in text:
                low_text, high_text = text.split("_", 1)
                lower, upper = float(low_text), float(high_text)
            else:
                upper, lower = float(text), None
        except ValueError:
            raise ValueError(f"Invalid rollout_is_threshold '{spec}'.") from None
    if upper <= 0:
        raise ValueError(f"rollout_is_threshold upper bound must be positive, got {upper}.")
    if lower is not None and (lower <= 0 or lower > upper):
        raise ValueError(f"rollout_is_threshold lower bound must be positive and <= upper, got {spec}.")
    return upper, lower


def parse_rs(options: str, spec: str | float | None) -> list[tuple[str, float | None, float]]:
    """[(option, lower or None, upper)] from ``rollout_rs`` and ``rollout_rs_threshold``, as verl's
    ``compute_rollout_rejection_mask`` / ``_parse_rollout_rs_thresholds``: duplicates dropped, one threshold
    broadcast to every option; a ``*_k1`` option given one number u takes [1/u, u]."""
    names: list[str] = []
    for name in (part.strip() for part in options.split(",")):
        if name and name not in names:
            if name not in RS_OPTIONS:
                raise ValueError(f"Invalid rollout_rs option: {name}. Must be one of {sorted(RS_OPTIONS)}.")
            names.append(name)
    if not names:
        raise ValueError("rollout_rs must contain at least one valid option.")
    if spec is None:
        raise ValueError("rollout_rs_threshold must be provided for rejection sampling.")
    raw = [str(spec)] if isinstance(spec, (int, float)) else [p.strip() for p in spec.split(",") if p.strip()]
    if len(raw) not in (1, len(names)):
        raise ValueError(f"rollout_rs_threshold expects either one threshold shared by all options or exactly "
                         f"{len(names)} thresholds to match the provided rollout_rs options.")
    raw = raw * len(names) if len(raw) == 1 else raw
    parsed: list[tuple[str, float | None, float]] = []
    for name, text in zip(names, raw, strict=True):
        try:
            if name.endswith("k1"):
                low_text, high_text = text.split("_", 1) if "_" in text else (str(1.0 / float(text)), text)
                lower, upper = float(low_text), float(high_text)
                if lower <= 0 or upper <= 0 or lower > upper:
                    raise ValueError(f"Thresholds for option '{name}' must be positive with lower <= upper, "
                                     f"got {text}.")
                parsed.append((name, lower, upper))
            else:
                if "_" in text:
                    raise ValueError(f"rollout_rs_threshold for option '{name}' must provide a single upper "
                                     f"bound without '_'. Received '{text}'.")
                upper = float(text)
                if upper <= 0:
                    raise ValueError(f"Threshold for option '{name}' must be positive, got {text}.")
                parsed.append((name, None, upper))
        except ValueError as error:
            if "option" in str(error):
                raise
            raise ValueError(f"Invalid numeric threshold '{text}' for option '{name}'.") from None
    return parsed


def _check(values: dict[str, Any]) -> None:
    if values["bypass_mode"]:
        raise ValueError("verl bypass_mode=True folds the correction into the policy loss (π_θ/π_rollout); as a "
                         "trainer/sampler weight it is bypass_mode=False with logp = the current log-probs")
    if values["rollout_is"] is not None and values["rollout_is_threshold"] is not None:
        parse_is_threshold(values["rollout_is_threshold"])
    if values["rollout_rs"] is not None:
        parse_rs(values["rollout_rs"], values["rollout_rs_threshold"])


def _masked_sum(values: Tensor, mask: Tensor, dim: int | None = -1) -> Tensor:
    """verl's ``verl_F.masked_sum``: (where(mask, values, 0)·mask).sum(dim)."""
    kept = torch.where(mask.bool(), values, 0.0) * mask
    return kept.sum() if dim is None else kept.sum(dim=dim)


def is_weights(log_ratio: Tensor, mask: Tensor, rollout_is: str, threshold: str | float,
               batch_normalize: bool) -> Tensor:
    """verl's ``compute_rollout_correction_weights``: w_t = exp(clip(log r_t, ±20)) (token) or
    exp(clip(Σ_t log r_t, ±20)) (sequence), ·m_t; then TIS min(w, u) or IcePop w·1[l ≤ w ≤ u]; optionally / mean."""
    upper, lower = parse_is_threshold(threshold)
    if rollout_is == "token":
        raw = torch.exp(torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND))
    else:
        total = _masked_sum(log_ratio, mask).unsqueeze(-1)
        raw = torch.exp(torch.clamp(total, min=-SAFETY_BOUND, max=SAFETY_BOUND)).expand_as(log_ratio)
    raw = raw * mask
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))
    if batch_normalize:
        if rollout_is == "token":
            mean = _masked_sum(weights, mask, None) / (mask.sum() + 1e-8)
        else:
            per_seq = _masked_sum(weights, mask) / (mask.sum(dim=-1) + 1e-8)
            seq_mask = (mask.sum(dim=-1) > 0).to(dtype=weights.dtype)
            mean = (per_seq * seq_mask).sum() / seq_mask.sum().clamp_min(1e-8)
        if mean > 1e-8:
            weights = weights / mean
    return weights


def rejection_keep(log_ratio: Tensor, mask: Tensor, options: str, spec: str | float | None) -> Tensor:
    """verl's ``compute_rollout_rejection_mask``, with log r clipped to ±20: k1 = −log r (its sign: log π_rollout −
    log π_train), k2 = ½(log r)², k3 = exp(log r) − 1 − log r (:func:`~offpolicylab.formulas.k3`); token_* judge each token, seq_sum_* / seq_mean_* /
    seq_max_* the masked sum / mean (Σ/(n + 1e-8)) / max of a sequence; k1 options keep log l ≤ stat ≤ log u, the
    others stat ≤ u; every option must pass."""
    safe = torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND)
    stats = {"k1": -safe, "k2": 0.5 * safe**2, "k3": k3(safe)}
    valid = mask.bool()
    combined = torch.ones_like(mask, dtype=log_ratio.dtype)
    for name, lower, upper in parse_rs(options, spec):
        token_stat = stats[name[-2:]]
        if name.startswith("token"):
            stat = token_stat
        elif name.startswith("seq_sum"):
            stat = _masked_sum(token_stat, mask).unsqueeze(-1)
        elif name.startswith("seq_mean"):
            stat = (_masked_sum(token_stat, mask) / (mask.sum(dim=-1) + 1e-8)).unsqueeze(-1)
        else:
            peak = token_stat.masked_fill(~valid, float("-inf")).max(dim=-1).values
            stat = torch.where(peak == float("-inf"), torch.zeros_like(peak), peak).unsqueeze(-1)
        if lower is not None:
            passed = (stat >= math.log(lower)) & (stat <= math.log(upper))
        else:
            passed = stat <= upper
        combined = combined * passed.expand_as(valid).to(dtype=log_ratio.dtype)
    return mask * combined


def correct(logp: Tensor, sampler_logp: Tensor, mask: Tensor, *, advantages: Tensor | None = None,
            current_logp: Tensor | None = None, rollout_is: str | None = "sequence",
            rollout_is_threshold: str | float | None = 2.0, rollout_is_batch_normalize: bool = False,
            rollout_rs: str | None = None, rollout_rs_threshold: str | float | None = None,
            bypass_mode: bool = False, loss_type: str = "ppo_clip") -> Result:
    """log r_t = log π_old − log π_rollout; IS: token w_t = min(r_t, u) or sequence w = min(Π_t r_t, u) (TIS, Yao et
    al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"), with "l_u" thresholds
    w·1[l ≤ w ≤ u] instead (IcePop, Ling Team 2025, arXiv:2510.18855); RS: reject tokens / sequences whose k1 / k2
    / k3 statistic leaves its bounds (MIS and geometric RS, Liu, Li et al. 2025, "When speed kills stability").

    Rejection edits verl's ``response_mask`` (``compute_rollout_correction_and_add_to_batch`` stores the
    rejected mask as the batch's ``response_mask``), and ``core_algos.agg_loss`` divides by that mask, so a rejected
    token also leaves the loss denominator; the IS weights are not zeroed there (``weights · keep`` is the factor
    applied).  Source: ``verl/trainer/ppo/rollout_corr_helper.py`` (``compute_rollout_correction_and_rejection_mask``).
    """
    logp, sampler_logp = zero_padding(logp, mask), zero_padding(sampler_logp, mask)
    log_ratio = logp - sampler_logp
    m = mask.to(logp.dtype)
    weights, keep = m, mask
    if rollout_is is not None and rollout_is_threshold is not None:
        weights = is_weights(log_ratio, m, rollout_is, rollout_is_threshold, rollout_is_batch_normalize)
    if rollout_rs is not None:
        keep = rejection_keep(log_ratio, m, rollout_rs, rollout_rs_threshold)
    return finish(weights, keep, logp, mask)


ENGINE = Engine("verl", PARAMS, correct, "verl/trainer/ppo/rollout_corr_helper.py", check=_check,
                denominator_after_rejection=True)
