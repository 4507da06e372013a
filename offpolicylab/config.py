"""The configuration of one training run: every field is declared by a :class:`~offpolicylab.registry.Param`
(default, kind, range, command-line help).

>>> cfg = TrainConfig(world="token_mdp", objective="m2po", schedule="stale_k:16")
>>> cfg.to_dict()["schedule"]
'stale_k:16'
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from offpolicylab.aliases import (
    CONFIG_ALIASES,
    PARAM_ALIASES,
    alias_value,
    canonical_config,
    canonical_params,
    merge_params,
    verl_path_name,
)
from offpolicylab.registry import Param, assign, import_modules

if TYPE_CHECKING:  # this module imports no torch
    from offpolicylab.contracts import World

BEHAVIOR_SOURCES = ("auto", "trainer", "sampler")  # offpolicylab.behavior (kept here: this module imports no torch)

OPTIMIZERS = ("adam", "adamw", "sgd")
ADVANTAGE_CHOICES = ("auto", "mean", "std", "std_trl", "std_population")
KL_INIT_MODES = ("auto", "on", "off")
MAX_SEED = 2**32 - 1  # torch, NumPy and the evaluation seed (seed × 1_000_003 + update) all take it exactly
MIN_TEMPERATURE = 1e-6  # logits / T stay finite in float32 for |logits| up to about 1e32
_POSITIVE = {"low": 0.0, "low_open": True, "high": math.inf, "high_open": True}  # a finite number > 0

# Fields a world or a policy may choose.  None in a TrainConfig means "not set": construction fills it with the
# world's suggestion (offpolicylab.worlds.world_train_defaults), else the policy's (POLICY_DEFAULTS), else DEFAULTS —
# the one place where these defaults are applied, whether a config is built in Python, from a file or from flags.
DEFAULTS: dict[str, Any] = {"policy": "tabular", "prompts_per_update": 8, "group_size": 8, "temperature": 1.0,
                            "advantage": "auto", "optimizer": "adam", "lr": 0.05, "grad_clip": 1.0,
                            "eval_samples": 4}
# LoRA on a pretrained LM: lr 1e-4, the order LoRA fine-tuning uses (Hu et al. 2021, arXiv:2106.09685: 2e-4 for
# GPT-2; Dettmers et al. 2023, QLoRA, arXiv:2305.14314: 2e-4 up to 13B, 1e-4 above) and the low end of that range
# because an RL step on stale data must keep the ratio π/π_b near 1; the toy worlds' 0.05 made ratio_max 53 in one
# Adam step on SmolLM2.  One sampled response per evaluation question (plus the greedy one) keeps an evaluation
# about the cost of one update.
POLICY_DEFAULTS: dict[str, dict[str, Any]] = {"hf": {"lr": 1e-4, "eval_samples": 1}}


def _f(param: Param) -> Any:
    """A dataclass field declared by its :class:`Param` (default, kind, range and help text)."""
    if isinstance(param.default, dict):
        return field(default_factory=lambda: dict(param.default), metadata={"param": param})
    return field(default=param.default, metadata={"param": param})


@dataclass
class TrainConfig:
    """Everything that determines a run (with ``seed``, the run is reproducible bit for bit on one machine)."""

    world: str = _f(Param("token_mdp", str, doc="world name, see `offpolicylab list`"))
    world_params: dict[str, Any] = _f(Param({}, dict, doc="world options (--world-param k=v)"))
    objective: str = _f(Param("grpo", str, doc="objective name, see `offpolicylab list`"))
    objective_params: dict[str, Any] = _f(Param({}, dict, doc="objective parameters (--param k=v)"))
    policy: str = _f(Param(None, str, optional=True, doc="policy kind (tabular, sequence_model, transformer, hf; "
                                                          "`offpolicylab list`)"))
    policy_params: dict[str, Any] = _f(Param({}, dict, doc="policy options (--policy-param k=v)"))
    schedule: str = _f(Param("on_policy", str, doc="staleness schedule: on_policy, stale_k:K, sync:M,N, stages:MU, "
                                                   "epochs:E, offline, offline:D, mixture:P"))
    updates: int = _f(Param(200, int, low=1, doc="number of optimizer updates"))
    prompts_per_update: int = _f(Param(None, int, low=1, optional=True, doc="prompts per generated batch"))
    group_size: int = _f(Param(None, int, low=2, optional=True, doc="responses per prompt (GRPO group size G; a group of one response "
                                                  "has advantage 0, so G >= 2)"))
    temperature: float = _f(Param(None, float, low=MIN_TEMPERATURE, high=math.inf, high_open=True, optional=True,
                                  doc="sampling temperature (behavior_logp is recorded at this temperature; below "
                                      "1e-6 logits / T overflow float32)"))
    advantage: str = _f(Param(None, str, choices=ADVANTAGE_CHOICES, optional=True,
                              doc="group-relative advantage estimator: auto (the objective's paper: std for GRPO, "
                                  "GSPO, CISPO, M2PO, MIS-PO, P3O, Mu-GRPO; mean for REINFORCE, REC, OPMD, AsymRE, "
                                  "RED, TOPR), mean (r − r̄), std ((r − r̄)/(s + 1e-6), s the Bessel-corrected "
                                  "group std: verl's), std_trl ((r − r̄)/(s + 1e-4): TRL's) or std_population "
                                  "(÷ (σ + 1e-6), σ the population std); config.json records the one used"))
    dynamic_sampling: bool = _f(Param(False, bool,
                                      doc="DAPO dynamic sampling (Yu et al. 2025, arXiv:2503.14476, eq. 11): drop "
                                          "the groups whose world rewards are all equal (advantage 0) and sample "
                                          "again until the batch has prompts_per_update groups (verl "
                                          "algorithm.filter_groups); seeds then train one after another"))
    dynamic_sampling_max_batches: int = _f(Param(10, int, low=1,
                                                 doc="at most this many generation rounds per batch with "
                                                     "dynamic_sampling (verl max_num_gen_batches); still short, the "
                                                     "batch is filled with the equal-reward groups"))
    overlong_buffer: int = _f(Param(0, int, low=0,
                                    doc="DAPO soft overlong punishment (arXiv:2503.14476, eq. 13): L_cache, the "
                                        "last tokens before overlong_max_len over which a penalty falling linearly "
                                        "to −overlong_penalty is added to the reward (verl "
                                        "overlong_buffer.len, TRL soft_punish_cache; 0 = off)"))
    overlong_max_len: int = _f(Param(None, int, low=1, optional=True,
                                     doc="L_max of the overlong punishment (TRL max_completion_len; none = the "
                                         "world's max_response_len)"))
    overlong_penalty: float = _f(Param(1.0, float, low=0.0,
                                       doc="the overlong punishment's largest penalty (verl "
                                           "overlong_buffer.penalty_factor; DAPO: 1)"))
    behavior_logp: str = _f(Param("auto", str, choices=BEHAVIOR_SOURCES,
                                  doc="where each batch's behavior_logp (the ratios' denominator) comes from: "
                                      "trainer = the trainer's own forward (fp32; for hf one extra forward per "
                                      "batch, verl's recompute of old_log_prob), sampler = the sampling engine's "
                                      "numbers (a reduced sampler_precision's mismatch then enters every ratio), "
                                      "auto = trainer for the toy policies, sampler for hf; the engine's numbers "
                                      "are kept as sampler_logp either way (tis_cap)"))
    optimizer: str = _f(Param(None, str, choices=OPTIMIZERS, optional=True, doc="optimizer"))
    lr: float = _f(Param(None, float, **_POSITIVE, optional=True,
                         doc="learning rate (0.05 for the toy policies, 1e-4 for the LoRA policy hf)"))
    grad_clip: float = _f(Param(None, float, low=0.0, low_open=True, optional=True,
                                doc="max global gradient norm (inf = no clipping)"))
    seed: int = _f(Param(0, int, low=0, high=MAX_SEED, doc="random seed (policy init, prompts, sampling, rewards)"))
    eval_every: int = _f(Param(10, int, low=1, doc="evaluate greedy / sampled reward (and exact return where "
                                                   "enumerable) every N updates"))
    metrics_every: int = _f(Param(1, int, low=1, doc="compute the objective's metrics (ratio statistics, KL, ESS, "
                                                     "clip fractions) every N updates and at the last; the loss "
                                                     "and gradient are the same either way"))
    eval_samples: int = _f(Param(None, int, low=1, optional=True,
                                 doc="sampled responses per evaluation prompt (4 for the toy policies, 1 for hf)"))
    eval_kl_init: str = _f(Param("auto", str, choices=KL_INIT_MODES,
                                 doc="sampled KL(π‖π₀) on the evaluation samples (k1, k3 per token; keeps a frozen "
                                     "copy of π₀): auto = on except for the hf policy, on, off"))
    sample_every: int = _f(Param(25, int, low=0, doc="write ratio/entropy samples for histograms every N updates "
                                                     "(0 = never)"))
    checkpoint_every: int = _f(Param(50, int, low=1, doc="write the checkpoint every N updates and after the last "
                                                         "(a resumed run replays at most N-1 updates from it and "
                                                         "ends identical)"))
    fsync: bool = _f(Param(False, bool, doc="fsync metrics and checkpoint at each checkpoint (survives OS crashes; "
                                            "checkpoints are atomic against a killed process either way)"))
    collapse_margin: float = _f(Param(0.1, float, low=0.0, low_open=True,
                                      doc="collapse: the current policy's smoothed reward falls at least this far "
                                          "below its running peak ..."))
    collapse_gain_fraction: float = _f(Param(0.5, float, low=0.0, high=1.0,
                                             doc="... and by at least this fraction of its gain (peak − first "
                                                 "smoothed reward; 0 = the absolute test alone) ..."))
    collapse_spike: float = _f(Param(5.0, float, low=0.0, low_open=True,
                                     doc="... within `collapse_window` updates of a KL or grad-norm spike "
                                         "(value > this factor × its running mean)"))
    collapse_window: int = _f(Param(20, int, low=1, doc="updates a spike stays relevant to the collapse test"))
    collapse_tail: bool = _f(Param(True, bool, doc="once a stale schedule's queue drains (its next batches would be "
                                                   "consumed after the last update), the current policy still "
                                                   "generates one batch per update, never trained on, so that the "
                                                   "collapse test keeps seeing its reward"))
    stop_on_collapse: bool = _f(Param(False, bool, doc="stop the run at the first detected collapse (a non-finite "
                                                       "loss always stops)"))
    report_to: str = _f(Param("none", str, doc="experiment trackers that also get every metrics row and the "
                                               "histogram samples, comma-separated: tensorboard, wandb, mlflow, "
                                               "trackio, or none (metrics.csv is written either way; a resume may "
                                               "change it)"))

    imports: str = _f(Param(None, str, optional=True,
                            doc="modules to import before the run is built, comma-separated (they register your "
                                "own objectives or worlds: docs/plugins.md); stored in config.json, so sweep "
                                "workers and --resume import them too (config key import or imports)"))

    def __post_init__(self) -> None:
        """Fill the fields left unset (None) that a world or policy may choose (:func:`chosen_defaults`)."""
        for name, (value, _) in chosen_defaults(self.world, self.policy, self.world_params).items():
            if getattr(self, name) is None:
                setattr(self, name, value)

    def with_defaults(self) -> tuple[TrainConfig, dict[str, Any]]:
        """(a copy with the unset fields filled, those values); construction already fills them, so a config built
        by :class:`TrainConfig` is returned as it is, with nothing filled."""
        chosen = chosen_defaults(self.world, self.policy, self.world_params)
        filled = {name: value for name, (value, _) in chosen.items() if getattr(self, name) is None}
        return replace(self, **filled), filled

    def sources(self) -> dict[str, str]:
        """{field: who chose its value} for the fields a world or policy may choose whose value is that choice:
        ``"world W"``, ``"policy P"`` or ``"default"`` (a field given the same value explicitly counts as chosen)."""
        chosen = chosen_defaults(self.world, self.policy, self.world_params)
        return {name: source for name, (value, source) in chosen.items() if getattr(self, name) == value}

    def __setattr__(self, name: str, value: Any) -> None:
        """Every field goes through its :class:`Param` when it is set (at construction and after): strings are
        parsed, ranges checked, ``ValueError`` names the field and what is valid."""
        param = _PARAMS.get(name)
        if name == "imports" and isinstance(value, (list, tuple)):  # a YAML / JSON list of module names
            value = ",".join(map(str, value))
        value = value if param is None else param.validate(name, value)
        if name == "imports" and value is not None:  # registers the modules' parts before the fields use them
            value = ",".join(import_modules(value, "import")) or None
        if name == "objective_params":  # verl's / TRL's parameter names → ours (offpolicylab.aliases)
            value = canonical_params(value)
        if name == "report_to":  # a comma-separated list of tracker names, checked and normalized
            from offpolicylab.tracking import parse_report_to

            value = ",".join(parse_report_to(value)) or "none"
        super().__setattr__(name, value)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Build from a mapping (values may be strings; verl's and TRL's names accepted: :mod:`offpolicylab.aliases`);
        unknown keys raise ``ValueError`` naming the valid ones.
        Fields the mapping leaves out take their defaults as in the constructor (:func:`chosen_defaults`)."""
        data = canonical_config(upgrade_config(data))
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            shown = ", ".join(key if key.isidentifier() else repr(key) for key in map(str, unknown))
            raise ValueError(f"unknown config key(s) {shown}; valid: {', '.join(names)}")
        return cls(**data)


