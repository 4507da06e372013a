"""offpolicylab objectives as verl policy losses (verl ``core_algos.register_policy_loss``).

verl's policy-loss contract (verl ≥ 0.6, checked against 0.9.1)::

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)
        -> (pg_loss, metrics: dict[str, scalar])

older verl (≤ 0.5) passes ``rollout_log_probs`` instead of ``rollout_is_weights`` and returns
``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``; the adapter detects which from verl's own ``vanilla`` loss.
The mapping to :class:`~offpolicylab.objectives.TokenBatch` is

    logp = log_prob,  behavior_logp = old_log_prob,  advantages = advantages,  mask = response_mask,
    sampler_logp = rollout_log_probs (old verl only; used by ``tis_cap``),  agg = loss_agg_mode,

except for an objective that reads log π_prox (``decoupled_ppo``): verl's ``old_log_prob`` is recomputed with the
parameters at the start of the training step, which is AReaL's π_prox, and the behaviour policy is the rollout's, so
``prox_logp = old_log_prob, behavior_logp = rollout_log_probs`` (no ``sampler_logp``); without
``rollout_log_probs`` (verl ≥ 0.6 passes none) it refuses with one line.

and the loss is rescaled from our micro-batch normalisation to verl's global one (``config.global_batch_info``:
token-mean → × n_local_tokens / batch_num_tokens × dp_size; seq-mean-* → × n_local_seqs / global_batch_size ×
dp_size), exactly what verl's ``agg_loss`` does, so gradient accumulation and data parallelism see the same
scale as with verl's built-in losses.

Names: every objective is registered as ``offpolicylab_<name>`` (``offpolicylab_m2po``, ...), never a plain name —
verl already owns ``gspo`` and ``cispo`` with different conventions, and one prefix for all keeps configs readable.
An existing verl loss of that name that is not ours raises ``ValueError`` (no silent overwrite).

Parameters: as verl config keys, under ``actor_rollout_ref.actor.policy_loss.offpolicylab`` —  verl's
``PolicyLossConfig`` is a strict dataclass, so the key needs its subclass with that field,
:class:`offpolicylab.integrations.verl_plugin.PolicyLossConfig`, named as the section's ``_target_``::

    actor_rollout_ref.actor.policy_loss._target_=offpolicylab.integrations.verl_plugin.PolicyLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=offpolicylab_m2po
    +actor_rollout_ref.actor.policy_loss.offpolicylab.tau=0.04

The adapter reads them from the actor config verl passes to the loss (:func:`config_params`) and builds the
objective with them at its first call.  Also, once per process: ``register_with_verl(params={"m2po": {"tau": 0.04}})``
or the environment variable ``OFFPOLICYLAB_VERL_PARAMS`` holding that mapping as JSON (explicit ``params`` win over
the variable); a config key that gives another value for the same parameter is refused.  ``agg`` comes from
verl's ``actor.loss_agg_mode`` (``token-mean``, ``seq-mean-token-mean``, ``seq-mean-token-sum``,
``seq-mean-token-sum-norm``; for the last, ``agg_norm`` is verl's ``loss_scale_factor`` from
``config.global_batch_info`` — where verl's own losses read it — None = the micro-batch's padded length as in verl).

Stateful objectives (``ac_mispo``): one instance per registered name lives for the whole process.  ``update()`` is
called once per optimizer step, before that step's first loss, on that first micro-batch.  A new optimizer step is
detected with a global ``torch.optim`` step post-hook (installed by :func:`register_with_verl`; every
``optimizer.step()`` in the process marks a new step — in verl's actor worker that is the actor optimizer), or
signalled by hand with :func:`advance_step` (``step_hook=False``).  Save/restore with
``policy_loss_adapter(name).objective.state_dict()``.

Batch-level statistics (M2PO's M̂2 masking, P3O's ESS, AC-MIS-PO's quantile) are computed per verl micro-batch;
set ``ppo_micro_batch_size_per_gpu`` equal to the mini-batch for whole-batch statistics.  verl's rollout-correction
weights (``rollout_is_weights``) are refused: our objectives own their importance weighting (``tis_cap``).

Recording: with ``OFFPOLICYLAB_RECORD=DIR`` (and ``OFFPOLICYLAB_RECORD_EVERY=N``) the first adapter called in a
process records every micro-batch it scores into the run directory DIR (``DIR/rank=R`` under data parallelism;
:mod:`offpolicylab.integrations.record`), one update per optimizer step (the step hook ends it).  verl's loss sees
neither the token entropy nor the rewards nor the staleness, so those are not recorded; verl's own FileLogger log
has the reward (``offpolicylab analyze``).

In a verl run, load the adapter in every worker with ``VERL_USE_EXTERNAL_MODULES=offpolicylab.integrations.verl_plugin``
and choose ``actor_rollout_ref.actor.policy_loss.loss_mode=offpolicylab_m2po`` (docs/scaling.md).
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

from torch import Tensor
from torch.optim.optimizer import register_optimizer_step_post_hook

from offpolicylab.integrations.record import RECORD_ENV, Recorder, objective_config
from offpolicylab.objectives import AGG_MODES, Objective, TokenBatch, get_objective, list_objectives
from offpolicylab.objectives.base import COMMON_PARAMS

VERL_PREFIX = "offpolicylab_"
PARAMS_ENV = "OFFPOLICYLAB_VERL_PARAMS"
METRIC_PREFIX = "actor/offpolicylab/"
#: verl's ``loss_agg_mode`` values the adapter accepts (verl's ``token-sum`` is not an offpolicylab aggregation).
VERL_AGG_MODES = (*AGG_MODES, "seq-mean-token-sum-norm")

_ADAPTERS: dict[str, VerlPolicyLoss] = {}
_STEP_HOOK: Any = None
_RECORDING: dict[str, str] = {}  # the one $OFFPOLICYLAB_RECORD folder of this process -> the objective recording


class VerlPolicyLoss:
    """A verl ``PolicyLossFn`` backed by one offpolicylab objective instance (kept across calls).

    ``legacy_return=True`` returns verl ≤ 0.5's ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``; otherwise
    ``(pg_loss, metrics)`` with our metrics under ``actor/offpolicylab/<name>`` plus verl's ``actor/pg_clipfrac``
    (our ``clip_frac`` when the objective reports one) and ``actor/ppo_kl`` (= our ``kl_k1``), all detached tensors.
    """

    def __init__(self, objective: Objective, *, legacy_return: bool = False,
                 params: Mapping[str, Any] | None = None) -> None:
        self.objective = objective
        self.params = dict(params or {})  # the parameters given at registration (register_with_verl, the env var)
        self._built_with = dict(objective.config)  # every parameter of the objective as given
        self._config_params: dict[str, Any] = {}  # the verl config's, once read
        self.legacy_return = legacy_return
        self.update_pending = objective.stateful
        self.recorder: Recorder | None = None
        self._record_checked = False

    def mark_new_step(self) -> None:
        """The next call starts a new optimizer step: a stateful objective advances ``update()`` first, and the
        recorded step (if recording) is written."""
        self.update_pending = self.objective.stateful
        if self.recorder is not None:
            self.recorder.end_step()

    def recording(self) -> Recorder | None:
        """The recorder of ``$OFFPOLICYLAB_RECORD`` for this adapter, opened on its first call (None when unset);
        a second objective recording into the same folder in one process is refused."""
        if not self._record_checked:
            self._record_checked = True
            folder = os.environ.get(RECORD_ENV, "").strip()
            if folder and folder in _RECORDING:
                raise ValueError(f"objective {_RECORDING[folder]!r} already records into {folder}; valid: one "
                                 "offpolicylab loss per process when OFFPOLICYLAB_RECORD is set")
            self.recorder = Recorder.from_env(objective_config("verl", self.objective))
            if self.recorder is not None:
                _RECORDING[folder] = self.objective.name
        return self.recorder

    def __call__(
        self,
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Tensor | None = None,
        rollout_log_probs: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]] | tuple[Tensor, Tensor, Tensor, Tensor]:
        if rollout_is_weights is not None:
            raise ValueError(
                "offpolicylab losses do their own importance weighting and refuse verl's rollout_is_weights; "
                "valid: disable verl's rollout correction (algorithm.rollout_correction.rollout_is=null) and use "
                "the objective's tis_cap or correction parameter (correction={engine: verl, rollout_is: ...} "
                "reproduces verl's own weights)"
            )
        self._configure(config_params(config))
        self._set_agg(loss_agg_mode, loss_scale_factor(config))
        mask = response_mask.to(log_prob.dtype)
        if self.objective.needs_prox:  # verl's old_log_prob is the step-start recompute: AReaL's π_prox
            if rollout_log_probs is None:
                raise ValueError(f"objective {self.objective.name!r} needs the rollout's log-probs as the behaviour "
                                 "policy and verl passed none; valid: a verl that passes rollout_log_probs (<= 0.5)")
            batch = TokenBatch(logp=log_prob, behavior_logp=rollout_log_probs, advantages=advantages, mask=mask,
                               prox_logp=old_log_prob)
        else:
            batch = TokenBatch(logp=log_prob, behavior_logp=old_log_prob, advantages=advantages, mask=mask,
                               sampler_logp=rollout_log_probs)
        if self.update_pending:
            self.objective.update(batch)
            self.update_pending = False
        out = self.objective(batch)
        recorder = self.recording()
        if recorder is not None:
            recorder.add(batch, out)
        loss = out.loss * global_scale(batch.mask, self.objective.agg, global_batch_info(config))
        return self._verl_return(loss, out.metrics)

    def _configure(self, params: dict[str, Any]) -> None:
        """Rebuild the objective with the verl config's parameters (``policy_loss.offpolicylab``) when they are new;
        one that contradicts a parameter given at registration raises ``ValueError`` naming both."""
        if params == self._config_params:
            return
        clash = sorted(key for key in params if key in self.params and self.params[key] != params[key])
        if clash:
            key = clash[0]
            raise ValueError(f"objective parameter {key} is {self.params[key]!r} from register_with_verl / "
                             f"${PARAMS_ENV} and {params[key]!r} from actor.policy_loss.offpolicylab.{key}; valid: "
                             "one of them")
        self.objective = get_objective(self.objective.name, **{**self._built_with, **params})
        self.update_pending = self.objective.stateful
        self._config_params = dict(params)

    def _set_agg(self, loss_agg_mode: str, scale_factor: float | None = None) -> None:
        """The objective's ``agg`` (and ``agg_norm``: verl's ``loss_scale_factor`` for seq-mean-token-sum-norm,
        None otherwise) set from verl's."""
        if loss_agg_mode not in VERL_AGG_MODES:
            raise ValueError(
                f"verl loss_agg_mode={loss_agg_mode!r} is not supported by offpolicylab objectives; "
                f"valid: {', '.join(VERL_AGG_MODES)}"
            )
        norm = scale_factor if loss_agg_mode == "seq-mean-token-sum-norm" else None
        if loss_agg_mode != self.objective.agg or norm != self.objective.agg_norm:
            self.objective.agg = COMMON_PARAMS["agg"].validate("agg", loss_agg_mode)
            self.objective.agg_norm = COMMON_PARAMS["agg_norm"].validate("agg_norm", norm)
            self.objective.config["agg"] = self.objective.agg
            self.objective.config["agg_norm"] = self.objective.agg_norm

    def _verl_return(
        self, loss: Tensor, metrics: Mapping[str, Tensor]
    ) -> tuple[Tensor, dict[str, Tensor]] | tuple[Tensor, Tensor, Tensor, Tensor]:
        zero = loss.detach().new_zeros(())
        clip_frac = metrics.get("clip_frac", zero)
        ppo_kl = metrics.get("kl_k1", zero)
        if self.legacy_return:
            return loss, clip_frac, ppo_kl, zero
        out = {METRIC_PREFIX + key: value for key, value in metrics.items()}
        out["actor/pg_clipfrac"] = clip_frac
        out["actor/ppo_kl"] = ppo_kl
        return loss, out


