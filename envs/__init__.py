"""Worlds: softmax bandits, token-sequence MDPs small enough to enumerate, a calibrated synthetic LM, GSM8k.

>>> from envs import make_task, list_tasks
>>> task = make_task("token_mdp", family="arithmetic", vocab_size="5", eos="true")   # CLI strings are fine

Importing this package registers the Gymnasium envs of :mod:`envs.gym_envs` under ``offpolicylab/``.
A new world (e.g. ``gsm8k``) plugs in with :func:`register_task` (name, builder, parameter specs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from envs.bandits import SoftmaxBandit, random_bandit, three_arm_pitfall
from envs.gym_envs import ENV_IDS, register_envs
from envs.synthetic_lm import Recipe, SyntheticLM, build_synthetic_lm
from envs.token_mdp import CREDITS, FAMILIES, TokenMDP
from offpolicylab.objectives.base import Param


def _float_list(value: Any) -> tuple[float, ...] | None:
    """``"0,0.8,1"`` / ``[0, 0.8, 1]`` → (0.0, 0.8, 1.0); None / "none" → None."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        return None
    if isinstance(value, str):
        value = [v for v in value.strip("[]() ").split(",") if v.strip()]
    return tuple(float(v) for v in value)


@dataclass(frozen=True)
class WorldSpec:
    """A world: its builder and parameter specs (scalars as :class:`Param`, lists in ``list_params``)."""

    builder: Callable[..., Any]
    params: dict[str, Param]
    list_params: tuple[str, ...] = ()
    doc: str = ""
    train_defaults: dict[str, Any] = field(default_factory=dict)  # TrainConfig fields this world defaults


def _build_bandit(rewards: tuple[float, ...] | None, behavior_probs: tuple[float, ...] | None, bernoulli: bool,
                  num_arms: int, seed: int) -> SoftmaxBandit:
    if rewards is None:
        task = random_bandit(num_arms, bernoulli=bernoulli, seed=seed)
        if behavior_probs is None:
            return task
        rewards = tuple(task.rewards.tolist())
    return SoftmaxBandit(rewards, bernoulli=bernoulli, behavior_probs=behavior_probs)


_WORLDS: dict[str, WorldSpec] = {
    "bandit": WorldSpec(
        _build_bandit,
        {
            "rewards": Param(None, str, optional=True, doc="comma-separated arm rewards (default: U[0,1] draws)"),
            "behavior_probs": Param(None, str, optional=True, doc="comma-separated behaviour policy π_b"),
            "bernoulli": Param(False, bool, doc="Bernoulli(r_a) rewards instead of fixed r_a"),
            "num_arms": Param(5, int, low=2, doc="arms when rewards are drawn at random"),
            "seed": Param(0, int, doc="seed of the random rewards"),
        },
        list_params=("rewards", "behavior_probs"),
        doc="K-arm softmax bandit (T = 1)",
    ),
    "three_arm_pitfall": WorldSpec(three_arm_pitfall, {}, doc="REC's 3-arm pitfall: r = [0, 0.8, 1], π_b = [0.3, 0.6, 0.1]"),
    "token_mdp": WorldSpec(
        TokenMDP,
        {
            "family": Param("target", str, choices=FAMILIES, doc="reward family"),
            "vocab_size": Param(4, int, low=2, doc="response vocabulary V (EOS included when eos)"),
            "length": Param(5, int, low=1, doc="maximum response length T (V^T <= 1e5)"),
            "num_prompts": Param(8, int, low=1, doc="number of distinct prompts"),
            "eos": Param(False, bool, doc="last token id is EOS (variable-length responses)"),
            "credit": Param("partial", str, choices=CREDITS, doc="partial (per-token) or exact-match credit"),
            "num_forks": Param(2, int, low=1, doc="forking family: decision positions"),
            "filler_prob": Param(0.9, float, low=0.0, high=1.0, low_open=True, high_open=True,
                                 doc="forking family: prior probability of each filler token"),
            "seed": Param(0, int, doc="world seed (prompts, targets)"),
        },
        doc="synthetic token-sequence MDP (target / arithmetic / forking)",
    ),
    "synthetic_lm": WorldSpec(
        build_synthetic_lm,
        {
            "num_keys": Param(Recipe.num_keys, int, low=1, doc="keys k (one evaluation prompt each; the reward asks "
                                                               "for a hidden digit table[k])"),
            "num_train_prompts": Param(Recipe.num_train_prompts, int, low=1, doc="fixed training prompts"),
            "response_len": Param(Recipe.response_len, int, low=3, doc="response length T (ANS at T-2, digit at T-1)"),
            "vocab_size": Param(Recipe.vocab_size, int, low=16, doc="vocabulary V (10 digits, ANS, text)"),
            "alpha": Param(Recipe.alpha, float, low=0.0, low_open=True,
                           doc="teacher sharpness: more near-deterministic positions as it grows"),
            "delta": Param(Recipe.delta, float, low=0.0, high=1.0, high_open=True,
                           doc="teacher tail share: weight of the broad softmax in p_T"),
            "sharpness_spread": Param(Recipe.sharpness_spread, float, low=0.0,
                                      doc="gamma: spread of the per-position sharpness exp(gamma u.h)"),
            "ans_prob": Param(Recipe.ans_prob, float, low=0.0, high=1.0, low_open=True,
                              doc="teacher probability of ANS at position T-2"),
            "digit_scale": Param(Recipe.digit_scale, float, low=0.0, doc="teacher digit logits: context part scale"),
            "key_scale": Param(Recipe.key_scale, float, low=0.0, doc="teacher digit logits: key part scale"),
            "d_model": Param(Recipe.d_model, int, low=1, doc="pi0 transformer width"),
            "num_layers": Param(Recipe.num_layers, int, low=1, doc="pi0 transformer layers"),
            "num_heads": Param(Recipe.num_heads, int, low=1, doc="pi0 attention heads"),
            "distill_steps": Param(Recipe.distill_steps, int, low=0, doc="pi0 distillation steps"),
            "distill_batch": Param(Recipe.distill_batch, int, low=1, doc="teacher sequences per distillation step"),
            "seed": Param(Recipe.seed, int, low=0, doc="world seed (teacher, prompts, table, pi0)"),
            "cache_dir": Param(None, str, optional=True, doc="pi0 cache folder (default: the user cache folder)"),
        },
        doc="calibrated synthetic LM: random teacher, distilled transformer pi0, key -> digit reward (1/0.1/0)",
        train_defaults={"optimizer": "adamw", "lr": 1.5e-3, "advantage": "std", "grad_clip": 1.0,
                        "prompts_per_update": 8, "group_size": 8, "temperature": 1.0, "policy": "transformer"},
    ),
}


