"""verl's and TRL's names for our settings, accepted wherever a config is given (flags, YAML / JSON, Python,
``key=value`` overrides) and mapped to ours here, in one place.

==============================  ======================  ===================================================
their name                      ours                    where it comes from
==============================  ======================  ===================================================
``max_steps``                   ``updates``             TRL ``TrainingArguments.max_steps`` (a run field)
``total_training_steps``        ``updates``             verl ``trainer.total_training_steps``
``learning_rate``               ``lr``                  TRL ``TrainingArguments.learning_rate`` (verl
                                                        ``actor.optim.lr`` is ``lr`` already)
``num_generations``             ``group_size``          TRL ``GRPOConfig.num_generations`` (verl
                                                        ``rollout.n``: the override
                                                        ``actor_rollout_ref.rollout.n``)
``train_batch_size``            ``prompts_per_update``  verl ``data.train_batch_size`` (prompts per step)
``max_grad_norm``               ``grad_clip``           TRL ``TrainingArguments.max_grad_norm`` (verl
                                                        ``actor.grad_clip`` is ``grad_clip`` already)
``eval_steps`` / ``test_freq``  ``eval_every``          TRL ``eval_steps``, verl ``trainer.test_freq``
``save_steps`` / ``save_freq``  ``checkpoint_every``    TRL ``save_steps``, verl ``trainer.save_freq``
``scale_rewards``               ``advantage``           TRL ``GRPOConfig.scale_rewards``: true / group →
                                                        std_trl, false / none → mean
``norm_adv_by_std_in_grpo``     ``advantage``           verl ``algorithm.norm_adv_by_std_in_grpo``: true →
                                                        std, false → mean
``max_num_gen_batches``         ``dynamic_sampling_     verl ``algorithm.filter_groups.max_num_gen_batches``
                                max_batches``
``clip_ratio_low``              ``eps_low``             verl ``actor.clip_ratio_low`` (an objective parameter)
``clip_ratio_high``             ``eps_high``            verl ``actor.clip_ratio_high``
``clip_ratio``                  ``eps_low``             verl ``actor.clip_ratio``; also ``eps_high`` when no
                                                        upper bound is given
``clip_ratio_c``                ``dual_clip``           verl ``actor.clip_ratio_c`` (the dual-clip constant)
``epsilon``                     ``eps_low``             TRL ``GRPOConfig.epsilon``; also ``eps_high`` when no
                                                        upper bound is given (TRL: ``epsilon_high`` defaults
                                                        to ``epsilon``)
``epsilon_high``                ``eps_high``            TRL ``GRPOConfig.epsilon_high``
``loss_agg_mode``               ``agg``                 verl ``actor.loss_agg_mode``
``loss_type``                   ``agg``                 TRL ``GRPOConfig.loss_type`` (``grpo`` →
                                                        ``seq-mean-token-mean``; ``dr_grpo``, ``bnpo``,
                                                        ``dapo`` as they are)
``beta``                        ``kl_coef``             TRL ``GRPOConfig.beta``
``kl_loss_coef``                ``kl_coef``             verl ``actor.kl_loss_coef``
``use_kl_loss``                 ``kl_coef``             verl ``actor.use_kl_loss``: false → 0; true →
                                                        ``kl_loss_coef``, else verl's default 0.001
``kl_loss_type``                ``kl_estimator``        verl ``actor.kl_loss_type`` (``kl``, ``mse``,
                                                        ``low_var_kl`` or our k1, k2, k3)
``entropy_coeff``               ``entropy_coef``        verl ``actor.entropy_coeff``
``vllm_importance_sampling_     ``tis_cap``             TRL ``GRPOConfig.vllm_importance_sampling_cap``
cap``
==============================  ======================  ===================================================

Same names need no alias: ``temperature``, ``seed``, ``lr``, ``grad_clip``, ``report_to``.  A verl override's
dotted path (``actor_rollout_ref.actor.clip_ratio_high=0.28``, ``algorithm.norm_adv_by_std_in_grpo=false``) is
read by its last name (:func:`verl_path_name`).  An alias renames (and maps the values above); it does not convert
units (TRL's CISPO ``epsilon_high`` is the cap itself, ours caps at 1 + ``eps_high``).  Objective-parameter aliases
may be given at the top level of a config file (as verl and TRL users write them) or among ``objective_params``;
both end in ``objective_params`` under our names.  Two spellings of one setting with different values raise
``ValueError`` naming both.
"""