CONFIG_KEY = "offpolicylab"


def config_params(config: Any) -> dict[str, Any]:
    """The objective parameters verl's actor config holds under ``policy_loss.offpolicylab`` (a mapping; ``{}``
    when absent), as plain values."""
    if config is None:
        return {}
    section = config.get("policy_loss", None) if hasattr(config, "get") else getattr(config, "policy_loss", None)
    if section is None:
        return {}
    params = section.get(CONFIG_KEY, None) if hasattr(section, "get") else getattr(section, CONFIG_KEY, None)
    if not params:
        return {}
    if not hasattr(params, "items"):
        raise ValueError(f"actor.policy_loss.{CONFIG_KEY} holds {params!r}; valid: a mapping of objective parameters "
                         f"(+actor_rollout_ref.actor.policy_loss.{CONFIG_KEY}.tau=0.04)")
    return {str(key): value for key, value in params.items()}


def global_batch_info(config: Any) -> Mapping[str, Any]:
    """verl's ``config.global_batch_info`` (dp_size, batch_num_tokens, global_batch_size), or ``{}``."""
    if config is None:
        return {}
    info = config.get("global_batch_info", None) if hasattr(config, "get") else getattr(config, "global_batch_info", None)
    return info or {}


def loss_scale_factor(config: Any) -> float | None:
    """verl's ``loss_scale_factor`` as verl's own losses see it: ``config.global_batch_info`` (filled from
    ``actor.loss_scale_factor`` by verl's ``ppo_loss``), or None (verl then divides by the padded length)."""
    return global_batch_info(config).get("loss_scale_factor")