def register_task(name: str, builder: Callable[..., Any], params: dict[str, Param], doc: str = "",
                  list_params: tuple[str, ...] = ()) -> None:
    """Add a world (e.g. ``gsm8k`` from the LLM backend); a duplicate name raises ``ValueError``."""
    if name in _WORLDS:
        raise ValueError(f"world {name!r} is already registered")
    _WORLDS[name] = WorldSpec(builder, params, list_params, doc)


def list_tasks() -> list[str]:
    """World names :func:`make_task` accepts."""
    return list(_WORLDS)


def task_params(name: str) -> dict[str, Param]:
    """Parameter specs of a world (for ``offpolicylab list``)."""
    if name not in _WORLDS:
        raise ValueError(f"unknown world {name!r}; valid: {', '.join(_WORLDS)}")
    return dict(_WORLDS[name].params)


def world_train_defaults(name: str) -> dict[str, Any]:
    """TrainConfig values a world suggests (e.g. AdamW and its learning rate) for fields a config leaves unset;
    empty for worlds without any (and for unknown names, which :func:`make_task` reports)."""
    spec = _WORLDS.get(name)
    return dict(spec.train_defaults) if spec is not None else {}


def make_task(name: str, **params: Any) -> Any:
    """Build world ``name`` with ``params`` (values may be CLI strings).  Unknown world / parameter or a bad value
    raises ``ValueError`` naming what is valid."""
    if name not in _WORLDS:
        raise ValueError(f"unknown world {name!r}; valid: {', '.join(_WORLDS)}")
    spec = _WORLDS[name]
    unknown = sorted(set(params) - set(spec.params))
    if unknown:
        raise ValueError(f"world {name!r} has no parameter {', '.join(unknown)}; "
                         f"valid: {', '.join(spec.params) or 'none'}")
    config: dict[str, Any] = {}
    for key, param in spec.params.items():
        value = params.get(key, param.default)
        if key in spec.list_params:
            try:
                config[key] = _float_list(value)
            except (TypeError, ValueError):
                raise ValueError(f"parameter {key}={value!r} is invalid; valid: comma-separated numbers") from None
        else:
            config[key] = param.validate(key, value)
    return spec.builder(**config)


register_envs()


def _register_gsm8k() -> None:
    """GSM8k with a Hugging Face causal LM (transformers is imported only when the world is built)."""
    from envs.gsm8k import build_gsm8k_task, gsm8k_params

    register_task("gsm8k", build_gsm8k_task, gsm8k_params(), doc="GSM8k with a Hugging Face causal LM (llm extra)")


_register_gsm8k()

__all__ = [
    "ENV_IDS",
    "SoftmaxBandit",
    "SyntheticLM",
    "TokenMDP",
    "list_tasks",
    "make_task",
    "register_task",
    "task_params",
    "three_arm_pitfall",
    "world_train_defaults",
]
