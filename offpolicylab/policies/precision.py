"""Reduced-precision sampling engines: the sampler computes in a lower precision than the trainer.

A rollout engine (vLLM, SGLang) samples with its own copy of the weights in BF16, FP16 or FP8 while the trainer
scores in FP32, so the two disagree about the same tokens' log-probs even at staleness 0 — the
training–inference mismatch of Yao et al. 2025 ("Your Efficient RL Framework Secretly Brings You Off-Policy RL
Training", blog post), which the P3O paper (Fakoor et al. 2026, arXiv:2605.12380) studies with FP8 rollouts.  With
``sampler_precision = p`` a policy's sampler is such an engine:

    ℓ_t = log softmax_p(z_t^p / τ)[y_t],        y_t ~ exp(ℓ_t(·)),        z^p = the network run in precision p

- ``fp32``: the trainer's own arithmetic (no mismatch, today's behaviour bit for bit).
- ``bf16``, ``fp16``: every weight is cast to the dtype (round to nearest even) and the whole network — embeddings,
  matrix products, LayerNorm, attention, the GRU, the head — runs in it with torch's own CPU kernels (they exist for
  both dtypes); the logits come out in the dtype, and ``log_softmax`` runs in it too (torch's kernel rounds the
  normalising sum Σ e^z and the output to the dtype: ℓ is within one unit in its last place plus one unit roundoff,
  2⁻⁸ for bf16 and 2⁻¹¹ for fp16, of the exact log-softmax of the rounded logits).
- ``fp8_e4m3``, ``fp8_e5m2``: **simulated** (torch has no FP8 kernel on the CPU but a plain matrix product: no
  softmax, LayerNorm, addition or GRU).  The network runs in bf16 as above, and every linear map (``nn.Linear``, its
  stacked form, the GRU's gate matrices, a Hugging Face model's linear layers, LoRA and the LM head included) takes
  its weight and its input rounded through FP8 — cast to the dtype and back — with one scale per weight row (output
  channel) and one per input row (token): the W8A8 scheme with per-channel weight and dynamic per-token activation
  scales of FP8 inference engines, s = max|row| / max_fp8, x̂ = s · fp8(x / s).  The product then runs in bf16 with
  float32 accumulation.  The GRU's recurrent state inside torch's fused kernel is not rounded through FP8 (only its
  input sequence and weights).  Logits and softmax stay in bf16: no engine computes a softmax in FP8.

The tabular policy's "network" is its logits table: its rows are stored in p (FP8: one scale per logits vector) and
the logits and softmax run in p's compute dtype.  The draw uses the engine's log-probs: y ~ exp(ℓ)/Σ exp(ℓ) (the
exponential race of ``torch.multinomial`` normalises), and the engine reports ℓ_y as ``sampler_logp``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor, nn

PRECISIONS = ("fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2")
#: the dtype a weight is stored in
STORAGE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
                  "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
#: the dtype the activations, logits and softmax are computed in
COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
                  "fp8_e4m3": torch.bfloat16, "fp8_e5m2": torch.bfloat16}


def check_precision(precision: str) -> str:
    """``precision`` if it is one of :data:`PRECISIONS`, else ``ValueError`` naming them."""
    if precision not in PRECISIONS:
        raise ValueError(f"sampler_precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


def is_fp8(precision: str) -> bool:
    return STORAGE_DTYPES[precision] in (torch.float8_e4m3fn, torch.float8_e5m2)


def fp8_round(x: Tensor, dtype: torch.dtype) -> Tensor:
    """x̂ = s · fp8(x / s) with one scale per row (the last dimension), s = max|x_row| / max_fp8 (1 for an all-zero
    row), computed in float32: x rounded through the FP8 ``dtype`` as a scaled FP8 tensor holds it."""
    values = x.float()
    largest = torch.finfo(dtype).max
    scale = values.abs().amax(-1, keepdim=True) / largest
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (values / scale).clamp(-largest, largest).to(dtype).float() * scale


def stored_weight(weight: Tensor, precision: str, linear: bool = True) -> Tensor:
    """The sampler's copy of ``weight`` in :data:`COMPUTE_DTYPES` of ``precision``: cast to the dtype, or, for FP8
    and a linear map's weight (or a logits table), rounded through FP8 per row first."""
    if linear and is_fp8(precision):
        return fp8_round(weight, STORAGE_DTYPES[precision]).to(COMPUTE_DTYPES[precision])
    return weight.to(COMPUTE_DTYPES[precision])


def engine_log_softmax(logits: Tensor, temperature: float, precision: str) -> Tensor:
    """ℓ = log softmax(z / τ) computed in ``precision``'s compute dtype (the division too), returned as float32."""
    z = logits.to(COMPUTE_DTYPES[precision])
    if temperature != 1.0:
        z = z / temperature
    return torch.log_softmax(z, -1).float()


def is_linear_map(module: nn.Module) -> bool:
    """Whether ``module`` applies a weight matrix to its input (``nn.Linear`` or a layer that says so with
    ``is_linear_map = True``, e.g. the stacked linear layer of batched seeds)."""
    return isinstance(module, nn.Linear) or bool(getattr(module, "is_linear_map", False))


def _linear_weights(module: nn.Module) -> list[str]:
    """The names of ``module``'s own parameters that are weight matrices of a linear map."""
    if is_linear_map(module):
        return ["weight"]
    if isinstance(module, nn.RNNBase):
        return [name for name, _ in module.named_parameters(recurse=False) if name.startswith("weight_")]
    return []


@contextlib.contextmanager
def sampler_weights(root: nn.Module | None, precision: str, tables: Sequence[Tensor] = (),
                    fp32_modules: Sequence[nn.Module] = ()) -> Iterator[None]:
    """Inside this block ``root``'s floating parameters and the ``tables`` (each a logits table, rounded per row
    like a linear map's weight) hold the sampler's copy (:func:`stored_weight`), and for FP8 every linear map's
    input is rounded through FP8 per row (a forward pre-hook); on exit the trainer's tensors and modules are put
    back exactly (the parameters' ``.data`` swapped, no copy of the originals).  The parameters of
    ``fp32_modules`` (e.g. an fp32 LM head) are left in fp32 and their inputs unrounded.  ``fp32`` changes
    nothing."""
    if precision == "fp32":
        yield
        return
    params: dict[int, tuple[Tensor, bool]] = {id(t): (t, True) for t in tables}
    kept = {id(module) for module in fp32_modules}
    linear_modules = []
    for module in (root.modules() if root is not None else ()):
        if id(module) in kept:
            continue
        linear = set(_linear_weights(module))
        if linear:
            linear_modules.append(module)
        for name, param in module.named_parameters(recurse=False):  # a tied weight is one parameter
            if param.is_floating_point():
                params[id(param)] = (param, params.get(id(param), (param, False))[1] or name in linear)
    swapped: list[tuple[Tensor, Tensor]] = []
    hooks = []
    try:
        for param, linear in params.values():
            swapped.append((param, param.data))
            param.data = stored_weight(param.data, precision, linear=linear)
        if is_fp8(precision):
            hooks = [module.register_forward_pre_hook(_fp8_input_hook(STORAGE_DTYPES[precision]))
                     for module in linear_modules]
        yield
    finally:
        for hook in hooks:
            hook.remove()
        for param, data in swapped:
            param.data = data


def _fp8_input_hook(dtype: torch.dtype):  # noqa: ANN202 - a forward pre-hook
    def hook(module: nn.Module, args: tuple) -> tuple:
        x = args[0]
        return (fp8_round(x, dtype).to(x.dtype), *args[1:])

    return hook