def global_scale(mask: Tensor, mode: str, info: Mapping[str, Any]) -> Tensor | float:
    """Factor turning our micro-batch aggregate into verl's global one (verl ``agg_loss``):

    token-mean: n_tok / batch_num_tokens · dp;  seq-mean-token-mean: n_seq⁺ / global_batch_size · dp;
    seq-mean-token-sum(-norm): B / global_batch_size · dp  (n_tok valid tokens, n_seq⁺ non-empty sequences, B rows here —
    the denominators our :func:`~offpolicylab.objectives.aggregate` used).  1 when verl gave no global info.
    """
    dp_size = info.get("dp_size") or 1
    key = "batch_num_tokens" if mode == "token-mean" else "global_batch_size"
    total = info.get(key)
    if total is None:
        if dp_size > 1:
            raise ValueError(f"verl global_batch_info needs {key} when dp_size={dp_size} > 1")
        return 1.0
    if mode == "token-mean":
        local = mask.sum().clamp_min(1.0)
    elif mode == "seq-mean-token-mean":
        local = (mask.sum(dim=-1) > 0).sum().clamp_min(1).to(mask.dtype)
    else:
        local = mask.new_tensor(float(mask.shape[0]))
    return local / total * dp_size


# --------------------------------------------------------------------------------------------- registration
def register_with_verl(
    names: Iterable[str] | None = None,
    params: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    step_hook: bool = True,
) -> list[str]:
    """Register offpolicylab objectives in verl's policy-loss registry as ``offpolicylab_<name>``.

    ``names``: objectives to export (default: all of :func:`list_objectives`).  ``params``: per-objective
    parameters ``{"m2po": {"tau": 0.04}}``, merged over ``$OFFPOLICYLAB_VERL_PARAMS`` (JSON); validated here, so a
    bad value fails at registration, not mid-run.  ``step_hook``: install the global optimizer-step hook that
    advances stateful objectives (else call :func:`advance_step`).  Registering again replaces our own entries.
    Returns the verl names registered.  Raises ``ImportError`` when verl is not installed.
    """
    core_algos = _import_core_algos()
    chosen = list_objectives() if names is None else list(names)
    merged = {**params_from_env(), **{key: dict(value) for key, value in (params or {}).items()}}
    unknown = sorted(set(merged) - set(chosen))
    if unknown:
        raise ValueError(f"parameters given for objectives not registered: {', '.join(unknown)}; valid: {', '.join(chosen)}")
    legacy = not _returns_metrics_dict(core_algos)
    registered = []
    for name in chosen:
        adapter = VerlPolicyLoss(get_objective(name, **merged.get(name, {})), legacy_return=legacy,
                                 params=merged.get(name, {}))
        verl_name = VERL_PREFIX + name
        existing = core_algos.POLICY_LOSS_REGISTRY.get(verl_name)
        if existing is not None and not isinstance(existing, VerlPolicyLoss):
            raise ValueError(f"verl already has a policy loss {verl_name!r} that is not offpolicylab's")
        core_algos.POLICY_LOSS_REGISTRY.pop(verl_name, None)
        core_algos.register_policy_loss(verl_name)(adapter)
        _ADAPTERS[verl_name] = adapter
        registered.append(verl_name)
    if step_hook:
        install_step_hook()
    return registered


