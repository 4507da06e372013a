"""The configuration of one training run: every field is declared by a :class:`~offpolicylab.registry.Param`
(default, kind, range, command-line help).

>>> cfg = TrainConfig(world="token_mdp", objective="m2po", schedule="stale_k:16")
>>> cfg.to_dict()["schedule"]
'stale_k:16'
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from offpolicylab.registry import Param

OPTIMIZERS = ("adam", "adamw", "sgd")
ADVANTAGE_CHOICES = ("auto", "mean", "std")
KL_INIT_MODES = ("auto", "on", "off")
MAX_SEED = 2**32 - 1  # torch, NumPy and the evaluation seed (seed × 1_000_003 + update) all take it exactly
MIN_TEMPERATURE = 1e-6  # logits / T stay finite in float32 for |logits| up to about 1e32
_POSITIVE = {"low": 0.0, "low_open": True, "high": math.inf, "high_open": True}  # a finite number > 0

# Fields whose default depends on the policy: None in a TrainConfig means "the policy's default".
DEFAULTS: dict[str, Any] = {"lr": 0.05, "eval_samples": 4}
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
    policy: str = _f(Param("tabular", str, doc="policy kind (tabular, sequence_model, transformer, hf; `offpolicylab list`)"))
    policy_params: dict[str, Any] = _f(Param({}, dict, doc="policy options (--policy-param k=v)"))
    schedule: str = _f(Param("on_policy", str, doc="staleness schedule: on_policy, stale_k:K, sync:M,N, stages:MU, "
                                                   "epochs:E, offline, offline:D, mixture:P"))
    updates: int = _f(Param(200, int, low=1, doc="number of optimizer updates"))
    prompts_per_update: int = _f(Param(8, int, low=1, doc="prompts per generated batch"))
    group_size: int = _f(Param(8, int, low=2, doc="responses per prompt (GRPO group size G; a group of one response "
                                                  "has advantage 0, so G >= 2)"))
    temperature: float = _f(Param(1.0, float, low=MIN_TEMPERATURE, high=math.inf, high_open=True,
                                  doc="sampling temperature (behavior_logp is recorded at this temperature; below "
                                      "1e-6 logits / T overflow float32)"))
    advantage: str = _f(Param("auto", str, choices=ADVANTAGE_CHOICES,
                              doc="group-relative advantage estimator: auto (the objective's paper: std for GRPO, "
                                  "GSPO, CISPO, M2PO, MIS-PO, P3O, Mu-GRPO; mean for REINFORCE, REC, OPMD, AsymRE, "
                                  "RED, TOPR), mean (r − r̄) or std ((r − r̄)/(σ + 1e-6)); config.json records the "
                                  "one used"))
    recompute_behavior_logp: bool = _f(Param(False, bool, doc="score each generated batch with the training forward "
                                                              "(no grad) and use that as behavior_logp (verl's "
                                                              "recompute of old_log_prob); the sampler's numbers are "
                                                              "kept as sampler_logp, so log_ratio measures staleness "
                                                              "alone and sampler_log_ratio the numeric mismatch"))
    optimizer: str = _f(Param("adam", str, choices=OPTIMIZERS, doc="optimizer"))
    lr: float | None = _f(Param(None, float, **_POSITIVE, optional=True,
                                doc="learning rate (none: the policy's default, POLICY_DEFAULTS: 0.05 for the toy "
                                    "policies, 1e-4 for the LoRA policy hf)"))
    grad_clip: float = _f(Param(1.0, float, low=0.0, low_open=True,
                                doc="max global gradient norm (inf = no clipping)"))
    seed: int = _f(Param(0, int, low=0, high=MAX_SEED, doc="random seed (policy init, prompts, sampling, rewards)"))
    eval_every: int = _f(Param(10, int, low=1, doc="evaluate greedy / sampled reward (and exact return where "
                                                   "enumerable) every N updates"))
    metrics_every: int = _f(Param(1, int, low=1, doc="compute the objective's metrics (ratio statistics, KL, ESS, "
                                                     "clip fractions) every N updates and at the last; the loss "
                                                     "and gradient are the same either way"))
    eval_samples: int | None = _f(Param(None, int, low=1, optional=True,
                                        doc="sampled responses per evaluation prompt (none: the policy's default, 4 "
                                            "for the toy policies, 1 for hf)"))
    eval_kl_init: str = _f(Param("auto", str, choices=KL_INIT_MODES,
                                 doc="sampled KL(π‖π_0) on the evaluation samples (k1, k3 per token; keeps a frozen "
                                     "copy of π_0): auto = on except for the hf policy, on, off"))
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

    def with_defaults(self) -> tuple[TrainConfig, dict[str, Any]]:
        """(a copy with every unset field filled from :data:`POLICY_DEFAULTS` for ``policy``, the filled values)."""
        defaults = {**DEFAULTS, **POLICY_DEFAULTS.get(self.policy, {})}
        filled = {name: value for name, value in defaults.items() if getattr(self, name) is None}
        return replace(self, **filled), filled

    def __setattr__(self, name: str, value: Any) -> None:
        """Every field goes through its :class:`Param` when it is set (at construction and after): strings are
        parsed, ranges checked, ``ValueError`` names the field and what is valid."""
        param = _PARAMS.get(name)
        super().__setattr__(name, value if param is None else param.validate(name, value))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Build from a mapping (values may be strings); unknown keys raise ``ValueError`` naming the valid ones.
        Fields the mapping leaves out take the world's suggested values
        (:func:`offpolicylab.worlds.world_train_defaults`), then the dataclass defaults."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ValueError(f"unknown config key(s) {', '.join(unknown)}; valid: {', '.join(names)}")
        # imported here: the worlds package (torch, gymnasium) is heavy and this module is imported by every tool
        from offpolicylab.worlds import world_train_defaults

        return cls(**{**world_train_defaults(str(data.get("world", cls.world))), **data})


_PARAMS: dict[str, Param] = {f.name: f.metadata["param"] for f in fields(TrainConfig)}


def config_params() -> dict[str, Param]:
    """{field name: its :class:`Param`} — the CLI's flags and help come from here."""
    return dict(_PARAMS)


def parse_assignments(items: list[str] | None, what: str) -> dict[str, str]:
    """``["k=v", ...]`` → ``{k: "v"}`` (the values stay strings: the part's :class:`Param` parses them); a
    malformed item raises ``ValueError``."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{what} {item!r} is malformed; valid: name=value")
        out[key.strip()] = value
    return out
