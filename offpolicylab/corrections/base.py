"""The correction contract shared by every engine module, and the engine table.

A correction maps the token contract — trainer log-probs ``logp`` [B, T], sampler log-probs ``sampler_logp``
[B, T], the response ``mask`` [B, T] — and an engine's own parameters to ``(weights, keep)``: the per-token
importance weight the engine multiplies its per-token loss by (0 on padding) and the mask after the engine's
rejection (``keep`` ⊆ ``mask``).  The effective per-token factor is ``weights · keep``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from offpolicylab.registry import Param, resolve

#: (weights, keep), both [B, T]: weights in logp's dtype, 0 on padding; keep in mask's dtype.
Result = tuple[Tensor, Tensor]
CorrectionFn = Callable[..., Result]


@dataclass(frozen=True)
class Engine:
    """One engine's corrections: its parameters (the engine's own names and defaults), aliases (other spellings
    the engine accepts for the same parameter, e.g. a newer CLI name), the function and the engine source file it
    follows."""

    name: str
    params: dict[str, Param]
    fn: CorrectionFn
    source: str
    aliases: dict[str, str] = field(default_factory=dict)
    #: The engine's loss denominator counts only the tokens its rejection kept (verl: the rejection replaces the
    #: ``response_mask`` that ``agg_loss`` divides by); otherwise (TRL, OpenRLHF, slime, SkyRL, AReaL) a rejected
    #: token's loss is 0 and the denominator is taken before the rejection, so the token stays in it.
    denominator_after_rejection: bool = False
    #: Cross-parameter check on the resolved values; raises ``ValueError`` as the engine does.
    check: Callable[[dict[str, Any]], None] | None = None

    def resolve(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The engine's parameters with defaults filled in, aliases mapped to their canonical names; an unknown
        name or bad value raises ``ValueError`` naming the valid ones."""
        canonical: dict[str, Any] = {}
        for key, value in given.items():
            name = self.aliases.get(key, key)
            if name in canonical:
                raise ValueError(f"correction engine {self.name!r}: {key!r} and {name!r} name the same parameter")
            canonical[name] = value
        unknown = sorted(set(canonical) - set(self.params))
        if unknown:
            valid = ", ".join(list(self.params) + [f"{a} (= {n})" for a, n in self.aliases.items()])
            raise ValueError(f"correction engine {self.name!r} has no parameter {', '.join(unknown)}; valid: {valid}")
        values = resolve(f"correction engine {self.name!r}", self.params, canonical)
        if self.check is not None:
            self.check(values)
        return values


def check_shapes(logp: Tensor, sampler_logp: Tensor, mask: Tensor) -> None:
    """``logp``, ``sampler_logp`` and ``mask`` must be [B, T] tensors of one shape."""
    if logp.dim() != 2 or logp.shape != sampler_logp.shape or logp.shape != mask.shape:
        raise ValueError(f"corrections take [B, T] tensors of one shape; got logp {tuple(logp.shape)}, "
                         f"sampler_logp {tuple(sampler_logp.shape)}, mask {tuple(mask.shape)}")


def zero_padding(values: Tensor, mask: Tensor) -> Tensor:
    """``values`` with padded positions (mask 0) set to 0: what padding holds (NaN, ±inf) never reaches an engine's
    formula.  On valid tokens the values are untouched, so each engine's own handling of a non-finite valid value
    (TRL and AReaL map NaN to ratio 1, verl propagates it) is kept."""
    return torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))


def per_sequence(values: Tensor | None, batch: int, what: str) -> Tensor:
    """Advantages as the engines broadcast them: [B] → [B, 1], [B, T] kept; missing raises naming ``what``."""
    if values is None:
        raise ValueError(f"{what} needs the advantages (apply(..., advantages=...))")
    if values.dim() == 1:
        values = values.unsqueeze(-1)
    if values.dim() != 2 or values.shape[0] != batch:
        raise ValueError(f"advantages must be [B] or [B, T] with B = {batch}; got {tuple(values.shape)}")
    return values


def finish(weights: Tensor, keep: Tensor, logp: Tensor, mask: Tensor) -> Result:
    """(weights broadcast to [B, T] in logp's dtype and 0 on padding, keep ∧ mask in mask's dtype)."""
    valid = mask.bool()
    weights = torch.where(valid, weights.expand_as(logp).to(logp.dtype), torch.zeros((), dtype=logp.dtype,
                                                                                       device=logp.device))
    keep = (keep.expand_as(valid).bool() & valid).to(mask.dtype)
    return weights.detach(), keep