_PARAMS: dict[str, Param] = {f.name: f.metadata["param"] for f in fields(TrainConfig)}
LEGACY_RECOMPUTE = "recompute_behavior_logp"  # the bool that behavior_logp replaced (true = trainer)


def upgrade_config(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the keys of earlier versions renamed: ``recompute_behavior_logp`` (true / false) becomes
    ``behavior_logp`` (``trainer`` / ``auto``), so earlier runs' config.json still load and compare equal; the
    key ``import`` (a config file's spelling of the ``--import`` flag) becomes ``imports``."""
    if "import" in data:
        data = dict(data)
        if "imports" in data:
            raise ValueError("config keys import and imports name the same setting; valid: one of them")
        data["imports"] = data.pop("import")
    if LEGACY_RECOMPUTE not in data:
        return data
    data = dict(data)
    recompute = Param(False, bool).validate(LEGACY_RECOMPUTE, data.pop(LEGACY_RECOMPUTE))
    data.setdefault("behavior_logp", "trainer" if recompute else "auto")
    return data


def upgrade_stored_config(data: dict[str, Any]) -> dict[str, Any]:
    """A run's config.json (``data``) in today's terms: :func:`upgrade_config`'s renames, and each world parameter
    whose default has changed (the world's ``earlier_defaults``: ``synthetic_lm``'s ``preset``) that the run left
    out set to the default it ran with — every config.json written since records that parameter
    (:class:`~offpolicylab.registry.Param` ``recorded``), so one without it was written before the change."""
    from offpolicylab.worlds import world_earlier_defaults  # imported here: heavy, as in chosen_defaults

    data = upgrade_config(data)
    params = data.get("world_params")
    earlier = world_earlier_defaults(str(data.get("world")))
    if not isinstance(params, dict) or not set(earlier) - set(params):
        return data
    return {**data, "world_params": {**earlier, **params}}


def chosen_defaults(world: str, policy: str | None,
                    world_params: dict[str, Any] | None = None) -> dict[str, tuple[Any, str]]:
    """{field: (value, who chose it)} for the fields in :data:`DEFAULTS`: the world's suggestion for its parameters
    ``world_params`` (:func:`offpolicylab.worlds.world_train_defaults`, ``"world W"``), else the policy's
    (:data:`POLICY_DEFAULTS`, ``"policy P"``; the policy itself may be the world's choice), else :data:`DEFAULTS`
    (``"default"``)."""
    # imported here: the worlds package (torch, gymnasium) is heavy and this module is imported by every tool
    from offpolicylab.worlds import world_train_defaults

    suggested = world_train_defaults(str(world), world_params)
    policy = policy or suggested.get("policy") or DEFAULTS["policy"]
    out: dict[str, tuple[Any, str]] = {}
    for name, value in DEFAULTS.items():
        if name in suggested:
            out[name] = (_PARAMS[name].validate(name, suggested[name]), f"world {world}")
        elif name in POLICY_DEFAULTS.get(policy, {}):
            out[name] = (POLICY_DEFAULTS[policy][name], f"policy {policy}")
        else:
            out[name] = (value, "default")
    return out


def config_params() -> dict[str, Param]:
    """{field name: its :class:`Param`} — the CLI's flags and help come from here."""
    return dict(_PARAMS)


def parse_assignments(items: list[str] | None, what: str) -> dict[str, str]:
    """``["k=v", ...]`` → ``{k: "v"}`` (the values stay strings: the part's :class:`Param` parses them); a
    malformed item, or a name given twice, raises ``ValueError``."""
    out: dict[str, str] = {}
    for item in items or []:
        assign(out, item, f"{what} {item!r} is malformed; valid: name=value", where=f"{what} ")
    return out


MAPPING_FIELDS = ("world_params", "objective_params", "policy_params")
_OVERRIDE = re.compile(r"^[A-Za-z_][\w.]*=")


def is_override(item: str) -> bool:
    """Whether a command-line word is a ``KEY=VALUE`` override (``lr=0.01``, ``objective_params.tau=0.04``)."""
    return bool(_OVERRIDE.match(item))


def override_target(key: str) -> tuple[str, str | None]:
    """(field, key inside a mapping field or None) that the override ``key`` sets; ``("objective_params", alias)``
    for an objective-parameter alias.  An unknown key raises ``ValueError`` naming what is valid."""
    head, dot, sub = key.partition(".")
    if dot and head in MAPPING_FIELDS and sub and "." not in sub:
        return head, sub
    name = verl_path_name(key)
    if name in PARAM_ALIASES:
        return "objective_params", name
    if name in CONFIG_ALIASES:
        return CONFIG_ALIASES[name], None
    if name in _PARAMS and name not in MAPPING_FIELDS:
        return name, None
    raise ValueError(f"override {key} names no setting; valid: a config field ({', '.join(_PARAMS)}), "
                     f"FIELD.KEY for {', '.join(MAPPING_FIELDS)} (objective_params.tau=0.04), or a verl / TRL name "
                     f"({', '.join([*CONFIG_ALIASES, *PARAM_ALIASES])}; verl's dotted paths such as "
                     "actor_rollout_ref.actor.clip_ratio_high)")


def override_fields(items: list[str]) -> set[str]:
    """The config fields that the overrides ``items`` set."""
    return {override_target(item.partition("=")[0].strip())[0] for item in items}


def apply_overrides(data: dict[str, Any], items: list[str]) -> dict[str, Any]:
    """``data`` (a config mapping in our names) with Hydra-style ``KEY=VALUE`` overrides applied over it, in order:
    a field (``lr=0.01``), a key of a mapping field (``objective_params.tau=0.04``), or a verl / TRL name, verl's
    dotted paths included (:mod:`offpolicylab.aliases`).  Values stay strings: each field's :class:`Param` parses
    them (``null`` is "not set").  A key given twice, or two keys naming one setting, raises ``ValueError``."""
    out = dict(data)
    seen: dict[tuple[str, str | None], str] = {}
    for item in items:
        key, _, value = item.partition("=")
        field_name, sub = override_target(key.strip())
        target = (field_name, PARAM_ALIASES.get(sub, sub) if field_name == "objective_params" else sub)
        if target in seen:
            raise ValueError(f"overrides {seen[target]} and {item} name the same setting; valid: one of them")
        seen[target] = item
        if sub is None:
            name = verl_path_name(key.strip())
            out[field_name] = alias_value(name, value) if name in CONFIG_ALIASES else value
        elif field_name == "objective_params":
            out[field_name] = merge_params(dict(out.get(field_name) or {}), {sub: value})
        else:
            out[field_name] = {**(out.get(field_name) or {}), sub: value}
    return out


YAML_SUFFIXES = (".yaml", ".yml")
#: The most nodes a YAML file may expand to through its aliases (a "billion laughs" file of nested anchors grows
#: to gigabytes when its data is copied or written out); a config or grid file is far below it.
MAX_YAML_NODES = 100_000
#: The most digits an integer in a config or grid file may have (``int("9" * 400)`` cannot become a float).
MAX_DIGITS = 100


class FileRefused(ValueError):
    """A config or grid file that parses but is refused (a duplicate key, a key that is not a string, aliases that
    expand too far, a number too long): the message, and the line it names (1-based) or None."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


def _yaml_loader() -> type:
    """PyYAML's ``SafeLoader`` (plain data, never Python objects) that also refuses duplicate keys and keys that
    are not strings (``on:`` is the boolean True in YAML 1.1), integers of more than :data:`MAX_DIGITS` digits,
    and documents whose aliases expand to more than :data:`MAX_YAML_NODES` nodes (checked on the node graph,
    before anything is built)."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        def construct_document(self, node: yaml.Node) -> Any:
            expanded_size(node)
            return super().construct_document(node)

        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, int] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    line = key_node.start_mark.line + 1
                    if not isinstance(key, str):
                        raise FileRefused(f"key {key!r} is not a string (YAML 1.1 reads on, off, yes, no as "
                                          "booleans); valid: a string key (quote it: 'on':)", line)
                    if key in seen:
                        raise FileRefused(f"duplicate key {key!r} (first at line {seen[key]}); valid: each key "
                                          "once", line)
                    seen[key] = line
            return super().construct_mapping(node, deep=deep)

        def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
            digits = sum(ch.isdigit() for ch in str(node.value))
            if digits > MAX_DIGITS:
                raise FileRefused(f"a number of {digits} digits; valid: at most {MAX_DIGITS} digits",
                                  node.start_mark.line + 1)
            return super().construct_yaml_int(node)

    StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)
    return StrictLoader