from __future__ import annotations

from typing import Any

#: Run fields (:class:`~offpolicylab.config.TrainConfig`): their name → ours.
CONFIG_ALIASES: dict[str, str] = {
    "max_steps": "updates",
    "total_training_steps": "updates",
    "learning_rate": "lr",
    "num_generations": "group_size",
    "train_batch_size": "prompts_per_update",
    "max_grad_norm": "grad_clip",
    "eval_steps": "eval_every",
    "test_freq": "eval_every",
    "save_steps": "checkpoint_every",
    "save_freq": "checkpoint_every",
    "scale_rewards": "advantage",
    "norm_adv_by_std_in_grpo": "advantage",
    "max_num_gen_batches": "dynamic_sampling_max_batches",
}
#: Objective parameters: their name → ours.
PARAM_ALIASES: dict[str, str] = {
    "clip_ratio_low": "eps_low",
    "clip_ratio_high": "eps_high",
    "clip_ratio": "eps_low",
    "clip_ratio_c": "dual_clip",
    "epsilon": "eps_low",
    "epsilon_high": "eps_high",
    "loss_agg_mode": "agg",
    "loss_type": "agg",
    "beta": "kl_coef",
    "kl_loss_coef": "kl_coef",
    "use_kl_loss": "kl_coef",
    "kl_loss_type": "kl_estimator",
    "entropy_coeff": "entropy_coef",
    "vllm_importance_sampling_cap": "tis_cap",
}
#: Aliases that also set a second parameter unless it is given (TRL's ``epsilon_high`` defaults to ``epsilon``;
#: verl's ``clip_ratio`` is both bounds unless ``clip_ratio_high`` is given).
_ALSO_SETS: dict[str, str] = {"epsilon": "eps_high", "clip_ratio": "eps_high"}
_ADVANTAGE = {"true": "std_trl", "group": "std_trl", "false": "mean", "none": "mean"}  # TRL's std + 1e-4
#: Aliases whose values are spelled differently: {alias: {their value (lower case): ours}}; a value not listed is
#: passed on as it is (our own check then names what is valid).
VALUE_MAPS: dict[str, dict[str, str]] = {
    "scale_rewards": _ADVANTAGE,
    "norm_adv_by_std_in_grpo": {"true": "std", "false": "mean"},
    "loss_type": {"grpo": "seq-mean-token-mean"},
}
#: verl's default ``kl_loss_coef``, the KL coefficient of ``use_kl_loss: true`` alone.
VERL_KL_LOSS_COEF = 0.001
#: Whole verl paths whose last name alone would say too little.
VERL_PATHS: dict[str, str] = {
    "actor_rollout_ref.rollout.n": "group_size",
    "algorithm.filter_groups.enable": "dynamic_sampling",
    "reward.reward_kwargs.overlong_buffer_cfg.len": "overlong_buffer",  # verl 0.9 (reward_model. before)
    "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor": "overlong_penalty",
    "reward_model.reward_kwargs.overlong_buffer_cfg.len": "overlong_buffer",
    "reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor": "overlong_penalty",
}
#: The sections of verl's config whose dotted paths are read by their last name.
VERL_SECTIONS = ("actor_rollout_ref", "algorithm", "data", "trainer", "reward", "reward_model")


def verl_path_name(key: str) -> str:
    """The name a verl override's dotted path stands for: :data:`VERL_PATHS`, else the path's last name when it
    starts with a verl section (``actor_rollout_ref.actor.clip_ratio_high`` → ``clip_ratio_high``), else ``key``."""
    if key in VERL_PATHS:
        return VERL_PATHS[key]
    first, _, _ = key.partition(".")
    return key.rsplit(".", 1)[-1] if first in VERL_SECTIONS and "." in key else key


