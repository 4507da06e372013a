"""slime's TIS (``--use-tis --tis-clip --tis-clip-low``), its IcePop function and OPSM (``--use-opsm --opsm-delta``).

Source: ``slime/backends/megatron_utils/loss.py`` (``vanilla_tis_function``, ``icepop_function``,
``policy_loss_function``), ``slime/utils/ppo_utils.py`` (``compute_opsm_mask``), options in
``slime/utils/arguments.py``.  A *default run* of slime applies no correction (``--use-tis`` off, as ``use_tis``
here); its *recommended* setting when enabled is token TIS with ``--tis-clip 2.0``.  slime does not install without its GPU stack (``loss.py`` imports ``megatron.core``): the
values in ``tests/corrections/test_by_hand.py`` are worked out by hand from this source (``loss.py`` at THUDM/slime
commit 2fc48831501c09bde6f6ba1b24576504746e7108).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from offpolicylab.corrections.base import Engine, Result, finish, per_sequence, zero_padding
from offpolicylab.registry import Param

PARAMS: dict[str, Param] = {
    "use_tis": Param(False, bool, doc="apply TIS (or the custom TIS function)"),
    "tis_clip": Param(2.0, float, doc="upper clip C"),
    "tis_clip_low": Param(0.0, float, doc="lower clip"),
    "custom_tis_function_path": Param(None, str, optional=True,
                                      doc="only slime's own ...loss.icepop_function is understood here"),
    "use_opsm": Param(False, bool, doc="off-policy sequence masking"),
    "opsm_delta": Param(1e-4, float, doc="δ of OPSM"),
    "use_rollout_logprobs": Param(False, bool, doc="old log-probs = the rollout's (OPSM then compares with them)"),
}


def _check(values: dict[str, Any]) -> None:
    path = values["custom_tis_function_path"]
    if path is not None and not path.replace(":", ".").endswith(".icepop_function"):
        raise ValueError(f"slime custom_tis_function_path={path!r}: only slime's icepop_function "
                         "(slime.backends.megatron_utils.loss.icepop_function) is known here")
    if values["use_rollout_logprobs"] and values["use_tis"]:
        raise ValueError("use_rollout_logprobs and use_tis cannot be set at the same time.")


def correct(logp: Tensor, sampler_logp: Tensor, mask: Tensor, *, advantages: Tensor | None = None,
            current_logp: Tensor | None = None, use_tis: bool = False, tis_clip: float = 2.0,
            tis_clip_low: float = 0.0, custom_tis_function_path: str | None = None, use_opsm: bool = False,
            opsm_delta: float = 1e-4, use_rollout_logprobs: bool = False) -> Result:
    """ρ_t = exp(log π_old − log π_rollout); TIS: w_t = clip(ρ_t, tis_clip_low, tis_clip) (Yao et al. 2025, "Your
    efficient RL framework secretly brings you off-policy RL training"); ``icepop_function``:
    w_t = ρ_t·1[tis_clip_low ≤ ρ_t ≤ tis_clip] (IcePop, Ling Team 2025, arXiv:2510.18855).  OPSM (DeepSeek-AI 2025,
    arXiv:2512.02556): drop the tokens with A_t < 0 of a sequence whose Σ_t m_t(log π_old − log π_θ) / max(Σ_t m_t,
    1) > δ; π_old is the trainer's old policy (``logp``), or the rollout's with ``use_rollout_logprobs``; π_θ is
    ``current_logp`` (default ``logp``).

    Both TIS variants only scale the loss (slime keeps its loss masks), so an IcePop-zeroed token stays in the
    denominator (``keep`` marks it dropped).  Source: ``slime/backends/megatron_utils/loss.py``.
    """
    logp, sampler_logp = zero_padding(logp, mask), zero_padding(sampler_logp, mask)
    weights, keep = mask.to(logp.dtype), mask.bool()
    if use_opsm:
        m = mask.to(logp.dtype)
        old = sampler_logp if use_rollout_logprobs else logp
        current = logp if current_logp is None else zero_padding(current_logp.detach(), mask)
        seq_kl = ((old - current) * m).sum(dim=-1, keepdim=True) / torch.clamp_min(m.sum(dim=-1, keepdim=True), 1)
        adv = per_sequence(advantages, logp.shape[0], "slime use_opsm")
        keep = keep & ~((adv < 0) & (seq_kl > opsm_delta))
    if use_tis:
        ratio = torch.exp(logp - sampler_logp)
        if custom_tis_function_path is None:
            weights = torch.clamp(ratio, min=tis_clip_low, max=tis_clip)
        else:
            inside = (ratio >= tis_clip_low) & (ratio <= tis_clip)
            weights = torch.where(inside, ratio, torch.zeros_like(ratio))
            keep = keep & inside
    return finish(weights, keep, logp, mask)


ENGINE = Engine("slime", PARAMS, correct, "slime/backends/megatron_utils/loss.py", check=_check)