def expanded_size(root: Any) -> int:
    """The number of nodes the YAML node graph ``root`` expands to (an alias counts as a copy of what it names);
    :class:`FileRefused` once it passes :data:`MAX_YAML_NODES`.  Each node is sized once (memoized), so the check
    itself stays linear in the file."""
    sizes: dict[int, int] = {}

    def size(node: Any) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        sizes[id(node)] = 1  # a recursive alias counts once
        children = node.value if isinstance(node.value, list) else []
        total = 1
        for child in children:
            total += sum(size(part) for part in child) if isinstance(child, tuple) else size(child)
            if total > MAX_YAML_NODES:
                break
        sizes[id(node)] = total
        if total > MAX_YAML_NODES:
            raise FileRefused(f"its aliases expand to more than {MAX_YAML_NODES:,} values (nested anchors, as in a "
                              '"billion laughs" file); valid: a config without nested aliases')
        return total

    return size(root)


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_DIGITS:
        raise FileRefused(f"a number of {len(digits.lstrip('-'))} digits; valid: at most {MAX_DIGITS} digits")
    return int(digits)


def read_mapping(path: str | Path, what: str, valid: str) -> dict[str, Any]:
    """The mapping a config or grid file holds: YAML for ``.yaml`` / ``.yml`` (:func:`_yaml_loader`: plain data,
    no Python objects, no duplicate or non-string keys, bounded alias expansion), JSON otherwise (duplicate keys
    refused too).  ``what`` names the file in errors (``--config c.yaml``), ``valid`` says what it must hold; an
    unreadable file, a syntax error or another kind of value raises ``ValueError`` in one line."""
    path = Path(path)
    kind = "YAML" if path.suffix.lower() in YAML_SUFFIXES else "JSON"
    if path.is_dir():
        raise ValueError(f"{what} is a directory; valid: a {kind} file with {valid}")
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ValueError(f"{what} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what} cannot be read ({exc})") from None
    try:
        data = _parse(text, kind, what, path)
    except FileRefused as exc:
        where = f" at line {exc.line}" if exc.line is not None else ""
        raise ValueError(f"{what} is refused{where}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what} holds a {kind} {_kind_name(data, kind)}; valid: a {kind} "
                         f"{'object' if kind == 'JSON' else 'mapping'} of {valid}")
    return data


