"""Objective base class and the objective registry (docs/design.md, "The objective contract").

An objective turns a :class:`TokenBatch` into a :class:`LossOutput`.  Subclasses implement
:meth:`Objective.token_loss`, returning the per-token loss ℓ_it and the tokens that carried gradient; the base class
applies the optional TIS weight, aggregates with ``agg`` and adds the standard diagnostics.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor

from offpolicylab.diagnostics import stats
from offpolicylab.objectives.aggregation import AGG_MODES, aggregate
from offpolicylab.objectives.batch import LossOutput, TokenBatch
from offpolicylab.registry import Param, Registry, resolve

#: Group-relative advantage estimators (see the trainer): ``mean`` A_i = r_i − r̄_g (REC paper, Yao et al. 2025,
#: arXiv:2509.24203), ``std`` A_i = (r_i − r̄_g)/(σ_g + 1e-6) (GRPO, Shao et al. 2024, arXiv:2402.03300).
ADVANTAGES = ("mean", "std")

COMMON_PARAMS: dict[str, Param] = {
    "agg": Param("token-mean", str, choices=AGG_MODES, doc="loss aggregation mode"),
    "tis_cap": Param(
        None, float, low=0.0, low_open=True, optional=True,
        doc="truncated importance sampling: weight min(π_trainer/π_sampler, tis_cap) when sampler_logp is given",
    ),
}


class Objective:
    """Base class: validated parameters, TIS weighting, aggregation and standard metrics.

    Subclasses set ``name``, ``params`` (their own :class:`Param` specs) and implement :meth:`token_loss`.
    ``advantage`` names the group-relative advantage estimator of the objective's paper (one of
    :data:`ADVANTAGES`); the trainer uses it unless the run config chooses another.
    Stateful objectives override :meth:`update`, :meth:`state_dict` and :meth:`load_state_dict`; ``update`` is
    called once per optimizer update, before the loss of that update is computed.
    """

    name: ClassVar[str] = ""
    params: ClassVar[dict[str, Param]] = {}
    stateful: ClassVar[bool] = False
    advantage: ClassVar[str] = "std"
    #: ℓ and the token mask of a row depend on that row alone, and every sum over the batch (the objective's own
    #: metrics included) goes through :func:`~offpolicylab.diagnostics.stats.total` or the reductions built on it:
    #: a stateless objective that sets this scores several runs' batches joined row-wise in one call
    #: (:meth:`call_blocks`).
    rowwise: ClassVar[bool] = False
    #: Extra metrics that are constants of the objective (0-dim, the same for every block of :meth:`call_blocks`).
    constant_metrics: ClassVar[tuple[str, ...]] = ()
    #: The objective reads ``TokenBatch.prox_logp``, log π_prox of a proximal policy (decoupled PPO); the training
    #: loop supplies it (:func:`offpolicylab.proximal.proximal_logp`).
    needs_prox: ClassVar[bool] = False

    def __init__(self, **kwargs: Any) -> None:
        self.config: dict[str, Any] = resolve(f"objective {self.name!r}", self.all_params(), kwargs)
        for key, value in self.config.items():
            setattr(self, key, value)
        self.check_params()

    @classmethod
    def all_params(cls) -> dict[str, Param]:
        return {**cls.params, **COMMON_PARAMS}

    def check_params(self) -> None:
        """Cross-parameter checks (e.g. low ≤ high); raise ``ValueError`` naming the parameters."""

    # ----------------------------------------------------------------------------------------------- the loss
    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """Return (per-token loss ℓ [B, T], token mask [B, T] of tokens that carry gradient, extra metrics).

        ℓ must be finite on padded tokens (every token field of the batch is 0 there): it is aggregated by
        multiplying with the mask."""
        raise NotImplementedError(f"{type(self).__name__} must implement token_loss")

    def __call__(self, batch: TokenBatch, *, metrics: bool = True) -> LossOutput:
        """Loss, token mask and — unless ``metrics=False`` (the loss and gradient are the same either way) — the
        standard metrics plus the objective's own."""
        per_token, token_mask, extra = self.token_loss(batch)
        token_mask = token_mask * batch.mask
        if self.tis_cap is not None and batch.sampler_logp is not None:
            per_token = per_token * tis_weight(batch, self.tis_cap)
        loss = aggregate(per_token, batch.mask, self.agg, finite_padding=True)
        if not metrics:
            return LossOutput(loss=loss, metrics={}, token_mask=token_mask)
        values = standard_metrics(batch, token_mask)
        values.update({key: value.detach() for key, value in extra.items()})
        return LossOutput(loss=loss, metrics=values, token_mask=token_mask)

    def call_blocks(self, batch: TokenBatch, count: int, summaries: list[dict[str, Tensor]] | None = None, *,
                    metrics: bool = True) -> list[LossOutput]:
        """``self(block)`` for each of the ``count`` equal consecutive row blocks of ``batch`` (several runs'
        batches joined row-wise: batched seeds), from one pass over ``batch``: every sum runs per block
        (:func:`~offpolicylab.diagnostics.stats.blockwise`), so each output equals the block's own call bit for bit
        when a block holds at most ``stats.ROW_LIMIT`` tokens.  ``summaries``: each block's
        :meth:`TokenBatch.ratio_summary` (needed for the metrics).  Only for :attr:`rowwise`, stateless objectives."""
        if not self.rowwise or self.stateful:
            raise ValueError(f"objective {self.name!r} cannot score joined batches: it is not row-wise or keeps state")
        if metrics and (summaries is None or len(summaries) != count):
            raise ValueError(f"call_blocks with metrics needs {count} ratio summaries, one per block")
        with stats.blockwise(count):
            per_token, token_mask, extra = self.token_loss(batch)
            token_mask = token_mask * batch.mask
            if self.tis_cap is not None and batch.sampler_logp is not None:
                per_token = per_token * tis_weight(batch, self.tis_cap)
            loss = aggregate(per_token, batch.mask, self.agg, finite_padding=True)
            if metrics:  # standard_metrics' sums, per block
                tokens = stats.total(batch.mask).clamp_min(1.0)
                mask_frac = 1.0 - stats.total(token_mask.detach()) / tokens
                entropy = None if batch.entropy is None else stats.total(batch.entropy) / tokens
        masks = token_mask.split(batch.batch_size // count)
        outs = []
        for index in range(count):
            values: dict[str, Tensor] = {}
            if metrics:
                values.update(summaries[index])  # type: ignore[index]
                values["mask_frac"] = mask_frac[index]
                if entropy is not None:
                    values["entropy"] = entropy[index]
                values.update({key: _block_value(self, key, value, index) for key, value in extra.items()})
            outs.append(LossOutput(loss=loss[index], metrics=values, token_mask=masks[index]))
        return outs

    # ------------------------------------------------------------------------------------------------ state
    def update(self, batch: TokenBatch) -> None:
        """Advance internal state once per optimizer update (no-op for stateless objectives)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"objective {self.name!r} is stateless but got state keys {sorted(state)}")

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config.items())
        return f"{type(self).__name__}({args})"


def _block_value(objective: Objective, key: str, value: Tensor, index: int) -> Tensor:
    """Block ``index``'s value of an extra metric computed by :meth:`Objective.call_blocks` ([count]; a declared
    constant is 0-dim).  A 0-dim value that is not declared constant is a sum that bypassed ``stats.total``."""
    if value.dim() == 0:
        if key not in objective.constant_metrics:
            raise ValueError(f"objective {objective.name!r} returned metric {key!r} as one value for all blocks; "
                             "a row-wise objective sums with stats.total or declares it in constant_metrics")
        return value.detach()
    return value[index].detach()


def tis_weight(batch: TokenBatch, cap: float) -> Tensor:
    """Truncated IS weight min(exp(behavior_logp − sampler_logp), C), detached (Yao et al. 2025, "Your efficient RL
    framework secretly brings you off-policy RL training"): corrects the sampler/trainer numeric mismatch."""
    assert batch.sampler_logp is not None
    return torch.exp(batch.behavior_logp - batch.sampler_logp).clamp(max=cap).detach()


def standard_metrics(batch: TokenBatch, token_mask: Tensor) -> dict[str, Tensor]:
    """ratio_mean/max/p999, log_ratio_abs_mean, m2, ess, kl_k1, kl_k3 (:func:`~offpolicylab.diagnostics.stats.ratio_summary`),
    mask_frac (share of valid tokens the objective removed from the gradient) and entropy when given — all
    detached, no host sync.  Fused (:func:`~offpolicylab.diagnostics.stats.fused_ratio_summary`): the batch's
    log-ratio and entropy are already 0 on padded tokens and its ratio is shared with the objective."""
    mask = batch.mask
    metrics = dict(batch.ratio_summary())
    count = mask.sum().clamp_min(1.0)
    metrics["mask_frac"] = 1.0 - token_mask.detach().sum() / count
    if batch.entropy is not None:
        metrics["entropy"] = batch.entropy.sum() / count
    return metrics


# ------------------------------------------------------------------------------------------------- registry
OBJECTIVES: Registry[Objective] = Registry("objective")


def register(name: str) -> Callable[[type[Objective]], type[Objective]]:
    """Class decorator adding an objective under ``name``; a duplicate name raises (no silent overwrite)."""
    return OBJECTIVES.register(name)


def get_objective(name: str, **params: Any) -> Objective:
    """Build the objective registered as ``name``; unknown names or bad parameters raise ``ValueError``."""
    return OBJECTIVES.get(name).builder(**params)


def list_objectives() -> list[str]:
    """Registered objective names, in registration order."""
    return OBJECTIVES.names()


def objective_params(name: str) -> dict[str, Param]:
    """The parameter specs (own + common) of a registered objective."""
    return OBJECTIVES.params(name)
