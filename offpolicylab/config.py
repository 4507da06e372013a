"""The resolved configuration of one training run; each field's ``help`` metadata is its command-line help.

>>> cfg = TrainConfig(world="token_mdp", objective="m2po", schedule="stale_k:16")
>>> cfg.to_dict()["schedule"]
'stale_k:16'
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any

OPTIMIZERS = ("adam", "adamw", "sgd")
ADVANTAGE_CHOICES = ("auto", "mean", "std")
KL_INIT_MODES = ("auto", "on", "off")
MAX_SEED = 2**32 - 1  # torch, NumPy and the evaluation seed (seed × 1_000_003 + update) all take it exactly

# Fields whose default depends on the policy: None in a TrainConfig means "the policy's default".
DEFAULTS: dict[str, Any] = {"lr": 0.05, "eval_samples": 4}
# LoRA on a pretrained LM: lr 1e-4, the order LoRA fine-tuning uses (Hu et al. 2021, arXiv:2106.09685: 2e-4 for
# GPT-2; Dettmers et al. 2023, QLoRA, arXiv:2305.14314: 2e-4 up to 13B, 1e-4 above) and the low end of that range
# because an RL step on stale data must keep the ratio π/π_b near 1; the toy worlds' 0.05 made ratio_max 53 in one
# Adam step on SmolLM2.  One sampled response per evaluation question (plus the greedy one) keeps an evaluation
# about the cost of one update.
POLICY_DEFAULTS: dict[str, dict[str, Any]] = {"hf": {"lr": 1e-4, "eval_samples": 1}}


def _f(default: Any, help: str, **kw: Any) -> Any:
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class TrainConfig:
    """Everything that determines a run (with ``seed``, the run is reproducible bit for bit on one machine)."""

    world: str = _f("token_mdp", "world (task) name, see `offpolicylab list`")
    world_params: dict[str, Any] = _f({}, "world options (--world-param k=v)")
    objective: str = _f("grpo", "objective name, see `offpolicylab list`")
    objective_params: dict[str, Any] = _f({}, "objective parameters (--param k=v)")
    policy: str = _f("tabular", "policy kind (tabular, sequence_model, ...)")
    policy_params: dict[str, Any] = _f({}, "policy options (--policy-param k=v)")
    schedule: str = _f("on_policy", "staleness schedule: on_policy, stale_k:K, sync:M,N, stages:MU, epochs:E, "
                                    "offline, offline:D, mixture:P")
    updates: int = _f(200, "number of optimizer updates")
    prompts_per_update: int = _f(8, "prompts per generated batch")
    group_size: int = _f(8, "responses per prompt (GRPO group size G)")
    temperature: float = _f(1.0, "sampling temperature (behavior_logp is recorded at this temperature)")
    advantage: str = _f("auto", "group-relative advantage estimator: auto (the objective's paper: std for GRPO, "
                                "GSPO, CISPO, M2PO, MIS-PO, P3O, Mu-GRPO; mean for REINFORCE, REC, OPMD, AsymRE, RED, "
                                "TOPR), mean (r − r̄) or std ((r − r̄)/(σ + 1e-6)); config.json records the one used")
    recompute_behavior_logp: bool = _f(False, "score each generated batch with the training forward (no grad) and "
                                              "use that as behavior_logp (verl's recompute of old_log_prob); the "
                                              "sampler's numbers are kept as sampler_logp, so log_ratio measures "
                                              "staleness alone and sampler_log_ratio the numeric mismatch")
    optimizer: str = _f("adam", "optimizer: adam, adamw or sgd")
    lr: float | None = _f(None, "learning rate (none: the policy's default, POLICY_DEFAULTS: 0.05 for the toy "
                                "policies, 1e-4 for the LoRA policy hf)")
    grad_clip: float = _f(1.0, "max global gradient norm (inf = no clipping)")
    seed: int = _f(0, "random seed (policy init, prompts, sampling, rewards)")
    eval_every: int = _f(10, "evaluate greedy / sampled reward (and exact return where enumerable) every N updates")
    eval_samples: int | None = _f(None, "sampled responses per evaluation prompt (none: the policy's default, 4 "
                                        "for the toy policies, 1 for hf)")
    eval_kl_init: str = _f("auto", "sampled KL(π‖π_0) on the evaluation samples (k1, k3 per token; keeps a frozen "
                                   "copy of π_0): auto = on except for the hf policy, on, off")
    sample_every: int = _f(25, "write ratio/entropy samples for histograms every N updates (0 = never)")
    checkpoint_every: int = _f(50, "write the checkpoint every N updates and after the last (a resumed run replays "
                                   "at most N-1 updates from it and ends identical; each write costs ~5-10 ms)")
    fsync: bool = _f(False, "fsync metrics and checkpoint at each checkpoint (survives OS crashes; checkpoints "
                            "are atomic against a killed process either way)")
    collapse_margin: float = _f(0.2, "collapse: the current policy's smoothed reward falls this far below its "
                                      "running peak ...")
    collapse_spike: float = _f(5.0, "... within `collapse_window` updates of a KL or grad-norm spike "
                                    "(value > this factor × its running mean)")
    collapse_window: int = _f(20, "updates a spike stays relevant to the collapse test")
    stop_on_collapse: bool = _f(False, "stop the run at the first detected collapse (a non-finite loss always stops)")

    def with_defaults(self) -> tuple[TrainConfig, dict[str, Any]]:
        """(a copy with every unset field filled from :data:`POLICY_DEFAULTS` for ``policy``, the filled values)."""
        defaults = {**DEFAULTS, **POLICY_DEFAULTS.get(self.policy, {})}
        filled = {name: value for name, value in defaults.items() if getattr(self, name) is None}
        return replace(self, **filled), filled

    def __post_init__(self) -> None:
        self.validate_scalars()

    def validate_scalars(self) -> None:
        """Range checks of the scalar fields; raises ``ValueError`` naming the field and its valid range."""
        positive_ints = ("updates", "prompts_per_update", "group_size", "eval_every", "eval_samples",
                         "checkpoint_every", "collapse_window")
        for f in fields(self):  # a JSON config file must not pass a number for a boolean (or the reverse)
            value = getattr(self, f.name)
            if f.type == "str" and not isinstance(value, str):
                raise ValueError(f"{f.name}={value!r} is invalid; valid: a name (a string), see `offpolicylab list`")
            if f.type == "bool" and not isinstance(value, bool):
                raise ValueError(f"{f.name}={value!r} is invalid; valid: true or false")
            if scalar_kind(f.type) == "float" and isinstance(value, bool):
                raise ValueError(f"{f.name}={value!r} is invalid; valid: a number")
        for name in positive_ints:
            if not (name in DEFAULTS and getattr(self, name) is None):
                _check_int(name, getattr(self, name), 1)
        if self.group_size < 2:
            raise ValueError(f"group_size={self.group_size} is invalid: a group of one response has group-relative "
                             "advantage A = r − mean(r) = 0 for every response, so nothing would be learned; "
                             "valid: an integer >= 2")
        _check_int("sample_every", self.sample_every, 0)
        _check_int("seed", self.seed, 0)
        if self.seed > MAX_SEED:
            raise ValueError(f"seed={self.seed} is invalid; valid: an integer in 0..{MAX_SEED}")
        for name in ("temperature", "lr"):
            value = getattr(self, name)
            if name in DEFAULTS and value is None:
                continue
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}={value!r} is invalid; valid: a finite number > 0")
        if not (isinstance(self.grad_clip, (int, float)) and self.grad_clip > 0):
            raise ValueError(f"grad_clip={self.grad_clip!r} is invalid; valid: a number > 0 (inf = no clipping)")
        if self.advantage not in ADVANTAGE_CHOICES:
            raise ValueError(f"unknown advantage {self.advantage!r}; valid: {', '.join(ADVANTAGE_CHOICES)}")
        if self.eval_kl_init not in KL_INIT_MODES:
            raise ValueError(f"eval_kl_init={self.eval_kl_init!r} is invalid; valid: {', '.join(KL_INIT_MODES)}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
        for name in ("collapse_margin", "collapse_spike"):
            if not (isinstance(getattr(self, name), (int, float)) and getattr(self, name) > 0):
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid; valid: a number > 0")
        for name in ("world_params", "objective_params", "policy_params"):
            if not isinstance(getattr(self, name), dict):
                raise ValueError(f"{name} must be a mapping of name -> value")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Build from a mapping; unknown keys raise ``ValueError`` naming the valid ones.  Fields the mapping
        leaves out take the world's suggested values (``envs.world_train_defaults``), then the dataclass defaults."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ValueError(f"unknown config key(s) {', '.join(unknown)}; valid: {', '.join(names)}")
        # imported here: the worlds package (torch, gymnasium) is heavy and this module is imported by every tool
        from envs import world_train_defaults

        values = {**world_train_defaults(str(data.get("world", cls.world))), **data}
        for f in fields(cls):  # coerce CLI-ish strings of scalar fields
            kind = scalar_kind(f.type)
            if f.name in values and isinstance(values[f.name], str) and kind in ("int", "float", "bool"):
                values[f.name] = _coerce_field(f.name, kind, values[f.name])
        return cls(**values)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)


def field_help() -> dict[str, tuple[Any, str]]:
    """{field name: (default, help text)} — the CLI's help comes from here."""
    out = {}
    for f in fields(TrainConfig):
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        out[f.name] = (default, f.metadata.get("help", ""))
    return out


