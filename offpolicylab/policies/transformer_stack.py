"""Seeds batched together for the transformer policy: S :class:`TransformerPolicy` members of one shape as one
network whose every weight carries a leading seed dimension ``[S, ...]`` (docs/design.md, "Batched seeds").

A batch holds S equal consecutive row blocks ``[S·B, ...]`` and block s is answered by member s.  Only the layers
with weights change; each computes, for the rows x_s of block s,

    Linear      y_s = x_s W_sᵀ + b_s              one ``F.linear`` per block (S calls)
    LayerNorm   y_s = LN(x_s) ⊙ γ_s + β_s         one fused ``layer_norm`` per block (S calls)
    Embedding   y_r = E_s[i_r]                    one lookup in the S tables laid end to end (id i_r + s·n)

Each block runs the very kernel call its member makes alone (batched kernels such as ``baddbmm`` or a LayerNorm
without affine followed by ``addcmul`` give the same values for some shapes but sum in another order for others), so
every member's numbers are its separate run's bit for bit.  Attention, softmax, GELU and the key/value cache act row
by row and are reused unchanged
(:class:`~offpolicylab.policies.transformer.CausalTransformer`'s own ``forward``): the members' rows simply share one
batch, so scoring, KV-cached sampling and greedy decoding of S seeds are one computation.  No weight is shared, so
the gradient of Σ_s loss_s restricted to slice s is the gradient of loss_s.  After stacking, each member's weights
are views of its slice (no copy): what the optimizer does to the stack is what the member sees when it is checkpointed
or evaluated alone.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from offpolicylab.policies.transformer import TransformerPolicy


def _stack(members: Sequence[nn.Module], name: str) -> nn.Parameter:
    return nn.Parameter(torch.stack([getattr(m, name).detach() for m in members]))


class StackedLinear(nn.Module):
    """S ``nn.Linear`` layers: weight [S, out, in], bias [S, out]; block s of the input's rows uses slice s."""

    is_linear_map = True  # a reduced-precision sampler rounds its weight rows and inputs as an nn.Linear's

    def __init__(self, members: Sequence[nn.Linear]) -> None:
        super().__init__()
        if any(m.bias is None for m in members):
            raise ValueError("stacked linear layers need a bias")
        self.weight, self.bias = _stack(members, "weight"), _stack(members, "bias")

    def forward(self, x: Tensor) -> Tensor:
        """y_s = x_s W_sᵀ + b_s for each block s: one ``F.linear`` per block, the call each member makes alone (one
        ``baddbmm`` over the blocks sums in another order; benchmarks/README.md has its speed)."""
        blocks = x.reshape(self.weight.shape[0], -1, x.shape[-1]).unbind(0)
        y = torch.cat([F.linear(block, weight, bias) for block, weight, bias
                       in zip(blocks, self.weight.unbind(0), self.bias.unbind(0), strict=True)])
        return y.reshape(*x.shape[:-1], y.shape[-1])


class StackedLayerNorm(nn.Module):
    """S ``nn.LayerNorm`` layers over the last dimension: weight and bias [S, d]."""

    def __init__(self, members: Sequence[nn.LayerNorm]) -> None:
        super().__init__()
        first = members[0]
        if any((m.normalized_shape, m.eps, m.elementwise_affine) != (first.normalized_shape, first.eps, True)
               or m.bias is None for m in members):
            raise ValueError("stacked layer norms need one normalized shape, one eps and an affine weight and bias")
        self.normalized_shape, self.eps = first.normalized_shape, first.eps
        self.weight, self.bias = _stack(members, "weight"), _stack(members, "bias")

    def forward(self, x: Tensor) -> Tensor:
        """One fused ``layer_norm`` per block: the affine part's gradient is a sum over rows, and the fused kernel's
        summation order is what each member's separate run uses (one normalisation + ``addcmul`` gives the same
        outputs but sums those gradients in another order)."""
        blocks = x.reshape(self.weight.shape[0], -1, x.shape[-1]).unbind(0)
        return torch.cat([F.layer_norm(block, self.normalized_shape, weight, bias, self.eps) for block, weight, bias
                          in zip(blocks, self.weight.unbind(0), self.bias.unbind(0), strict=True)]).reshape(x.shape)


