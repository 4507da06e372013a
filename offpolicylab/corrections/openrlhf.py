"""OpenRLHF's vLLM importance-sampling correction (``PolicyLoss`` with ``enable_vllm_is_correction``).

Source: ``openrlhf/models/loss.py`` (``PolicyLoss.__init__`` / ``PolicyLoss.forward``, the block after "Your
Efficient RL Framework Secretly Brings You Off-Policy RL Training"), options in ``openrlhf/cli/train_ppo_ray.py``
(``--algo.advantage.is_correction_enable``, ``--algo.advantage.is_correction_threshold 0.5 5.0``,
``--algo.advantage.is_correction_type tis|icepop|seq-mask-tis``; older releases: ``--enable_vllm_is_correction``,
``--vllm_is_truncated_threshold``, ``--vllm_is_correction_type``).  Checked against OpenRLHF 0.11.2's own
``PolicyLoss`` in ``.ci/run``'s engine environment (``tests/integrations/test_openrlhf_engine.py``) and by hand
(``tests/corrections/test_by_hand.py``).

A *default run* of OpenRLHF applies no correction (the CLI flag is off; 0.11.2: ``--algo.advantage.
is_correction_level off``); ``enable_vllm_is_correction`` defaults to True here so that ``{engine: openrlhf}`` is the
setting *recommended* when enabled: token TIS in [0.5, 5.0].  (OpenRLHF 0.11.2 renamed the options to
``is_correction_level`` token / seq, ``is_correction_mode`` mask / clip and ``is_correction_gating``, and its mode
defaults to ``mask``: there, switching the level on alone gives IcePop, ``icepop`` here.  Both spellings are taken;
the gating other than ``ratio`` is not re-implemented.)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from offpolicylab.corrections.base import Engine, Result, finish, zero_padding
from offpolicylab.registry import Param

TYPES = ("tis", "icepop", "seq-mask-tis")

PARAMS: dict[str, Param] = {
    "enable_vllm_is_correction": Param(True, bool, doc="apply the correction (the CLI flag defaults to off)"),
    "vllm_is_truncated_threshold": Param((0.5, 5.0), list, length=2, doc="[low, high]"),
    "vllm_is_correction_type": Param("tis", str, choices=TYPES, doc="tis | icepop | seq-mask-tis"),
    "is_correction_level": Param(None, str, choices=("off", "token", "seq"), optional=True,
                                 doc="OpenRLHF 0.11.2's spelling, with is_correction_mode: token + clip = tis, "
                                     "token + mask = icepop, seq + mask = seq-mask-tis, off = disabled"),
    "is_correction_mode": Param(None, str, choices=("mask", "clip"), optional=True,
                                doc="OpenRLHF 0.11.2's mode (its default: mask); needs is_correction_level"),
}
#: OpenRLHF 0.11.2's (is_correction_level, is_correction_mode) → the type of the earlier releases.
LEVEL_MODE = {("token", "clip"): "tis", ("token", "mask"): "icepop", ("seq", "mask"): "seq-mask-tis"}
ALIASES = {"is_correction_enable": "enable_vllm_is_correction",
           "is_correction_threshold": "vllm_is_truncated_threshold",
           "is_correction_type": "vllm_is_correction_type"}


def _check(values: dict[str, Any]) -> None:
    """OpenRLHF 0.11.2's level and mode (``PolicyLoss.__init__``'s checks) folded into the type of the earlier
    releases; giving both spellings with different types is refused."""
    level, mode = values["is_correction_level"], values["is_correction_mode"]
    if level is None:
        if mode is not None:
            raise ValueError("openrlhf: is_correction_mode needs is_correction_level; valid: is_correction_level off, "
                             "token or seq")
        return
    if level == "off":
        values["enable_vllm_is_correction"] = False
        return
    mode = "mask" if mode is None else mode
    if (level, mode) not in LEVEL_MODE:
        raise ValueError("openrlhf: is_correction_mode=clip requires is_correction_level=token (a per-sequence "
                         "statistic is a rejection filter); valid: token + clip, token + mask, seq + mask")
    if values["vllm_is_correction_type"] not in ("tis", LEVEL_MODE[level, mode]):
        raise ValueError(f"openrlhf: is_correction_level={level} with is_correction_mode={mode} is "
                         f"{LEVEL_MODE[level, mode]}, but vllm_is_correction_type={values['vllm_is_correction_type']}"
                         "; valid: one of the two spellings")
    values["vllm_is_correction_type"] = LEVEL_MODE[level, mode]


def correct(logp: Tensor, sampler_logp: Tensor, mask: Tensor, *, advantages: Tensor | None = None,
            current_logp: Tensor | None = None, enable_vllm_is_correction: bool = True,
            vllm_is_truncated_threshold: tuple[float, float] = (0.5, 5.0),
            vllm_is_correction_type: str = "tis", is_correction_level: str | None = None,
            is_correction_mode: str | None = None) -> Result:
    """With ρ_t = exp(log π_old − log π_vllm): ``tis`` w_t = clip(ρ_t, low, high) (TIS, Yao et al. 2025, "Your
    efficient RL framework secretly brings you off-policy RL training"); ``icepop`` w_t = ρ_t·1[low ≤ ρ_t ≤ high]
    (IcePop, Ling Team 2025, "Every step evolves", arXiv:2510.18855); ``seq-mask-tis``
    w_t = ρ_t·1[low ≤ exp(mean_t log ρ_t) ≤ high] — a geometric-mean sequence mask times the token ratio *unclipped*
    (the code does not clamp, though its comment says "still use TIS").

    Rejection multiplies the loss by 0; the token stays in the loss denominator (``keep`` marks it dropped).
    Applied only with ``policy_loss_type="ppo"``.  OpenRLHF 0.11.2's ``is_correction_level`` / ``is_correction_mode``
    arrive here already folded into ``vllm_is_correction_type`` / ``enable_vllm_is_correction`` (``_check``).
    Source: ``openrlhf/models/loss.py`` (``PolicyLoss.forward``).
    """
    logp, sampler_logp = zero_padding(logp, mask), zero_padding(sampler_logp, mask)
    weights, keep = mask.to(logp.dtype), mask.bool()
    if enable_vllm_is_correction:
        low, high = vllm_is_truncated_threshold
        log_ratio = logp - sampler_logp
        if vllm_is_correction_type == "icepop":
            weights = torch.exp(log_ratio)
            inside = (weights >= low) & (weights <= high)
            weights = weights * inside
            keep = keep & inside
        elif vllm_is_correction_type == "seq-mask-tis":
            m = mask.to(logp.dtype)
            seq_is = torch.exp((log_ratio * m).sum(dim=-1) / m.sum(dim=-1))  # masked_mean: 0/0 on an empty row
            seq_mask = ((seq_is >= low) & (seq_is <= high)).unsqueeze(-1)
            weights = seq_mask * torch.exp(log_ratio)
            keep = keep & seq_mask
        else:
            weights = torch.exp(log_ratio).clamp(min=low, max=high)
    return finish(weights, keep, logp, mask)


ENGINE = Engine("openrlhf", PARAMS, correct, "openrlhf/models/loss.py", aliases=ALIASES, check=_check)
