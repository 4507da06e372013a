"""Every engine's training–inference mismatch correction on one contract (docs/corrections.md).

``apply(engine, logp, sampler_logp, mask, **engine_params) -> (weights, keep)``: ``logp`` the trainer's
log-probs of the sampled tokens, ``sampler_logp`` the sampling engine's, ``mask`` the response mask, all [B, T];
``weights`` [B, T] the importance weight the engine multiplies its per-token loss by (0 on padding), ``keep`` [B, T]
the mask after the engine's rejection.  Parameters carry the engine's own names and defaults, so a config can be
pasted:

>>> import torch
>>> from offpolicylab import corrections
>>> logp = torch.tensor([[-1.0, -2.0, 0.0]]); sampler = torch.tensor([[-1.5, -1.0, 0.0]])
>>> mask = torch.tensor([[1.0, 1.0, 0.0]])
>>> weights, keep = corrections.apply("verl", logp, sampler, mask, rollout_is="token", rollout_is_threshold=2.0,
...                                   rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0")
>>> weights
tensor([[1.6487, 0.3679, 0.0000]])
>>> keep
tensor([[1., 0., 0.]])

Corrections that read the advantages (TRL's ``off_policy_mask_threshold``, slime's ``use_opsm``) take them as
``advantages=`` ([B] or [B, T]); those that compare with the current policy take ``current_logp=`` (default ``logp``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from offpolicylab.corrections import areal, openrlhf, skyrl, slime, trl, verl
from offpolicylab.corrections.base import Engine, Result, check_shapes
from offpolicylab.registry import assign

#: The engines, by the name ``apply`` takes.
ENGINES: dict[str, Engine] = {module.ENGINE.name: module.ENGINE for module in (verl, trl, openrlhf, slime, skyrl,
                                                                                areal)}


def engine(name: str) -> Engine:
    """The engine called ``name``; an unknown one raises ``ValueError`` naming the valid ones."""
    try:
        return ENGINES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown correction engine {name!r}; valid: {', '.join(ENGINES)} (a correction is "
                         "engine:key=value:...)") from None


def apply(engine_name: str, logp: Tensor, sampler_logp: Tensor, mask: Tensor, *, advantages: Tensor | None = None,
          current_logp: Tensor | None = None, **engine_params: Any) -> Result:
    """(weights, keep) = the correction of ``engine_name`` configured by ``engine_params`` (its own names,
    defaults filled in), on log r_t = logp_t − sampler_logp_t; see each engine module for its formula and source.
    Unknown engines or parameters raise ``ValueError`` naming the valid ones."""
    spec = engine(engine_name)
    params = spec.resolve(engine_params)
    check_shapes(logp, sampler_logp, mask)
    return spec.fn(logp.detach(), sampler_logp.detach(), mask, advantages=advantages, current_logp=current_logp,
                   **params)


@dataclass(frozen=True)
class Correction:
    """A configured correction: ``Correction.from_config({"engine": "verl", "rollout_is": "sequence"})``, called
    as ``correction(logp, sampler_logp, mask, advantages=..., current_logp=...)``."""

    engine: str
    params: Mapping[str, Any]

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | str) -> Correction:
        """From a mapping with an ``engine`` key (YAML / JSON config) or a spec string (:func:`parse_spec`);
        parameters are validated now."""
        if isinstance(config, str):
            try:
                config = correction(config)
            except ValueError as exc:
                raise ValueError(f"correction {config!r} is invalid ({exc}); valid: {SPEC_FORM}") from None
        if not isinstance(config, Mapping) or "engine" not in config:
            raise ValueError(f"correction {config!r} is invalid; valid: {SPEC_FORM}")
        params = {key: value for key, value in config.items() if key != "engine"}
        engine(config["engine"]).resolve(params)
        return cls(config["engine"], params)

    def __call__(self, logp: Tensor, sampler_logp: Tensor, mask: Tensor, *, advantages: Tensor | None = None,
                 current_logp: Tensor | None = None) -> Result:
        return apply(self.engine, logp, sampler_logp, mask, advantages=advantages, current_logp=current_logp,
                     **self.params)

    def label(self) -> str:
        """The spec string that builds this correction back."""
        return ":".join([self.engine] + [f"{key}={value}" for key, value in self.params.items()])


def correction(value: Mapping[str, Any] | str) -> dict[str, Any]:
    """A correction setting as a plain mapping ``{"engine": ..., <engine params>}``, from a mapping (YAML / JSON:
    ``correction: {engine: verl, rollout_is: sequence}``) or a spec string (command line:
    ``--param correction=verl:rollout_is=sequence``): the kind of the objectives' ``correction`` parameter.  Only
    the shape is checked here; :meth:`Correction.from_config` checks the engine and its parameters."""
    if isinstance(value, str):
        name, *pairs = [part.strip() for part in value.strip().split(":")]
        parsed: dict[str, Any] = {"engine": name}
        for pair in pairs:
            assign(parsed, pair, f"{pair!r} is not key=value", strip=True)
        return parsed
    if not isinstance(value, Mapping) or "engine" not in value:
        raise TypeError(value)
    return dict(value)


#: What a correction setting looks like, for error messages (:class:`~offpolicylab.registry.Param` reads it).
SPEC_FORM = (f"engine:key=value:... (engine one of {', '.join(ENGINES)}; docs/corrections.md) or a mapping "
             "with an 'engine' key")
correction.description = SPEC_FORM  # type: ignore[attr-defined]


def parse_spec(text: str) -> Correction:
    """``"engine:key=value:key=value"`` → :class:`Correction` (values may hold commas and underscores, as verl's
    ``rollout_rs=token_k1,seq_mean_k3``; they are parsed by the engine's parameter kinds)."""
    return Correction.from_config(text)


def parse_specs(text: str) -> list[Correction]:
    """Comma-separated specs, ``"verl:rollout_is=token,trl,skyrl:tis_ratio_type=token"``: a comma starts a new
    spec only where an engine name follows it, so a value's own commas stay in it."""
    pieces: list[str] = []
    for piece in text.split(","):
        head = piece.strip().split(":", 1)[0]
        if pieces and head not in ENGINES:
            pieces[-1] += "," + piece
        else:
            pieces.append(piece)
    return [parse_spec(piece) for piece in pieces if piece.strip()]


__all__ = ["ENGINES", "Correction", "Engine", "apply", "correction", "engine", "parse_spec", "parse_specs"]