def params_from_env() -> dict[str, dict[str, Any]]:
    """``$OFFPOLICYLAB_VERL_PARAMS`` as ``{objective: {param: value}}`` (JSON object of objects; empty if unset)."""
    text = os.environ.get(PARAMS_ENV, "").strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{PARAMS_ENV} is not valid JSON ({error}); valid: e.g. '{{\"m2po\": {{\"tau\": 0.04}}}}'") from None
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ValueError(f"{PARAMS_ENV} must be a JSON object of objects, e.g. '{{\"m2po\": {{\"tau\": 0.04}}}}'")
    return value


def policy_loss_adapter(name: str) -> VerlPolicyLoss:
    """The registered adapter for ``offpolicylab_<name>`` (or the full verl name), e.g. to checkpoint its state."""
    verl_name = name if name.startswith(VERL_PREFIX) else VERL_PREFIX + name
    if verl_name not in _ADAPTERS:
        raise ValueError(f"no offpolicylab loss {verl_name!r} registered with verl; valid: {', '.join(_ADAPTERS) or 'none'}")
    return _ADAPTERS[verl_name]


def advance_step() -> None:
    """Mark a new optimizer step for every registered adapter (what the optimizer hook does)."""
    for adapter in _ADAPTERS.values():
        adapter.mark_new_step()


def install_step_hook() -> None:
    """Install (once) a global ``torch.optim`` step post-hook calling :func:`advance_step` after every step."""
    global _STEP_HOOK
    if _STEP_HOOK is None:
        _STEP_HOOK = register_optimizer_step_post_hook(lambda *_: advance_step())


def remove_step_hook() -> None:
    """Remove the global optimizer-step hook (manual :func:`advance_step` from then on)."""
    global _STEP_HOOK
    if _STEP_HOOK is not None:
        _STEP_HOOK.remove()
        _STEP_HOOK = None


def _import_core_algos() -> ModuleType:
    try:
        from verl.trainer.ppo import core_algos
    except ImportError as error:
        raise ImportError(
            "register_with_verl needs verl: pip install -c constraints.txt verl  (CPU is enough for the registry); "
            f"import failed with: {error}"
        ) from error
    return core_algos


def _returns_metrics_dict(core_algos: ModuleType) -> bool:
    """True for verl ≥ 0.6 (losses return ``(loss, metrics)``), False for the old 4-tuple."""
    vanilla = core_algos.POLICY_LOSS_REGISTRY.get("vanilla")
    if vanilla is None:
        return True
    return "dict" in str(inspect.signature(vanilla).return_annotation)
