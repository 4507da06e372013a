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


def build_synthetic_lm(preset: str = "seed_scale", cache_dir: str | None = None,
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
