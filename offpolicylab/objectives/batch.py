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

    ``runs``: the batch joins the batches of that many runs as equal consecutive row blocks — row i belongs to run
    ⌊i / (B / runs)⌋ — and every batch-level reduction (the ratio summary, ESS, :meth:`total`) is then per run, a
    [runs] tensor, each run's block reduced as it is alone (an objective that honours it says so:
    :attr:`~offpolicylab.objectives.Objective.joins_runs`).

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
    runs: int = 1
    _delta: Tensor | None = field(default=None, init=False, repr=False, compare=False)  # cache of delta()
    _ratio: Tensor | None = field(default=None, init=False, repr=False, compare=False)  # cache of ratio()
    _ess: Tensor | None = field(default=None, init=False, repr=False, compare=False)  # cache of ess()
    _tokens: Tensor | None = field(default=None, init=False, repr=False, compare=False)  # cache of tokens()
    _summary: dict[str, Tensor] | None = field(default=None, init=False, repr=False, compare=False)  # ratio_summary()
    _block: tuple[TokenBatch, int | slice] | None = field(default=None, init=False, repr=False, compare=False)
    """(the joined batch, this part's run index or slice of runs) of a :meth:`split` block or a :meth:`part`: its
    ESS and ratio summary are read from the joined batch's, computed for all its runs in one call."""
    _run_ess: Tensor | None = field(default=None, init=False, repr=False, compare=False)  # cache of run_ess()
    _run_summaries: dict[str, Tensor] | None = field(default=None, init=False, repr=False,
                                                     compare=False)  # cache of run_summaries()
    _split: list[TokenBatch] | None = field(default=None, init=False, repr=False, compare=False)  # split()

    def __post_init__(self) -> None:
        if not isinstance(self.logp, Tensor) or self.logp.dim() != 2:
            raise ValueError(f"TokenBatch.logp must be a 2-D [B, T] tensor, got {_describe(self.logp)}")
        shape = tuple(self.logp.shape)
        if not torch.is_floating_point(self.logp):
            raise ValueError(f"TokenBatch.logp must be floating point, got {self.logp.dtype}")
        if self.runs < 1 or shape[0] % self.runs:
            raise ValueError(f"TokenBatch.runs={self.runs} must divide the batch's {shape[0]} rows into equal blocks")
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

    def total(self, values: Tensor) -> Tensor:
        """Σ of ``values`` ([B, ...]) per run: 0-d for one run, [runs] for several
        (:func:`~offpolicylab.diagnostics.stats.total`)."""
        return stats.total(values, self.runs)

    def tokens(self) -> Tensor:
        """n = Σ mask per run (:meth:`total`), the valid tokens; computed once per batch and shared by the loss's
        ``token-mean`` and the metrics."""
        if self._tokens is None:
            self._tokens = self.total(self.mask)
        return self._tokens

    def per_row(self, values: Tensor) -> Tensor:
        """A per-run value ([runs], from :meth:`total` or :meth:`ess`) as [B, 1], each row its run's; one run's
        0-d value as it is."""
        return values if self.runs == 1 else values.repeat_interleave(self.batch_size // self.runs)[:, None]

    def ess(self) -> Tensor:
        """ESS = (Σ r)² / (n Σ r²) over the valid tokens (:func:`~offpolicylab.diagnostics.stats.effective_sample_size`),
        per run, detached; computed once per batch and shared by the objective (P3O) and its metrics."""
        if self._ess is None:
            self._ess = (stats.effective_sample_size(self.delta(), self.mask, blocks=self.runs, zero_padded=True)
                         if self._block is None else self._block[0].run_ess()[self._block[1]])
        return self._ess

    def ratio_summary(self) -> dict[str, Tensor]:
        """The ratio statistics of the batch (:func:`~offpolicylab.diagnostics.stats.fused_ratio_summary` of
        :meth:`delta`), per run, computed once per batch.  Its ``ess`` is :meth:`ess` where the objective already
        computed it (P3O's loss), else the summary's own from the ratios it computes (the same within float32
        rounding); a part of a joined batch reads the joined batch's summary (:meth:`run_summaries`, its own ESS)."""
        if self._summary is None:
            if self._block is None:
                self._summary = stats.fused_ratio_summary(self.delta(), self.mask, blocks=self.runs,
                                                          tokens=self.tokens(), ess=self._ess)
            else:
                joined, index = self._block
                self._summary = {key: value[index] for key, value in joined.run_summaries().items()}
        return self._summary

    def run_ess(self) -> Tensor:
        """[runs] the ESS of each run's rows, in one call (what :meth:`split` blocks and :meth:`part` read)."""
        if self._run_ess is None:
            self._run_ess = stats.effective_sample_size(self.delta(), self.mask, blocks=self.runs,
                                                        zero_padded=True).reshape(self.runs)
        return self._run_ess

    def run_summaries(self) -> dict[str, Tensor]:
        """The ratio summary (:meth:`ratio_summary`) of each run's rows, each statistic a [runs] tensor, in one
        :func:`~offpolicylab.diagnostics.stats.fused_ratio_summary` call."""
        if self._run_summaries is None:
            joined = stats.fused_ratio_summary(self.delta(), self.mask, blocks=self.runs, tokens=self.tokens())
            self._run_summaries = {key: value.reshape(self.runs) for key, value in joined.items()}
        return self._run_summaries

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
        out._delta = out._ratio = out._ess = out._tokens = out._summary = out._block = None
        out._run_ess = out._run_summaries = out._split = None
        return out

    def split(self) -> list[TokenBatch]:
        """Each run's batch (its row block, ``runs`` = 1, group ids counted from 0), computed once.  One run is the
        batch itself."""
        if self._split is None:
            self._split = [self] if self.runs == 1 else [self._rows(index, slice(index, index + 1), 1)
                                                         for index in range(self.runs)]
        return self._split

    def part(self, start: int, stop: int) -> TokenBatch:
        """The batch of runs ``start … stop − 1`` (``runs`` = stop − start; group ids counted from 0)."""
        if not 0 <= start < stop <= self.runs:
            raise ValueError(f"runs {start} … {stop - 1} are not runs of a batch of {self.runs}")
        if stop - start == self.runs:
            return self
        return self._rows(slice(start, stop), slice(start, stop), stop - start)

    def _rows(self, runs: int | slice, blocks: slice, count: int) -> TokenBatch:
        """The rows of the run blocks ``blocks`` as a batch of ``count`` runs, its ESS and ratio summary read from
        this batch's (``runs``: the index this batch's per-run statistics are read at).  Not validated again:
        validation and padding removal work token by token, so the rows equal their batch validated on its own."""
        size = self.batch_size // self.runs
        part = slice(blocks.start * size, blocks.stop * size)
        block = copy.copy(self)
        for name in _TOKEN_FIELDS + _SEQUENCE_FIELDS:
            value = getattr(self, name)
            if value is not None:
                setattr(block, name, value[part])
        if block.group_ids is not None:
            block.group_ids = block.group_ids - block.group_ids.min()
        block.runs = count
        block._delta = None if self._delta is None else self._delta[part]
        block._ratio = None if self._ratio is None else self._ratio[part]
        block._ess = block._tokens = block._summary = block._run_ess = block._run_summaries = block._split = None
        block._block = (self, runs)
        return block

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

    def split(self, runs: int) -> list[LossOutput]:
        """Each run's output, from the output of a batch that joins ``runs`` runs (:attr:`TokenBatch.runs`): its
        loss, its metrics (a [runs] metric at the run; a 0-d one, a constant of the objective, as it is) and its
        rows of the token mask.  One run's output is itself."""
        if runs == 1:
            return [self]
        masks = [None] * runs if self.token_mask is None else self.token_mask.split(self.token_mask.shape[0] // runs)
        keys = list(self.metrics)
        columns = [value.unbind() if value.dim() else (value,) * runs for value in self.metrics.values()]
        metrics = [dict(zip(keys, values, strict=True)) for values in zip(*columns, strict=True)] if keys else \
            [{} for _ in range(runs)]
        return [LossOutput(loss, own, mask) for loss, own, mask in zip(self.loss.unbind(), metrics, masks, strict=True)]


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


def _check_sequence_field(name: str, value: object, batch_size: int) -> None:
    if value is None:
        return
    if not isinstance(value, Tensor) or tuple(value.shape) != (batch_size,):
        raise ValueError(f"TokenBatch.{name} must have shape [B] = [{batch_size}], got {_describe(value)}")
    if torch.is_floating_point(value) and not torch.isfinite(value).all():
        raise ValueError(f"TokenBatch.{name} holds non-finite values")
