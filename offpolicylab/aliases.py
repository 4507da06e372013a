"""verl's and TRL's names for our settings, accepted wherever a config is given (flags, YAML / JSON, Python) and
mapped to ours here, in one place.

=====================  =================  ===============================================================
their name             ours               where it comes from
=====================  =================  ===============================================================
``max_steps``          ``updates``        TRL ``TrainingArguments.max_steps`` (a run field)
``clip_ratio_low``     ``eps_low``        verl ``actor.clip_ratio_low`` (an objective parameter)
``clip_ratio_high``    ``eps_high``       verl ``actor.clip_ratio_high``
``epsilon``            ``eps_low``        TRL ``GRPOConfig.epsilon``; also ``eps_high`` when no upper bound is
                                          given (TRL: ``epsilon_high`` defaults to ``epsilon``)
``epsilon_high``       ``eps_high``       TRL ``GRPOConfig.epsilon_high``
``loss_agg_mode``      ``agg``            verl ``actor.loss_agg_mode``
=====================  =================  ===============================================================

An alias renames; it does not convert units (TRL's CISPO ``epsilon_high`` is the cap itself, ours caps at
1 + ``eps_high``).  Objective-parameter aliases may be given at the top level of a config file (as verl and TRL
users write them) or among ``objective_params``; both end in ``objective_params`` under our names.  Two spellings
of one setting with different values raise ``ValueError`` naming both.
"""

from __future__ import annotations

from typing import Any

#: Run fields (:class:`~offpolicylab.config.TrainConfig`): their name → ours.
CONFIG_ALIASES: dict[str, str] = {"max_steps": "updates"}
#: Objective parameters: their name → ours.
PARAM_ALIASES: dict[str, str] = {
    "clip_ratio_low": "eps_low",
    "clip_ratio_high": "eps_high",
    "epsilon": "eps_low",
    "epsilon_high": "eps_high",
    "loss_agg_mode": "agg",
}
#: Aliases that also set a second parameter unless it is given (TRL's ``epsilon_high`` defaults to ``epsilon``).
_ALSO_SETS: dict[str, str] = {"epsilon": "eps_high"}


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
            _put(out, spelled, CONFIG_ALIASES.get(key, key), key, value, "config fields")
    if params is not None and not isinstance(params, dict):
        return out  # not a mapping: TrainConfig's own check says so
    if lifted or nested:
        out["objective_params"] = _canonical(list((params or {}).items()) + lifted)
    return out


def _canonical(items: list[tuple[str, Any]], also: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}  # our name -> the key that set it
    for key, value in items:
        _put(out, spelled, PARAM_ALIASES.get(key, key), key, value, "objective parameters")
    for alias, target in _ALSO_SETS.items() if also else ():
        given = [value for key, value in items if key == alias]
        if given and target not in out:
            out[target] = given[0]
    return out


def _put(out: dict[str, Any], spelled: dict[str, str], name: str, key: str, value: Any, what: str) -> None:
    if name in out and out[name] != value:
        raise ValueError(f"{what} {spelled[name]}={out[name]!r} and {key}={value!r} name the same setting {name}; "
                         "valid: one of them")
    out[name] = value
    spelled.setdefault(name, key)
