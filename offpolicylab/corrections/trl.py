"""TRL's vLLM importance-sampling correction and its off-policy sequence mask (``GRPOConfig``).

Source: ``trl/trainer/grpo_trainer.py`` (``GRPOTrainer._generate_and_score_completions``, the block after "Compute
the importance sampling ratio when using vLLM"; ``GRPOTrainer.get_off_policy_mask``), options in
``trl/trainer/grpo_config.py``; checked against the installed TRL in ``tests/corrections/test_trl_conformance.py``.

TRL is the one engine whose *default run* corrects: ``vllm_importance_sampling_correction=True`` with
``sequence_mask`` at ``vllm_importance_sampling_clip_max=3.0`` whenever it generates with vLLM (without vLLM there
are no sampler log-probs and nothing to correct); the parameter defaults here are those, its default run and its
*recommended* setting at once.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from offpolicylab.corrections.base import Engine, Result, finish, per_sequence, zero_padding
from offpolicylab.registry import Param

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")

PARAMS: dict[str, Param] = {
    "vllm_importance_sampling_correction": Param(True, bool, doc="apply the IS correction at all"),
    "vllm_importance_sampling_mode": Param("sequence_mask", str, choices=MODES,
                                           doc="granularity (token / sequence) × constraint (truncate / mask)"),
    "vllm_importance_sampling_clip_max": Param(3.0, float, optional=True, doc="C_max"),
    "vllm_importance_sampling_clip_min": Param(None, float, optional=True, doc="C_min (none: no lower bound)"),
    "vllm_importance_sampling_cap": Param(None, float, optional=True,
                                          doc="deprecated spelling of vllm_importance_sampling_clip_max"),
    "off_policy_mask_threshold": Param(None, float, optional=True,
                                       doc="δ of DeepSeek-V3.2's off-policy sequence mask (none: off)"),
}


def _check(values: dict[str, Any]) -> None:
    if values["vllm_importance_sampling_cap"] is not None:  # GRPOConfig.__post_init__: the cap overrides clip_max
        values["vllm_importance_sampling_clip_max"] = values["vllm_importance_sampling_cap"]
    low, high = values["vllm_importance_sampling_clip_min"], values["vllm_importance_sampling_clip_max"]
    if low is not None and high is not None and low >= high:
        raise ValueError(f"vllm_importance_sampling_clip_min ({low}) must be less than "
                         f"vllm_importance_sampling_clip_max ({high})")
    if values["vllm_importance_sampling_mode"].endswith("truncate") and low is None and high is None:
        raise ValueError("a *_truncate vllm_importance_sampling_mode needs vllm_importance_sampling_clip_min or "
                         "vllm_importance_sampling_clip_max")


def correct(logp: Tensor, sampler_logp: Tensor, mask: Tensor, *, advantages: Tensor | None = None,
            current_logp: Tensor | None = None, vllm_importance_sampling_correction: bool = True,
            vllm_importance_sampling_mode: str = "sequence_mask", vllm_importance_sampling_clip_max: float | None = 3.0,
            vllm_importance_sampling_clip_min: float | None = None, vllm_importance_sampling_cap: float | None = None,
            off_policy_mask_threshold: float | None = None) -> Result:
    """ρ_t = exp(nan→0((log π_train − log π_vllm)·m_t)), or ρ = exp(Σ_t that) for the ``sequence_*`` modes
    (a product of token ratios, not a geometric mean); ``*_truncate``: w = clip(ρ, C_min, C_max); ``*_mask``:
    w = ρ·1[C_min ≤ ρ ≤ C_max] (MIS, Liu & Li 2025, "When speed kills stability", with the bounds of TIS, Yao et
    al. 2025, "Your efficient RL framework secretly brings you off-policy RL training").  Off-policy sequence mask
    (DeepSeek-AI 2025, DeepSeek-V3.2, arXiv:2512.02556, Eq. 9): keep a sequence iff A ≥ 0 or
    mean_t nan→0(log π_vllm − log π_θ) ≤ δ, with π_θ the current policy (``current_logp``, default ``logp``).

    A masked ratio is a zero weight: TRL keeps the token in its loss denominator (``keep`` marks it dropped).
    Source: ``trl/trainer/grpo_trainer.py`` (``_generate_and_score_completions``, ``get_off_policy_mask``).
    """
    logp, sampler_logp = zero_padding(logp, mask), zero_padding(sampler_logp, mask)
    m = mask.to(logp.dtype)
    weights, keep = m, mask.bool()
    if vllm_importance_sampling_correction:
        diff = torch.nan_to_num((logp - sampler_logp) * m, nan=0.0)
        if vllm_importance_sampling_mode.startswith("sequence"):
            diff = diff.sum(dim=-1, keepdim=True)
        ratio = torch.exp(diff)
        if vllm_importance_sampling_mode.endswith("truncate"):
            ratio = torch.clamp(ratio, min=vllm_importance_sampling_clip_min, max=vllm_importance_sampling_clip_max)
        else:
            low = -math.inf if vllm_importance_sampling_clip_min is None else vllm_importance_sampling_clip_min
            high = math.inf if vllm_importance_sampling_clip_max is None else vllm_importance_sampling_clip_max
            invalid = (ratio < low) | (ratio > high)
            ratio = ratio.masked_fill(invalid, 0.0)
            keep = keep & ~invalid
        weights = ratio
    if off_policy_mask_threshold is not None:
        current = logp if current_logp is None else zero_padding(current_logp.detach(), mask)
        kl = torch.nan_to_num(sampler_logp - current, nan=0.0)
        average = (kl * m).sum(dim=1, keepdim=True) / m.sum(dim=1, keepdim=True).clamp(min=1.0)
        adv = per_sequence(advantages, logp.shape[0], "trl off_policy_mask_threshold")
        keep = keep & ((adv >= 0) | (average <= off_policy_mask_threshold))
    return finish(weights, keep, logp, mask)


ENGINE = Engine("trl", PARAMS, correct, "trl/trainer/grpo_trainer.py", check=_check)