def scalar_kind(annotation: Any) -> str:
    """A field's type annotation (a string under postponed evaluation) without ``| None``: ``"float | None"`` →
    ``"float"``."""
    return str(annotation).removesuffix(" | None")


def parse_value(text: str) -> Any:
    """A command-line value: JSON (numbers, true/false, null, lists) if it parses, then float ('inf'), else str.

    ``none`` stays the string ``"none"``: it is a valid choice of string parameters (``nav_scope=none``), and
    optional parameters read ``"none"`` as "not set" themselves."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, ValueError):
        pass
    lowered = text.strip().lower()
    try:
        return float(lowered)
    except ValueError:
        return text


def parse_assignments(items: list[str] | None, what: str) -> dict[str, Any]:
    """``["k=v", ...]`` → ``{k: parse_value(v)}``; a malformed item raises ``ValueError``."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{what} {item!r} is malformed; valid: name=value")
        out[key.strip()] = parse_value(value)
    return out


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} is invalid; valid: an integer >= {minimum}")


def _coerce_field(name: str, kind: str, text: str) -> Any:
    value = parse_value(text)
    if kind == "int" and isinstance(value, float) and value.is_integer():
        return int(value)
    if kind == "bool" and not isinstance(value, bool):
        raise ValueError(f"{name}={text!r} is invalid; valid: true or false")
    return value
