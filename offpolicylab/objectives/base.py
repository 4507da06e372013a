"""Objective base class and the objective registry (docs/design.md, "The objective contract").

An objective turns a :class:`TokenBatch` into a :class:`LossOutput`.  Subclasses implement
:meth:`Objective.token_loss`, returning the per-token loss ℓ_it and the tokens that carried gradient; the base class
applies the optional TIS weight, aggregates with ``agg`` and adds the standard diagnostics.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor

from offpolicylab.corrections import ENGINES, Correction
from offpolicylab.corrections import correction as correction_kind
from offpolicylab.formulas import kish_ess
from offpolicylab.objectives.aggregation import AGG_CHOICES, aggregate, canonical_agg
from offpolicylab.objectives.batch import LossOutput, TokenBatch
from offpolicylab.objectives.regularization import KL_ESTIMATORS, kl_penalty
from offpolicylab.registry import Param, Registry, resolve

#: Group-relative advantage estimators (see the trainer): ``mean`` A_i = r_i − r̄_g (REC paper, Yao et al. 2025,
#: arXiv:2509.24203), ``std`` A_i = (r_i − r̄_g)/(s_g + 1e-6) with s_g the Bessel-corrected group std (GRPO, Shao
#: et al. 2024, arXiv:2402.03300, as verl computes it), ``std_trl`` the same with + 1e-4 (TRL's), ``std_population``
#: with the population std.
ADVANTAGES = ("mean", "std", "std_trl", "std_population")

COMMON_PARAMS: dict[str, Param] = {
    "agg": Param("token-mean", str, choices=AGG_CHOICES,
                 doc="loss aggregation mode (verl loss_agg_mode; TRL loss_type dr_grpo, bnpo, dapo; "
                     "offpolicylab.objectives.aggregation)"),
    "agg_norm": Param(None, float, low=0.0, low_open=True, optional=True,
                      doc="the constant C of agg=seq-mean-token-sum-norm / dr_grpo, L = Σ m·ℓ / (B·C): TRL "
                          "max_completion_length, verl loss_scale_factor (none = the world's max_response_len in "
                          "runs, TRL's max_completion_length in the TRL plug-in, else the batch's padded length T)"),
    "tis_cap": Param(
        None, float, low=0.0, low_open=True, optional=True,
        doc="truncated importance sampling: weight min(π_trainer/π_sampler, tis_cap) when sampler_logp is given",
    ),
    "correction": Param(
        None, correction_kind, optional=True,
        doc="an engine's sampler/trainer mismatch correction (docs/corrections.md), applied when sampler_logp is "
            "given: a mapping {engine: verl, rollout_is: sequence, ...} or engine:key=value:... with the engine's own "
            f"parameter names; engines {', '.join(ENGINES)}; tis_cap=C is {{engine: slime, use_tis: true, "
            "tis_clip: C}",
    ),
    "kl_coef": Param(0.0, float, low=0.0, high=math.inf, high_open=True, doc="β of the KL penalty β·agg(k(π_θ‖π_ref)) added to the loss; π_ref is the "
                                               "frozen initial policy π₀ (0 = no penalty; verl kl_loss_coef, TRL beta)"),
    "kl_estimator": Param("k3", str, choices=KL_ESTIMATORS,
                          doc="per-token KL estimator of the penalty (Schulman 2020): k1 = log π_θ − log π_ref, "
                              "k2 = ½(log π_θ − log π_ref)², k3 = π_ref/π_θ − 1 − log(π_ref/π_θ); verl's kl, mse, "
                              "low_var_kl name the same three"),
    "entropy_coef": Param(0.0, float, low=0.0, high=math.inf, high_open=True, doc="c_H of the entropy bonus −c_H·agg(H(π_θ(·|s_t))) added to the "
                                                    "loss (0 = none; verl entropy_coeff)"),
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
    #: The objective reads ``TokenBatch.prox_logp``, log π_prox of a proximal policy (decoupled PPO); the training
    #: loop supplies it (:func:`offpolicylab.proximal.proximal_logp`).
    needs_prox: ClassVar[bool] = False
    #: Every reduction of its loss and metrics over the batch is taken per run (:meth:`TokenBatch.total`,
    #: :meth:`TokenBatch.ess`, ...), so on a batch that joins several runs (``TokenBatch.runs`` > 1) each run's loss
    #: and metrics are its own batch's (:attr:`joins_runs`).
    rowwise: ClassVar[bool] = False
    #: The longest response the batches can hold, set by a training loop that knows it (the world's
    #: ``max_response_len``): the constant of ``seq-mean-token-sum-norm`` / ``dr_grpo`` when ``agg_norm`` is none
    #: (else the batch's padded length T, verl's default).
    response_limit: int | None = None

    def __init__(self, **kwargs: Any) -> None:
        self.config: dict[str, Any] = resolve(f"objective {self.name!r}", self.all_params(), kwargs)
        for key, value in self.config.items():
            setattr(self, key, value)
        self._correction: Correction | None = None
        if self.correction is not None:
            if self.tis_cap is not None:
                raise ValueError(f"objective {self.name!r}: give tis_cap or correction, not both (tis_cap=C is "
                                 "correction={engine: slime, use_tis: true, tis_clip: C})")
            self._correction = Correction.from_config(self.correction)
        if self.agg_norm is not None and canonical_agg(self.agg) != "seq-mean-token-sum-norm":
            raise ValueError(f"objective {self.name!r}: agg_norm={self.agg_norm:g} is used only by "
                             f"agg=seq-mean-token-sum-norm or dr_grpo, not agg={self.agg}; valid: one of those "
                             "aggregations, or agg_norm=none")
        self.check_params()

    @property
    def norm_constant(self) -> float | None:
        """C of ``seq-mean-token-sum-norm`` / ``dr_grpo``: ``agg_norm``, else :attr:`response_limit`, else None (T)."""
        return self.agg_norm if self.agg_norm is not None else self.response_limit

    @property
    def joins_runs(self) -> bool:
        """One call may score several runs' joined batch (``TokenBatch.runs`` > 1): the objective is
        :attr:`rowwise`, keeps no state and has no mismatch correction (whose factors and metrics reduce over the
        whole batch)."""
        return self.rowwise and not self.stateful and self.tis_cap is None and self._correction is None

    @classmethod
    def all_params(cls) -> dict[str, Param]:
        return {**cls.params, **COMMON_PARAMS}

    def check_params(self) -> None:
        """Cross-parameter checks (e.g. low ≤ high); raise ``ValueError`` naming the parameters."""

    # ----------------------------------------------------------------------------------------------- the loss
    def token_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """Return (per-token loss ℓ [B, T], token mask [B, T] of tokens that carry gradient, extra metrics); an
        objective that removes no token returns ``batch.mask`` itself (no copy to multiply by the mask).

        ℓ must be finite on padded tokens (every token field of the batch is 0 there): it is aggregated by
        multiplying with the mask."""
        raise NotImplementedError(f"{type(self).__name__} must implement token_loss")

    def __call__(self, batch: TokenBatch, *, metrics: bool = True) -> LossOutput:
        """Loss, token mask and — unless ``metrics=False`` (the loss and gradient are the same either way) — the
        standard metrics plus the objective's own.  On a batch of several runs (``batch.runs`` > 1; only when
        :attr:`joins_runs`) the loss and each metric that depends on the batch are [runs] tensors, each the run's own
        (:meth:`LossOutput.split`)."""
        if batch.runs > 1 and not self.joins_runs:
            raise ValueError(f"objective {self.name!r} cannot score {batch.runs} runs' batches in one call: it is not "
                             "row-wise, keeps state or corrects the sampler mismatch")
        corrects = (self.tis_cap is not None or self._correction is not None) and batch.sampler_logp is not None
        direct = None if corrects else self.aggregated_loss(batch)
        if direct is not None:
            loss, token_mask, extra = direct
            return self._output(loss, batch, token_mask, extra, None, metrics)
        factor = None
        per_token, token_mask, extra = self.token_loss(batch)
        token_mask = token_mask if token_mask is batch.mask else token_mask * batch.mask
        loss_mask = batch.mask
        if self.tis_cap is not None and batch.sampler_logp is not None:
            factor = tis_weight(batch, self.tis_cap)
            per_token = per_token * factor
        elif self._correction is not None and batch.sampler_logp is not None:
            per_token, token_mask, loss_mask, factor = corrected(self._correction, batch, per_token, token_mask)
        loss = aggregate(per_token, loss_mask, self.agg, finite_padding=True, norm=self.norm_constant,
                         blocks=batch.runs, tokens=batch.tokens() if loss_mask is batch.mask else None)
        return self._output(loss, batch, token_mask, extra, factor, metrics)

    def aggregated_loss(self, batch: TokenBatch) -> tuple[Tensor, Tensor, dict[str, Tensor]] | None:
        """(agg(ℓ), token mask, extra metrics) computed directly — the same loss and gradient, bit for bit, as
        :meth:`token_loss` aggregated with ``agg`` — where the objective has such a form for its parameters, else
        None (the default: :meth:`token_loss` and :func:`aggregate`).  Not called when a mismatch correction
        weighs the per-token loss."""
        return None

    def _output(self, loss: Tensor, batch: TokenBatch, token_mask: Tensor, extra: dict[str, Tensor],
                factor: Tensor | None, metrics: bool) -> LossOutput:
        """The aggregated loss with its regularization terms and, when ``metrics``, the standard metrics, the
        correction's (``factor``: its per-token factor) and the objective's ``extra`` ones."""
        loss, terms = self.regularized(loss, batch)
        if not metrics:
            return LossOutput(loss=loss, metrics={}, token_mask=token_mask)
        values = standard_metrics(batch, token_mask)
        if factor is not None:
            values.update(correction_metrics(batch, factor))
        values.update({key: value.detach() for key, value in extra.items()})
        values.update(terms)
        return LossOutput(loss=loss, metrics=values, token_mask=token_mask)

    def regularized(self, loss: Tensor, batch: TokenBatch) -> tuple[Tensor, dict[str, Tensor]]:
        """(loss + β·agg(k(π_θ‖π_ref)) − c_H·agg(H), {"kl_ref": agg(k)} when ``batch.ref_logp`` is given)
        (:mod:`~offpolicylab.objectives.regularization`; verl's ``use_kl_loss`` and ``entropy_coeff``).  A term whose
        coefficient is 0 is not added, so the loss is then the objective's own, bit for bit."""
        terms: dict[str, Tensor] = {}
        if batch.ref_logp is not None:
            kl = aggregate(kl_penalty(batch.logp, batch.ref_logp, self.kl_estimator), batch.mask, self.agg,
                           finite_padding=True, norm=self.norm_constant, blocks=batch.runs)
            terms["kl_ref"] = kl.detach()
            if self.kl_coef:
                loss = loss + self.kl_coef * kl
        elif self.kl_coef:
            raise ValueError(f"objective {self.name!r} has kl_coef={self.kl_coef:g} but the batch has no ref_logp "
                             "(the reference policy's log-probs of its tokens)")
        if self.entropy_coef:
            if batch.entropy is None or not batch.entropy.requires_grad:
                raise ValueError(f"objective {self.name!r} has entropy_coef={self.entropy_coef:g} but the batch's "
                                 "entropy is missing or carries no gradient")
            loss = loss - self.entropy_coef * aggregate(batch.entropy, batch.mask, self.agg, finite_padding=True,
                                                        norm=self.norm_constant, blocks=batch.runs)
        return loss, terms

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


def tis_weight(batch: TokenBatch, cap: float) -> Tensor:
    """Truncated IS weight min(exp(behavior_logp − sampler_logp), C), detached (Yao et al. 2025, "Your efficient RL
    framework secretly brings you off-policy RL training"): corrects the sampler/trainer numeric mismatch."""
    assert batch.sampler_logp is not None
    return torch.exp(batch.behavior_logp - batch.sampler_logp).clamp(max=cap).detach()


def corrected(correction: Correction, batch: TokenBatch, per_token: Tensor,
              token_mask: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """ℓ_t · w_t · keep_t with (w, keep) = the engine's correction of log π_b − log π_sampler (``behavior_logp`` vs
    ``sampler_logp``; the current policy and the advantages for the corrections that read them), the token mask
    ∧ keep, the mask the loss is aggregated over (∧ keep for verl, whose loss denominator counts only the tokens its
    rejection kept; the batch mask for TRL, OpenRLHF, slime, SkyRL and AReaL, which zero a rejected token's loss and
    keep it in the denominator: :attr:`~offpolicylab.corrections.base.Engine.denominator_after_rejection`) and the
    factor w · keep.  With ``behavior_logp`` = ``sampler_logp`` (``behavior_logp: sampler``) log r ≡ 0 and every
    engine's factor is 1: the correction does nothing."""
    assert batch.sampler_logp is not None
    weights, keep = correction(batch.behavior_logp, batch.sampler_logp, batch.mask, advantages=batch.advantages,
                               current_logp=batch.logp.detach())
    loss_mask = batch.mask * keep if ENGINES[correction.engine].denominator_after_rejection else batch.mask
    factor = weights * keep
    return per_token * factor, token_mask * keep, loss_mask, factor


def correction_metrics(batch: TokenBatch, factor: Tensor) -> dict[str, Tensor]:
    """What the mismatch correction did to this batch, f_t = w_t · keep_t its factor on the valid tokens (n of them),
    ρ_t = π_b(y_t)/π_sampler(y_t) the raw token ratio (TIS: Yao et al. 2025, "Your efficient RL framework secretly
    brings you off-policy RL training"; MIS: Liu, Li et al. 2025, "When speed kills stability"):

    * ``corr_ess`` = (Σ f)² / (n Σ f²), Kish's effective sample size of the factors
      (:func:`~offpolicylab.formulas.kish_ess`; verl's health floor 0.3);
    * ``corr_weight_mean``, ``corr_weight_max`` of f;
    * ``corr_drop_frac``: share of tokens with f = 0 (rejected or masked), ``corr_seq_drop_frac``: share of
      responses with every token so;
    * ``corr_trunc_frac``: share of tokens kept whose factor is none of ρ_t, the response's ratio product
      exp(Σ log ρ), its geometric mean exp(mean log ρ) or 1 (relative tolerance 1e-5): the tokens a cap or clamp
      changed (a capped sequence weight counts once per token).

    Detached tensors, no host sync."""
    assert batch.sampler_logp is not None
    mask = batch.mask
    valid = mask > 0
    count = mask.sum().clamp_min(1.0)
    f = torch.where(valid, factor.detach(), torch.zeros_like(factor))
    log_r = torch.where(valid, (batch.behavior_logp - batch.sampler_logp).detach(), torch.zeros_like(f))
    length = mask.sum(dim=1, keepdim=True).clamp_min(1.0)
    candidates = (log_r.exp(), log_r.sum(dim=1, keepdim=True).exp().expand_as(f),
                  (log_r.sum(dim=1, keepdim=True) / length).exp().expand_as(f), torch.ones_like(f))
    plain = torch.zeros_like(valid)
    for value in candidates:
        plain = plain | ((f - value).abs() <= 1e-5 * value.abs())
    kept = valid & (f != 0)
    rows = valid.any(dim=1)
    dropped_rows = rows & ~(kept.any(dim=1))
    return {"corr_ess": kish_ess(f.reshape(-1), count),
            "corr_weight_mean": f.sum() / count, "corr_weight_max": f.max(),
            "corr_drop_frac": (valid & ~kept).sum() / count,
            "corr_seq_drop_frac": dropped_rows.sum() / rows.sum().clamp_min(1),
            "corr_trunc_frac": (kept & ~plain).sum() / count}


def standard_metrics(batch: TokenBatch, token_mask: Tensor) -> dict[str, Tensor]:
    """ratio_mean/max/p999, log_ratio_abs_mean, m2, ess, kl_k1, kl_k3 (:func:`~offpolicylab.diagnostics.stats.ratio_summary`),
    mask_frac (share of valid tokens the objective removed from the gradient) and entropy when given — all
    detached, no host sync.  Fused (:func:`~offpolicylab.diagnostics.stats.fused_ratio_summary`): the batch's
    log-ratio and entropy are already 0 on padded tokens, and its token count (:meth:`TokenBatch.tokens`) is the
    one the loss divided by."""
    metrics = dict(batch.ratio_summary())
    tokens = batch.tokens()
    count = tokens.clamp_min(1.0)
    kept = tokens if token_mask is batch.mask else batch.total(token_mask.detach())
    metrics["mask_frac"] = 1.0 - kept / count
    if batch.entropy is not None:
        metrics["entropy"] = batch.total(batch.entropy.detach()) / count
    return metrics


# ------------------------------------------------------------------------------------------------- registry
OBJECTIVES: Registry[Objective] = Registry("objective", plugins="offpolicylab.objectives")


def register(name: str) -> Callable[[type[Objective]], type[Objective]]:
    """Class decorator adding an objective under ``name``; a duplicate name raises (no silent overwrite)."""
    return OBJECTIVES.register(name)


def unregister(name: str) -> None:
    """Remove the objective registered as ``name`` (e.g. one a notebook or a test defined; a later ``register``
    may then reuse the name)."""
    OBJECTIVES.unregister(name)


def get_objective(name: str, **params: Any) -> Objective:
    """Build the objective registered as ``name``; unknown names or bad parameters raise ``ValueError``."""
    return OBJECTIVES.get(name).builder(**params)


def list_objectives() -> list[str]:
    """Registered objective names, in registration order."""
    return OBJECTIVES.names()


def objective_params(name: str) -> dict[str, Param]:
    """The parameter specs (own + common) of a registered objective."""
    return OBJECTIVES.params(name)
