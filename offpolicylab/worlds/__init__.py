"""Worlds: softmax bandits, token-sequence MDPs small enough to enumerate, GSM8k (docs/design.md, "Worlds").

>>> from offpolicylab.worlds import make_world, list_worlds
>>> world = make_world("token_mdp", family="arithmetic", vocab_size="5", eos="true")   # CLI strings are fine

Importing this package registers the Gymnasium envs of :mod:`offpolicylab.worlds.gym_envs` under
``offpolicylab/``.  A new world plugs in with :func:`register_world` (name, builder, parameter specs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from offpolicylab.contracts import World
from offpolicylab.registry import MAX_SEED, Param, Registry
from offpolicylab.worlds.bandits import SoftmaxBandit, random_bandit, three_arm_pitfall
from offpolicylab.worlds.gym_envs import ENV_IDS, register_envs
from offpolicylab.worlds.synthetic_lm import RECIPE_PARAMS, SyntheticLM
from offpolicylab.worlds.synthetic_lm_presets import (
    DEFAULT_PRESET,
    EARLIER_DEFAULT_PRESET,
    PRESET_NAMES,
    build_synthetic_lm,
    preset_train_defaults,
)
from offpolicylab.worlds.token_mdp import CREDITS, FAMILIES, TokenMDP

WORLDS: Registry[World] = Registry("world", plugins="offpolicylab.worlds")
MAX_ARMS = 100_000  # a bandit's arms: its exact returns enumerate every arm (at most MAX_ENUMERATION)


def _build_bandit(rewards: tuple[float, ...] | None, behavior_probs: tuple[float, ...] | None, bernoulli: bool,
                  num_arms: int, seed: int) -> SoftmaxBandit:
    if rewards is None:
        world = random_bandit(num_arms, bernoulli=bernoulli, seed=seed)
        if behavior_probs is None:
            return world
        rewards = tuple(world.rewards.tolist())
    return SoftmaxBandit(rewards, bernoulli=bernoulli, behavior_probs=behavior_probs)


WORLDS.register(
    "bandit", _build_bandit,
    {
        "rewards": Param(None, list, optional=True, doc="comma-separated arm rewards (default: U[0,1] draws)"),
        "behavior_probs": Param(None, list, optional=True, doc="comma-separated behaviour policy π_b"),
        "bernoulli": Param(False, bool, doc="Bernoulli(r_a) rewards instead of fixed r_a"),
        "num_arms": Param(5, int, low=2, high=MAX_ARMS, doc="arms when rewards are drawn at random"),
        "seed": Param(0, int, low=0, high=MAX_SEED, doc="seed of the random rewards"),
    },
    doc="K-arm softmax bandit (T = 1)",
)
WORLDS.register("three_arm_pitfall", three_arm_pitfall, {},
                doc="REC's 3-arm pitfall: r = [0, 0.8, 1], π_b = [0.3, 0.6, 0.1]")
WORLDS.register(
    "token_mdp", TokenMDP,
    {
        "family": Param("target", str, choices=FAMILIES, doc="reward family"),
        "vocab_size": Param(4, int, low=2, doc="response vocabulary V (EOS included when eos)"),
        "length": Param(5, int, low=1, doc="maximum response length T (V^T <= 1e5)"),
        "num_prompts": Param(8, int, low=1, doc="number of distinct prompts (num_prompts × V^T <= 1e7)"),
        "eos": Param(False, bool, doc="last token id is EOS (variable-length responses)"),
        "credit": Param("partial", str, choices=CREDITS, doc="partial (per-token) or exact-match credit"),
        "num_forks": Param(2, int, low=1, doc="forking family: decision positions"),
        "filler_prob": Param(0.9, float, low=0.0, high=1.0, low_open=True, high_open=True,
                             doc="forking family: prior probability of each filler token"),
        "seed": Param(0, int, low=0, high=MAX_SEED, doc="world seed (prompts, targets)"),
    },
    doc="synthetic token-sequence MDP (target / arithmetic / forking)",
)

WORLDS.register(
    "synthetic_lm", build_synthetic_lm,
    {
        **RECIPE_PARAMS,
        "preset": Param(DEFAULT_PRESET, str, choices=PRESET_NAMES, recorded=True,
                        doc="named recipe: seed_scale_v7 (the default: recipe v6's world with an 8-layer π₀, a bf16 "
                            "trainer on cast weights and a bf16 sampler, logits + 12, old log-probs recomputed with "
                            "split-K GEMMs; lr 1.5e-5), seed_scale_v6 (recipe v6, a chain of forks with EOS; lr "
                            "1.5e-5), seed_scale (recipe v5, a reasoning LLM's token entropies; the default before "
                            "v7) or smollm2 (SmolLM2-135M's); under v6 / v7 a parameter at its default below means "
                            "the preset's value; the parameters below override it"),
        "num_rules": Param(1, int, low=1, doc="chain presets (seed_scale_v6, seed_scale_v7) only: step rules R, "
                                                "key k's chain follows rule k mod R (1: one rule for every key; at "
                                                "most num_keys)"),
        "cache_dir": Param(None, str, optional=True, doc="π₀ cache folder (default: the user cache folder)"),
    },
    doc="calibrated synthetic LM: random teacher, distilled transformer π₀, key -> digit reward (1/0.1/0)",
    train_defaults={"optimizer": "adamw", "lr": 3e-5, "advantage": "std", "grad_clip": 1.0,
                    "prompts_per_update": 8, "group_size": 8, "temperature": 1.0, "policy": "transformer"},
    param_train_defaults=preset_train_defaults,
    earlier_defaults={"preset": EARLIER_DEFAULT_PRESET},

)


def register_world(name: str, builder: Callable[..., World], params: dict[str, Param], doc: str = "",
                   train_defaults: dict[str, Any] | None = None) -> None:
    """Add a world (with the TrainConfig values it suggests, ``train_defaults``); a duplicate name raises
    ``ValueError``."""
    WORLDS.register(name, builder, params, doc, train_defaults=dict(train_defaults or {}))


def world_train_defaults(name: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """TrainConfig values a world suggests (e.g. AdamW and its learning rate) for fields a config leaves unset, with
    those its parameters ``params`` suggest over them (``synthetic_lm``: the preset's learning rate); empty for
    worlds without any (and for unknown names, which :func:`make_world` reports)."""
    if name not in WORLDS:
        return {}
    meta = WORLDS.get(name).meta
    of_params = meta.get("param_train_defaults")
    return {**meta.get("train_defaults", {}), **(of_params(dict(params or {})) if of_params else {})}


def world_earlier_defaults(name: str) -> dict[str, Any]:
    """{parameter: the default it had before its current one} for a world's parameters whose default has changed
    (a stored run's configuration that leaves one out ran with that value); empty for other worlds."""
    return dict(WORLDS.get(name).meta.get("earlier_defaults", {})) if name in WORLDS else {}


def list_worlds() -> list[str]:
    """World names :func:`make_world` accepts."""
    return WORLDS.names()


def make_world(name: str, **params: Any) -> World:
    """Build world ``name`` with ``params`` (values may be CLI strings).  Unknown world / parameter or a bad value
    raises ``ValueError`` naming what is valid."""
    return WORLDS.build(name, **params)


register_envs()


def _register_gsm8k() -> None:
    """GSM8k with a Hugging Face causal LM (transformers is imported only when the world is built)."""
    from offpolicylab.worlds.gsm8k import build_gsm8k_world, gsm8k_params

    register_world("gsm8k", build_gsm8k_world, gsm8k_params(), doc="GSM8k with a Hugging Face causal LM (llm extra)")


_register_gsm8k()

__all__ = [
    "ENV_IDS",
    "WORLDS",
    "SoftmaxBandit",
    "SyntheticLM",
    "TokenMDP",
    "list_worlds",
    "make_world",
    "register_world",
    "three_arm_pitfall",
    "world_earlier_defaults",
    "world_train_defaults",
]
