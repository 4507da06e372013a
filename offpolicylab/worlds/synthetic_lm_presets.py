"""The ``synthetic_lm`` world's presets and its builder: recipe v5's :data:`~offpolicylab.worlds.synthetic_lm.PRESETS`
(:mod:`offpolicylab.worlds.synthetic_lm`) and recipe v6's chain world (:mod:`offpolicylab.worlds.synthetic_lm_v6`),
which builds on v5's parts.  It sits above both, so neither recipe's module imports the other's builder."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from offpolicylab.worlds.synthetic_lm import PRESETS, Recipe, SyntheticLM
from offpolicylab.worlds.synthetic_lm_v6 import CHAIN_PRESETS, ChainLM, build_chain

PRESET_NAMES = (*PRESETS, *CHAIN_PRESETS)
"""Every preset the world accepts: v5's :data:`~offpolicylab.worlds.synthetic_lm.PRESETS` and v6's
:data:`~offpolicylab.worlds.synthetic_lm_v6.CHAIN_PRESETS`."""

DEFAULT_PRESET = "seed_scale_v7"
"""The preset a run that names none gets: recipe v7, whose calibration (docs/synthetic_lm_v7.md) met the M2PO paper's
clip windows at staleness 0 and 256."""

EARLIER_DEFAULT_PRESET = "seed_scale"
"""The default preset before v7 (recipe v5): a stored run whose configuration names no preset ran it."""

PRESET_TRAIN_DEFAULTS: dict[str, dict[str, Any]] = {"seed_scale_v6": {"lr": 1.5e-5}, "seed_scale_v7": {"lr": 1.5e-5}}
"""Training settings a preset suggests over the world's own (a run's explicit value wins): the learning rate each
chain recipe's calibration chose (v6: the stale clip window decided 1.5e-5, docs/synthetic_lm_v6.md; v7 kept it)."""


def preset_train_defaults(world_params: dict[str, Any]) -> dict[str, Any]:
    """The training settings :data:`PRESET_TRAIN_DEFAULTS` suggests for the preset ``world_params`` names (the
    default preset when none); empty for a preset without any or an unknown one (the world's build refuses it)."""
    return dict(PRESET_TRAIN_DEFAULTS.get(str(world_params.get("preset", DEFAULT_PRESET)), {}))


def build_synthetic_lm(preset: str = DEFAULT_PRESET, cache_dir: str | None = None,
                       **recipe: Any) -> SyntheticLM | ChainLM:
    """The ``synthetic_lm`` world for ``worlds.make_world``: the named :data:`PRESETS` recipe with the given recipe
    fields (keyword arguments; a ``None`` value keeps the preset's); a v6 preset builds recipe v6's chain world
    (:func:`offpolicylab.worlds.synthetic_lm_v6.build_chain`)."""
    if preset not in PRESET_NAMES:
        raise ValueError(f"preset={preset!r} is unknown; valid: {', '.join(PRESET_NAMES)}")
    if preset not in PRESETS:
        defaults = {name: getattr(Recipe, name) for name in recipe if hasattr(Recipe, name)}
        return build_chain(preset, cache_dir, recipe, defaults)
    rules = recipe.pop("num_rules", 1)
    if rules != 1:
        raise ValueError(f"num_rules={rules!r} is a parameter of the chain presets only; valid: leave it unset with "
                         f"preset {preset!r}, or choose one of {', '.join(CHAIN_PRESETS)}")
    given = {k: v for k, v in recipe.items() if v is not None}
    return SyntheticLM(replace(PRESETS[preset], **given), cache_dir=cache_dir)