def alias_value(alias: str, value: Any) -> Any:
    """``value`` of the setting ``alias`` in our spelling (:data:`VALUE_MAPS`; ``use_kl_loss`` → a KL coefficient
    of 0 or :data:`VERL_KL_LOSS_COEF`)."""
    if alias == "use_kl_loss":
        word = str(value).strip().lower()
        if word not in ("true", "false"):
            raise ValueError(f"use_kl_loss={value!r} is invalid; valid: true or false (verl actor.use_kl_loss)")
        return VERL_KL_LOSS_COEF if word == "true" else 0.0
    mapping = VALUE_MAPS.get(alias)
    if mapping is None:
        return value
    return mapping.get(str(value).strip().lower(), value)


def canonical_params(params: dict[str, Any]) -> dict[str, Any]:
    """Objective parameters with :data:`PARAM_ALIASES` renamed to our names (order kept; other keys unchanged)."""
    if not any(key in PARAM_ALIASES for key in params):
        return params
    return _canonical(list(params.items()))


def merge_params(base: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``base`` (our names) updated with ``given`` (any names; e.g. flags over a file's): ``epsilon`` sets
    ``eps_high`` only when neither gives an upper bound."""
    out = {**base, **_canonical(list(given.items()), also=False)}
    for alias, target in _ALSO_SETS.items():
        if alias in given and target not in out:
            out[target] = given[alias]
    return out


def canonical_config(data: dict[str, Any]) -> dict[str, Any]:
    """A config mapping with :data:`CONFIG_ALIASES` renamed, top-level objective-parameter aliases moved into
    ``objective_params`` and the aliases there renamed (:func:`canonical_params`)."""
    params = data.get("objective_params")
    nested = isinstance(params, dict) and any(key in PARAM_ALIASES for key in params)
    if not nested and not any(key in CONFIG_ALIASES or key in PARAM_ALIASES for key in data):
        return data
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    lifted: list[tuple[str, Any]] = []
    for key, value in data.items():
        if key in PARAM_ALIASES:
            lifted.append((key, value))
        else:
            _put(out, spelled, CONFIG_ALIASES.get(key, key), key, alias_value(key, value), "config fields")
    if params is not None and not isinstance(params, dict):
        return out  # not a mapping: TrainConfig's own check says so
    if lifted or nested:
        out["objective_params"] = _canonical(list((params or {}).items()) + lifted)
    return out


def _canonical(items: list[tuple[str, Any]], also: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}  # our name -> the key that set it
    items = _kl_switch(items)
    for key, value in items:
        _put(out, spelled, PARAM_ALIASES.get(key, key), key, alias_value(key, value) if key in PARAM_ALIASES
             else value, "objective parameters")
    for alias, target in _ALSO_SETS.items() if also else ():
        given = [value for key, value in items if key == alias]
        if given and target not in out:
            out[target] = given[0]
    return out


def _kl_switch(items: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """verl's ``use_kl_loss`` with its coefficient: ``use_kl_loss: true`` beside ``kl_loss_coef`` (or ``beta``,
    ``kl_coef``) says nothing more and is dropped; ``false`` makes any coefficient 0, as verl ignores it then."""
    switch = [value for key, value in items if key == "use_kl_loss"]
    if not switch:
        return items
    coefficient = VERL_KL_LOSS_COEF if alias_value("use_kl_loss", switch[-1]) else 0.0
    rest = [(key, value) for key, value in items if key != "use_kl_loss"]
    if coefficient == 0.0:
        return [(key, value) for key, value in rest if PARAM_ALIASES.get(key, key) != "kl_coef"] + \
            [("use_kl_loss", switch[-1])]
    if any(PARAM_ALIASES.get(key, key) == "kl_coef" for key, _ in rest):
        return rest
    return [*rest, ("use_kl_loss", switch[-1])]


def _put(out: dict[str, Any], spelled: dict[str, str], name: str, key: str, value: Any, what: str) -> None:
    if name in out and out[name] != value:
        raise ValueError(f"{what} {spelled[name]}={out[name]!r} and {key}={value!r} name the same setting {name}; "
                         "valid: one of them")
    out[name] = value
    spelled.setdefault(name, key)
