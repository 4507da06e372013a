"""Token-level batch and loss-output contracts (docs/design.md, "The objective contract").

Every objective in :mod:`offpolicylab.objectives` is a function of a :class:`TokenBatch`; a bandit is ``T = 1``,
a toy-MDP response has ``T`` tokens and an LLM completion up to ``T`` tokens.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields

import torch
from torch import Tensor

from offpolicylab.diagnostics import stats

_TOKEN_FIELDS = ("logp", "behavior_logp", "advantages", "mask", "sampler_logp", "prox_logp", "entropy", "ref_logp")
_SEQUENCE_FIELDS = ("rewards", "group_ids", "staleness")
_FINITE_FIELDS = ("behavior_logp", "advantages", "sampler_logp", "prox_logp", "ref_logp")  # must be finite on unmasked tokens


@dataclass
class TokenBatch:
    """Token-level tensors of one update; all ``[B, T]`` unless said.

    ``logp`` carries grad; ``behavior_logp`` is the log-prob recorded at generation (detached here);
    ``advantages`` may be given per sequence (``[B]``) and is broadcast to ``[B, T]``; ``mask`` is 1 for tokens that
    count.  Optional: ``rewards`` / ``group_ids`` / ``staleness`` (``[B]``), ``sampler_logp`` (sampling engine's
    log-prob, for TIS), ``prox_logp`` (decoupled PPO), ``ref_logp`` (the reference policy's log-prob of the same
    tokens, detached: the KL penalty ``kl_coef``) and ``entropy`` (the policy's per-token entropy; it keeps its
    gradient, which the entropy bonus ``entropy_coef`` uses; the metrics read it detached).

    Raises ``ValueError`` naming the field when a shape, dtype or value is wrong.
    """

    logp: Tensor
    behavior_logp: Tensor
    advantages: Tensor
    mask: Tensor
    rewards: Tensor | None = None
    group_ids: Tensor | None = None
    sampler_logp: Tensor | None = None
    prox_logp: Tensor | None = None
    entropy: Tensor | None = None
    staleness: Tensor | None = None
    ref_logp: Tensor | None = None
    _delta: Tensor | None = field(default=None, init=False, repr=False, compare=False)  # cache of delta()
    _ratio: Tensor | None = field(default=None, init=False, repr=False, compare=False)  # cache of ratio()
    _ess: Tensor | None = field(default=None, init=False, repr=False, compare=False)  # cache of ess()
    _summary: dict[str, Tensor] | None = field(default=None, init=False, repr=False, compare=False)  # ratio_summary()
    _block: tuple[TokenBatch, int, int] | None = field(default=None, init=False, repr=False, compare=False)
    """(the joined batch, its blocks, this block's index) of a :meth:`split` block: its ESS and ratio summary are
    computed for every block of the joined batch in one call."""
    _blocks: tuple[Tensor, list[dict[str, Tensor]]] | None = field(default=None, init=False, repr=False,
                                                                    compare=False)  # per-block ESS, summaries

    def __post_init__(self) -> None:
        if not isinstance(self.logp, Tensor) or self.logp.dim() != 2:
            raise ValueError(f"TokenBatch.logp must be a 2-D [B, T] tensor, got {_describe(self.logp)}")
        shape = tuple(self.logp.shape)
        if not torch.is_floating_point(self.logp):
            raise ValueError(f"TokenBatch.logp must be floating point, got {self.logp.dtype}")
        if isinstance(self.advantages, Tensor) and self.advantages.dim() == 1 and self.advantages.shape[0] == shape[0]:
            self.advantages = self.advantages[:, None].expand(shape)
        self.behavior_logp = _detached(self.behavior_logp)
        for name in ("sampler_logp", "prox_logp", "ref_logp"):
            if getattr(self, name) is not None:
                setattr(self, name, _detached(getattr(self, name)))
        self.mask = self.mask.to(self.logp.dtype) if isinstance(self.mask, Tensor) else self.mask
        for name in _TOKEN_FIELDS:
            _check_token_field(name, getattr(self, name), shape, required=name in ("behavior_logp", "advantages", "mask"))
        for name in _SEQUENCE_FIELDS:
            _check_sequence_field(name, getattr(self, name), shape[0])
        keep = self.mask > 0
        zeroed = self._zero_padded(keep)
        checked = [zeroed[name] for name in _FINITE_FIELDS if name in zeroed]
        # one fused test (and one host sync) for the common valid case; the field is named only on failure
        binary = (self.mask == keep.to(self.mask.dtype)).all()  # only 0 and 1 equal their own test "> 0" (nan fails)
        valid = torch.isfinite(torch.stack(checked)).all() & binary
        if not bool(valid):
            self._raise_invalid(zeroed)
        for name, value in zeroed.items():
            setattr(self, name, value)

    def _zero_padded(self, keep: Tensor) -> dict[str, Tensor]:
        """The token fields with padded entries replaced by 0 via ``torch.where``, so that whatever padding holds
        (even inf / nan) changes neither the loss nor the gradient."""
        out = {}
        for name in _TOKEN_FIELDS:
            value = getattr(self, name)
            if name != "mask" and value is not None:
                out[name] = torch.where(keep, value, 0.0)  # the scalar takes value's dtype and device
        return out

    def _raise_invalid(self, zeroed: dict[str, Tensor]) -> None:
        for name in _FINITE_FIELDS:  # padded entries are 0 here, so only unmasked tokens can fail
            if name in zeroed and not torch.isfinite(zeroed[name]).all():
                raise ValueError(f"TokenBatch.{name} holds non-finite values on unmasked tokens")
        raise ValueError("TokenBatch.mask must hold only 0 and 1")

    @property
    def batch_size(self) -> int:
        return int(self.logp.shape[0])

    @property
    def log_ratio(self) -> Tensor:
        """log r = logp - behavior_logp (grad flows through ``logp``), zero on padded tokens (both terms are 0 there,
        see :meth:`_zero_padded`, so no mask is applied)."""
        return self.logp - self.behavior_logp

    def delta(self) -> Tensor:
        """Δ = log r = logp − behavior_logp, detached (0 on padded tokens); computed once per batch and shared by the
        objective and its metrics (:attr:`log_ratio` is the same value with grad)."""
        if self._delta is None:
            self._delta = self.logp.detach() - self.behavior_logp
        return self._delta

    def ratio(self) -> Tensor:
        """r = exp(Δ), detached (1 on padded tokens); computed once per batch and shared by the objective and its
        metrics."""
        if self._ratio is None:
            self._ratio = torch.exp(self.delta())
        return self._ratio

    def ess(self) -> Tensor:
        """ESS = (Σ r)² / (n Σ r²) over the valid tokens (:func:`~offpolicylab.diagnostics.stats.effective_sample_size`),
        detached; computed once per batch and shared by the objective (P3O) and its metrics."""
        if self._ess is None:
            self._ess = (stats.effective_sample_size(self.delta(), self.mask) if self._block is None else
                         self._block[0].block_ess(self._block[1])[self._block[2]])
        return self._ess

    def ratio_summary(self) -> dict[str, Tensor]:
        """The ratio statistics of the batch (:func:`~offpolicylab.diagnostics.stats.fused_ratio_summary` of
        :meth:`delta`, :meth:`ratio`, :meth:`ess`), computed once per batch."""
        if self._summary is None:
            self._summary = (stats.fused_ratio_summary(self.delta(), self.mask, self.ratio(), self.ess())
                             if self._block is None else self._block[0].block_summaries(self._block[1])[self._block[2]])
        return self._summary

    def block_ess(self, count: int) -> Tensor:
        """[count] the ESS of each of the ``count`` equal row blocks (:meth:`split`), in one call."""
        if self._blocks is None or self._blocks[0].numel() != count:
            self._blocks = (stats.effective_sample_size(self.delta(), self.mask, blocks=count), [])
        return self._blocks[0]

    def block_summaries(self, count: int) -> list[dict[str, Tensor]]:
        """The ratio summary (:meth:`ratio_summary`) of each of the ``count`` equal row blocks (:meth:`split`), in one
        :func:`~offpolicylab.diagnostics.stats.fused_ratio_summary` call."""
        ess = self.block_ess(count)
        if not self._blocks[1]:
            joined = stats.fused_ratio_summary(self.delta(), self.mask, self.ratio(), ess, blocks=count)
            columns = {key: value.unbind() for key, value in joined.items()}
            self._blocks[1].extend({key: value[index] for key, value in columns.items()} for index in range(count))
        return self._blocks[1]

    def sequence_log_ratio(self) -> Tensor:
        """[B] log of the geometric-mean ratio, mean_t log r_t over each row's valid tokens (0 for an empty row),
        detached: GSPO's log s_i, MIS-PO's log ρ(τ) (:func:`~offpolicylab.diagnostics.stats.sequence_log_ratio`,
        with the padding already 0)."""
        return self.delta().sum(dim=-1) / self.mask.sum(dim=-1).clamp_min(1.0)

    def keep_rows(self, keep: Tensor, advantages: Tensor) -> TokenBatch:
        """A copy in which only the sequences where ``keep`` ([B] bool) holds remain — the others become padding
        (mask 0, every token field 0) — with new per-sequence ``advantages`` ([B], finite).  Not validated again:
        every value left was validated here and zeroing rows keeps the invariants.  The fields checked finite are
        zeroed with products (x·1 = x, x·0 = 0), ``logp`` and ``entropy`` (not checked) with ``torch.where``."""
        rows = keep.to(self.mask.dtype)[:, None]
        out = copy.copy(self)
        out.mask = self.mask * rows
        out.advantages = advantages.to(self.mask.dtype)[:, None] * out.mask
        for name in ("behavior_logp", "sampler_logp", "prox_logp", "ref_logp"):
            value = getattr(self, name)
            if value is not None:
                setattr(out, name, value * rows)
        for name in ("logp", "entropy"):
            value = getattr(self, name)
            if value is not None:
                setattr(out, name, torch.where(rows > 0, value, 0.0))
        out._delta = out._ratio = out._ess = out._summary = out._block = out._blocks = None
        return out

    def split(self, count: int) -> list[TokenBatch]:
        """The ``count`` equal consecutive row blocks as batches (several runs' batches joined row-wise), each
        with its group ids counted from 0.  Not validated again: validation and padding removal work token by token,
        so a block equals its rows validated on their own; the batch-level caches (ESS, ratio summary) are left to
        be computed per block.  One block is the batch itself."""
        if count == 1:
            return [self]
        rows = self.batch_size // count
        if rows * count != self.batch_size:
            raise ValueError(f"a batch of {self.batch_size} rows does not split into {count} equal blocks")
        blocks = []
        for index in range(count):
            part = slice(index * rows, (index + 1) * rows)
            block = copy.copy(self)
            for name in _TOKEN_FIELDS + _SEQUENCE_FIELDS:
                value = getattr(self, name)
                if value is not None:
                    setattr(block, name, value[part])
            if block.group_ids is not None:
                block.group_ids = block.group_ids - block.group_ids.min()
            block._delta = None if self._delta is None else self._delta[part]
            block._ratio = None if self._ratio is None else self._ratio[part]
            block._ess = block._summary = block._blocks = None
            block._block = (self, count, index)
            blocks.append(block)
        return blocks

    def replace(self, **changes: Tensor | None) -> TokenBatch:
        """A copy with some fields replaced (validated again)."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        values.update(changes)
        return TokenBatch(**values)


@dataclass
class LossOutput:
    """What an objective returns: a scalar ``loss`` to ``.backward()``, detached ``metrics`` with the standard names
    (docs/design.md, "The objective contract"), and ``token_mask`` [B, T], the tokens that carried gradient after the objective's own masking."""

    loss: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)
    token_mask: Tensor | None = None


def _describe(value: object) -> str:
    if isinstance(value, Tensor):
        return f"tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    return type(value).__name__


def _detached(value: object) -> object:
    return value.detach() if isinstance(value, Tensor) else value


def _check_token_field(name: str, value: object, shape: tuple[int, ...], *, required: bool) -> None:
    if value is None:
        if required:
            raise ValueError(f"TokenBatch.{name} is required ([B, T] = {list(shape)})")
        return
    if not isinstance(value, Tensor) or tuple(value.shape) != shape:
        raise ValueError(f"TokenBatch.{name} must have shape [B, T] = {list(shape)}, got {_describe(value)}")
    if not torch.is_floating_point(value):
        raise ValueError(f"TokenBatch.{name} must be floating point, got {value.dtype}")
    if name == "mask":
        return



def _check_sequence_field(name: str, value: object, batch_size: int) -> None:
    if value is None:
        return
    if not isinstance(value, Tensor) or tuple(value.shape) != (batch_size,):
        raise ValueError(f"TokenBatch.{name} must have shape [B] = [{batch_size}], got {_describe(value)}")
    if torch.is_floating_point(value) and not torch.isfinite(value).all():
        raise ValueError(f"TokenBatch.{name} holds non-finite values")