class StackedEmbedding(nn.Module):
    """S ``nn.Embedding`` tables: weight [S, n, d]; row r of block s reads E_s[ids_r] (= row ids_r + s·n of the
    tables laid end to end)."""

    def __init__(self, members: Sequence[nn.Embedding]) -> None:
        super().__init__()
        if any(m.padding_idx is not None or m.max_norm is not None or m.sparse for m in members):
            raise ValueError("stacked embeddings support plain tables only (no padding_idx, max_norm, sparse)")
        self.weight = _stack(members, "weight")

    def forward(self, ids: Tensor) -> Tensor:
        size, n = self.weight.shape[:2]
        offset = torch.arange(size, device=ids.device).repeat_interleave(ids.shape[0] // size) * n
        return F.embedding(ids + offset.view(-1, *([1] * (ids.dim() - 1))), self.weight.reshape(size * n, -1))


STACKED_LAYERS: dict[type[nn.Module], Callable[[Any], nn.Module]] = {
    nn.Linear: StackedLinear, nn.LayerNorm: StackedLayerNorm, nn.Embedding: StackedEmbedding}


def stack_modules(members: Sequence[nn.Module]) -> nn.Module:
    """One module computing ``members[s]`` on row block s: a copy of ``members[0]`` whose weighted layers are
    replaced by their stacked versions (:data:`STACKED_LAYERS`); ``ValueError`` for any other layer with weights.
    Each member's parameters become views of its slice of the stack; parameter names and order are the members'."""
    stacked = copy.deepcopy(members[0])
    for name, module in list(stacked.named_modules()):
        kind = STACKED_LAYERS.get(type(module))
        if kind is None:
            if next(module.parameters(recurse=False), None) is not None:
                raise ValueError(f"layer {name!r} ({type(module).__name__}) cannot be stacked; valid: "
                                 f"{', '.join(t.__name__ for t in STACKED_LAYERS)}")
            continue
        parent, _, attr = name.rpartition(".")
        setattr(stacked.get_submodule(parent), attr, kind([m.get_submodule(name) for m in members]))
    names = [name for name, _ in members[0].named_parameters()]
    if [name for name, _ in stacked.named_parameters()] != names:
        raise ValueError("stacking changed the parameter names or order")
    for index, member in enumerate(members):
        for name, param in stacked.named_parameters():
            owner, _, attr = name.rpartition(".")
            setattr(member.get_submodule(owner), attr, nn.Parameter(param.detach()[index]))
    return stacked


class StackedTransformerPolicy(TransformerPolicy):
    """S transformer policies of one architecture as one (batched seeds): block s of a batch is answered by member
    s, in scoring, KV-cached sampling and greedy decoding alike (module docstring)."""

    def __init__(self, members: Sequence[TransformerPolicy]) -> None:
        first = members[0]
        if any(m.model.compiled for m in members):
            raise ValueError("batched transformer seeds need compiled=false: compiled kernels would round the stack "
                             "differently from each seed alone; valid: run the seeds separately (--seed S), or "
                             "compiled=false")

        if any(m.trainer_precision != "fp32" or m.lm_head_fp32 or m.logp_micro_batch for m in members):
            raise ValueError("batched transformer seeds need trainer_precision=fp32, lm_head_fp32=false and "
                             "logp_micro_batch=0 (one loss scale and one autocast for every seed is not each seed's "
                             "own run, nor are micro-batches across seeds); valid: run the seeds separately (--seed S)")

        def key(m: TransformerPolicy) -> tuple[Any, ...]:
            return (m.shape, m.eos_id, m.sampler_noise_std, m.sampler_precision, m.pad_token, m.max_prompt_len,
                    m.token_draw)

        if any(key(m) != key(first) for m in members):
            raise ValueError("stacked transformer policies must share shape, eos_id, sampler noise, sampler precision, "
                             "prompt length and token draw")
        self._init_common(first.vocab_size, first.response_len, first.eos_id, first.sampler_noise_std,
                          first.sampler_precision, first.token_draw)
        self.set_trainer_precision("fp32")
        self.pad_token, self.max_prompt_len, self.shape = first.pad_token, first.max_prompt_len, first.shape
        self.size = len(members)
        self.model = stack_modules([member.model for member in members])

    def state_dict(self) -> dict[str, Any]:
        raise TypeError("a stacked policy has no state of its own: checkpoint its members")