def _parse(text: str, kind: str, what: str, path: Path) -> Any:
    if kind == "YAML":
        import yaml

        try:
            return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
            raise ValueError(f"{what} is not valid YAML ({problem}{where})") from None
        except RecursionError:
            raise ValueError(f"{what} is not valid YAML (nested too deeply)") from None
    try:
        return json.loads(text, parse_int=_bounded_int, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        hint = "; valid: JSON, or YAML in a file named .yaml / .yml" if path.suffix.lower() != ".json" else ""
        raise ValueError(f"{what} is not valid JSON ({exc.msg} at line {exc.lineno}){hint}") from None
    except RecursionError:
        raise ValueError(f"{what} is not valid JSON (nested too deeply)") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key given twice (json keeps the last one silently)."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise FileRefused(f"duplicate key {key!r}; valid: each key once")
        data[key] = value
    return data


def _kind_name(data: Any, kind: str) -> str:
    if kind == "JSON":
        return {list: "list", str: "string", int: "number", float: "number", bool: "boolean",
                type(None): "null"}.get(type(data), type(data).__name__)
    return {list: "list", str: "string", type(None): "empty document"}.get(type(data), type(data).__name__)


def overlong_limit(config: TrainConfig, world: World) -> int:
    """L_max of DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13): ``overlong_max_len``, or
    the world's ``max_response_len`` when it is unset."""
    return config.overlong_max_len if config.overlong_max_len is not None else world.max_response_len
