"""The trainer's precision as FSDP mixed precision / ``torch.autocast`` runs it: fp32 master weights and optimizer
state, every trainer forward in a 16-bit dtype, log-probabilities in fp32 from the 16-bit logits.

    z = f_θ(x) under autocast(dtype)            matrix products in dtype (weights cast per forward), logits in dtype
    ℓ = log_softmax(float32(z / τ))[y]          the division in dtype, the normalisation in fp32

as verl's actor computes them (``dp_actor._forward_micro_batch`` runs every actor forward — the old-log-prob
recompute and the training forward — under ``torch.autocast(dtype=torch.bfloat16)``; its ``logprobs_from_logits``
normalises in fp32).  The backward of the autocast casts returns fp32 gradients to the fp32 master weights, and Adam
keeps fp32 state, so only the forward rounds.  ``torch.autocast`` rather than casting the weights per forward: it is
what the M2PO paper's public code and verl run, it keeps the residual stream and LayerNorm of an fp32 input in fp32
(CPU autocast runs ``linear``, ``matmul`` and ``bmm`` in the dtype and passes other ops through in their inputs'
dtype), and it needs no second copy of the weights.

- ``fp32``: no autocast (today's arithmetic bit for bit).
- ``bf16``: bfloat16 autocast (8 significant bits, unit roundoff u = 2⁻⁸).
- ``fp16``: float16 autocast (11 bits, u = 2⁻¹¹) with a dynamic loss scale (:func:`loss_scaler`:
  ``torch.amp.GradScaler`` — the loss is multiplied by S before the backward, the gradients divided by S; a step
  whose gradients hold an inf or NaN is skipped and S halved; after 2000 finite steps S doubles), as fp16 training
  runs (Micikevicius et al. 2018, "Mixed Precision Training", arXiv:1710.03740).

``trainer_weights`` says which weights the 16-bit forward reads:

- ``master``: the fp32 master weights, autocast rounding only the matrix products' inputs and outputs (the
  embeddings, the residual stream and every LayerNorm stay fp32) — ``torch.autocast`` alone;
- ``cast``: 16-bit copies of every weight, made from the masters for each forward (:func:`cast_parameters`), so the
  embeddings, the residual stream, every LayerNorm, the attention softmax and the logits are 16-bit too — the actor
  as FSDP's ``MixedPrecision(param_dtype=torch.bfloat16)`` runs it (verl's default; Zhao et al. 2023, "PyTorch
  FSDP", arXiv:2304.11277).  The casts are differentiable: the gradient reaches the fp32 masters.

``lm_head_fp32 = True`` computes the LM head (the last linear map) in fp32 from the hidden state, so the logits are
fp32 while the body rounds: MiniMax-M1's fix of the training–inference mismatch (MiniMax 2025, arXiv:2506.13585,
§3.2).  The fix is in both engines: the sampler (a 16-bit ``sampler_precision``) also keeps the head's fp32 weights,
applies them to fp32(h) and normalises its fp32 logits in fp32.

``recompute_split_k = k > 1`` runs the old-log-prob recompute's linear maps as split-K GEMMs
(:func:`split_k_linear`, :func:`split_k_gemms`): the same exact products as torch's kernel, their fp32 sum taken in
another order — the lag-0 difference a GPU shows when its GEMM library picks a split-K kernel for the recompute's
smaller micro-batches and another for the training forward (He and Thinking Machines Lab 2025, "Defeating
Nondeterminism in LLM Inference", blog post: batch variance comes from kernels changing their reduction strategy
with the batch size).  Nothing random is added.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

TRAINER_PRECISIONS = ("fp32", "bf16", "fp16")
TRAINER_WEIGHTS = ("master", "cast")
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: unit roundoff u = 2^-p of each dtype (p significant bits, the implicit one included: bf16 8, fp16 11, fp32 24)
UNIT_ROUNDOFF = {"fp32": 2.0 ** -24, "bf16": 2.0 ** -8, "fp16": 2.0 ** -11}


def check_trainer_precision(precision: str) -> str:
    """``precision`` if it is one of :data:`TRAINER_PRECISIONS`, else ``ValueError`` naming them."""
    if precision not in TRAINER_PRECISIONS:
        raise ValueError(f"trainer_precision={precision!r} is invalid; valid: {', '.join(TRAINER_PRECISIONS)}")
    return precision


def check_trainer_weights(weights: str, precision: str) -> str:
    """``weights`` if it is one of :data:`TRAINER_WEIGHTS` and, for ``cast``, ``precision`` is 16-bit; else
    ``ValueError`` saying what is valid."""
    if weights not in TRAINER_WEIGHTS:
        raise ValueError(f"trainer_weights={weights!r} is invalid; valid: {', '.join(TRAINER_WEIGHTS)}")
    if weights == "cast" and precision == "fp32":
        raise ValueError("trainer_weights=cast needs a 16-bit trainer_precision (bf16 or fp16), got fp32; valid: "
                         "trainer_weights=master with fp32")
    return weights


def cast_parameters(module: nn.Module, precision: str) -> dict[str, Tensor]:
    """{name: dtype(θ)} for every floating parameter θ of ``module`` (``precision``'s 16-bit dtype): the copies a
    ``trainer_weights=cast`` forward reads through ``torch.func.functional_call``.  ``Tensor.to`` is differentiable,
    so ∂ℓ/∂θ = fp32(∂ℓ/∂dtype(θ)) reaches the fp32 master."""
    dtype = AUTOCAST_DTYPES[precision]
    return {name: param.to(dtype) if param.is_floating_point() else param
            for name, param in module.named_parameters()}


def trainer_autocast(precision: str, device: torch.device | str = "cpu") -> contextlib.AbstractContextManager:
    """``torch.autocast(device, dtype)`` for a 16-bit ``precision``; nothing for ``fp32``."""
    if precision == "fp32":
        return contextlib.nullcontext()
    device_type = torch.device(device).type
    return torch.autocast(device_type=device_type, dtype=AUTOCAST_DTYPES[precision])


def head_logits(head: nn.Module, hidden: Tensor, fp32_head: bool) -> Tensor:
    """z = W h + b: in the surrounding autocast's dtype, or, with ``fp32_head``, in fp32 from fp32(h) with autocast
    off (the fp32 LM head)."""
    if not fp32_head:
        return head(hidden)
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        return head(hidden.float())


def loss_scaler(precision: str) -> torch.amp.GradScaler | None:
    """A dynamic loss scaler (``torch.amp.GradScaler`` on the CPU: initial scale 2¹⁶, ×0.5 on an inf / NaN gradient
    with the step skipped, ×2 after 2000 finite steps) for ``fp16``; None otherwise (bf16 has fp32's exponent range
    and trains unscaled, as FSDP's bf16 mixed precision does)."""
    return torch.amp.GradScaler("cpu") if precision == "fp16" else None


def check_split_k(splits: int, precision: str, micro_batch: int, compiled: bool = False) -> int:
    """``splits`` if it is 1 (off), or > 1 with a 16-bit ``precision``, a recompute (``micro_batch`` > 0) and eager
    blocks (not ``compiled``: inductor fuses the partial sums and adds them in its own order); else ``ValueError``
    saying what is valid."""
    if splits < 1:
        raise ValueError(f"recompute_split_k must be >= 1, got {splits}")
    if splits > 1 and precision == "fp32":
        raise ValueError(f"recompute_split_k={splits} needs a 16-bit trainer_precision (bf16 or fp16), got fp32 (an "
                         "fp32 GEMM's order changes its last bit only); valid: recompute_split_k=1 with fp32")
    if splits > 1 and micro_batch <= 0:
        raise ValueError(f"recompute_split_k={splits} splits the old-log-prob recompute's GEMMs, but "
                         "logp_micro_batch=0 (no recompute); valid: logp_micro_batch > 0, or recompute_split_k=1")
    if splits > 1 and compiled:
        raise ValueError(f"recompute_split_k={splits} cannot run with compiled=true (inductor fuses the split-K "
                         "partial sums and adds them in its own order); valid: compiled=false, or "
                         "recompute_split_k=1")
    return splits


def split_k_linear(x: Tensor, weight: Tensor, bias: Tensor | None, splits: int, dtype: torch.dtype) -> Tensor:
    """y = dtype(Σ_{j=1..k} fp32(x_j) fp32(W_j)ᵀ + fp32(b)): the inner dimension cut into k = ``splits`` consecutive
    slices (``Tensor.tensor_split``), each slice's product in fp32 from the operands rounded to the 16-bit ``dtype``
    (a product of two 16-bit numbers is exact in fp32), the partial sums and then the bias added in fp32 in slice
    order, the result rounded once to ``dtype`` — a split-K GEMM with an fp32 workspace.  torch's own 16-bit
    ``linear`` rounds the same fp32 sum of the same products once too, adding them in its own order."""
    with torch.autocast(x.device.type, enabled=False):
        inputs = x.to(dtype).float().tensor_split(splits, -1)
        weights = weight.to(dtype).float().tensor_split(splits, -1)
        total = inputs[0] @ weights[0].T
        for part_x, part_w in zip(inputs[1:], weights[1:], strict=True):
            total = total + part_x @ part_w.T
        if bias is not None:
            total = total + bias.to(dtype).float()
        return total.to(dtype)


class split_k_gemms(TorchFunctionMode):  # noqa: N801 - used as a context manager, like torch.autocast
    """Inside this block every 16-bit ``torch.nn.functional.linear`` — its input in bf16 / fp16, or an fp32 input
    under a 16-bit CPU autocast — runs as :func:`split_k_linear` with ``splits`` slices; fp32 maps and every other
    operation run as before."""

    def __init__(self, splits: int) -> None:
        super().__init__()
        self.splits = int(splits)

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.linear:
            call = dict(zip(("input", "weight", "bias"), args, strict=False)) | kwargs
            dtype = _gemm_dtype(call["input"])
            if dtype is not None:
                return split_k_linear(call["input"], call["weight"], call.get("bias"), self.splits, dtype)
        return func(*args, **kwargs)


def _gemm_dtype(x: Tensor) -> torch.dtype | None:
    """The 16-bit dtype a linear map of input ``x`` computes in: ``x``'s own, or the CPU autocast's for an fp32
    input; None for an fp32 map."""
    if x.dtype in (torch.bfloat16, torch.float16):
        return x.dtype
    if x.dtype == torch.float32 and x.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        dtype = torch.get_autocast_dtype("cpu")
        return dtype if dtype in (torch.bfloat16, torch.float16) else None
    return None
