"""Shared fixtures for the correction conformance tests: every engine's own function and ours see these batches.

Each fixture is (logp, sampler_logp, mask, advantages) with logp the trainer's log-probs, sampler_logp the
sampler's, mask [B, T] (1 = response token) and advantages [B]:

- ``long``: 2048-token responses with a 0.012-nat-per-token drift (TRL #4772's numbers) and ragged lengths;
- ``extreme``: log-ratios up to ±40 — ratios far below 1e-8 and above 1e8, past the engines' ±20 safety clamps;
- ``top_p``: the sampler samples from top-p (0.9) truncated, renormalised softmax; one row's sampler log-probs are
  left unrenormalised (the TRL #6789 bug), so the ratio is the kept mass < 1 or exactly 1;
- ``bad_padding``: padding holds NaN, +inf and −inf in both log-prob tensors;
- ``empty_rows``: responses of length 0 beside ordinary ones;
- ``near_one``: a mismatch of 1e-3 nats, where the geometric and sequence bounds of 0.99–1.01 bite.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

Fixture = tuple[Tensor, Tensor, Tensor, Tensor]


def _ragged(lengths: list[int], width: int) -> Tensor:
    return (torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).to(torch.float32)


def _advantages(batch: int, gen: torch.Generator) -> Tensor:
    adv = torch.randn(batch, generator=gen)
    adv[0] = -abs(adv[0]) - 0.1
    return adv


def long_sequences(dtype: torch.dtype = torch.float32) -> Fixture:
    gen = torch.Generator().manual_seed(1)
    mask = _ragged([2048, 1500, 100, 2047], 2048)
    sampler = -torch.rand(4, 2048, generator=gen, dtype=torch.float64) * 3.0
    logp = sampler + 0.012 + 0.05 * torch.randn(4, 2048, generator=gen, dtype=torch.float64)
    logp[1] = sampler[1] - 0.012  # a row drifting the other way
    return logp.to(dtype) * mask, sampler.to(dtype) * mask, mask, _advantages(4, gen)


def extreme_ratios(dtype: torch.dtype = torch.float32) -> Fixture:
    gen = torch.Generator().manual_seed(2)
    mask = _ragged([6, 6, 3, 5, 6], 6)
    sampler = -torch.rand(5, 6, generator=gen, dtype=torch.float64) * 2.0 - 0.1
    shift = torch.tensor([[40.0, -40.0, 25.0, -25.0, 0.0, 1e-9],
                          [18.0, 19.9, 20.0, 20.1, 0.5, -0.5],
                          [-21.0, 3.0, 0.7, 0.0, 0.0, 0.0],
                          [math.log(2.0), math.log(0.5), math.log(3.0), math.log(5.0), math.log(0.2), 0.0],
                          [1e-7, -1e-7, 1e-4, -1e-4, 0.01, -0.01]], dtype=torch.float64)
    logp = sampler + shift
    return logp.to(dtype) * mask, sampler.to(dtype) * mask, mask, _advantages(5, gen)


def top_p(dtype: torch.dtype = torch.float32, top_p_mass: float = 0.9, vocab: int = 50) -> Fixture:
    gen = torch.Generator().manual_seed(3)
    batch, width = 6, 64
    logits = 2.0 * torch.randn(batch, width, vocab, generator=gen, dtype=torch.float64)
    full = torch.log_softmax(logits, dim=-1)
    probs = full.exp()
    order = probs.sort(dim=-1, descending=True)
    before = order.values.cumsum(dim=-1) - order.values
    kept_sorted = before < top_p_mass  # the smallest prefix reaching top_p_mass
    kept = torch.zeros_like(kept_sorted).scatter(-1, order.indices, kept_sorted)
    truncated = torch.where(kept, probs, torch.zeros_like(probs))
    mass = truncated.sum(dim=-1, keepdim=True)
    tokens = torch.multinomial((truncated / mass).reshape(-1, vocab), 1, generator=gen).reshape(batch, width, 1)
    logp = full.gather(-1, tokens).squeeze(-1)
    sampler = logp - mass.squeeze(-1).log()  # renormalised top-p: log p − log(kept mass)
    sampler[2] = logp[2]  # not renormalised: the sampler reports the full-softmax log-prob
    mask = _ragged([64, 40, 64, 10, 64, 33], width)
    return logp.to(dtype) * mask, sampler.to(dtype) * mask, mask, _advantages(batch, gen)


def bad_padding(dtype: torch.dtype = torch.float32) -> Fixture:
    gen = torch.Generator().manual_seed(4)
    mask = _ragged([7, 4, 1, 5], 8)
    sampler = -torch.rand(4, 8, generator=gen, dtype=torch.float64) * 2.0 - 0.05
    logp = sampler + 0.3 * torch.randn(4, 8, generator=gen, dtype=torch.float64)
    fills = torch.tensor([float("nan"), float("inf"), float("-inf")], dtype=torch.float64)
    pad = ~mask.bool()
    index = torch.arange(pad.sum().item()) % 3
    logp[pad], sampler[pad] = fills[index], fills[(index + 1) % 3]
    return logp.to(dtype), sampler.to(dtype), mask, _advantages(4, gen)


def empty_rows(dtype: torch.dtype = torch.float32) -> Fixture:
    gen = torch.Generator().manual_seed(5)
    mask = _ragged([0, 5, 0, 3], 5)
    sampler = -torch.rand(4, 5, generator=gen, dtype=torch.float64) * 2.0 - 0.05
    logp = sampler + 0.4 * torch.randn(4, 5, generator=gen, dtype=torch.float64)
    return logp.to(dtype) * mask, sampler.to(dtype) * mask, mask, _advantages(4, gen)


def near_one(dtype: torch.dtype = torch.float32) -> Fixture:
    gen = torch.Generator().manual_seed(6)
    mask = _ragged([30, 30, 12, 25], 30)
    sampler = -torch.rand(4, 30, generator=gen, dtype=torch.float64) * 2.0 - 0.05
    drift = torch.tensor([[1e-3], [-1e-3], [0.02], [-0.02]], dtype=torch.float64)
    logp = sampler + drift + 1e-3 * torch.randn(4, 30, generator=gen, dtype=torch.float64)
    return logp.to(dtype) * mask, sampler.to(dtype) * mask, mask, _advantages(4, gen)


FIXTURES = {"long": long_sequences, "extreme": extreme_ratios, "top_p": top_p, "bad_padding": bad_padding,
            "empty_rows": empty_rows, "near_one": near_one}


def sanitised(fixture: Fixture) -> Fixture:
    """The fixture with 0 on padding (for engines whose own code lets padding NaN reach their output)."""
    logp, sampler, mask, adv = fixture
    valid = mask.bool()
    return torch.where(valid, logp, 0.0), torch.where(valid, sampler, 0.0), mask, adv


def loss_inputs(name: str, dtype: torch.dtype, seed: int) -> tuple[Tensor, ...]:
    """(π_old, sampler, mask, A, π_θ, A_t) for an engine's loss: the :func:`sanitised` fixture ``name`` in ``dtype``
    (its mask too), a current log-prob π_old + 0.1·N(0, 1) (seeded, 0 on padding) and the per-token advantages A_t
    (A on every valid token, 0 on padding)."""
    old, sampler, mask, adv = sanitised(FIXTURES[name](dtype))
    mask = mask.to(dtype)
    gen = torch.Generator().manual_seed(seed)
    current = (old + 0.1 * torch.randn(old.shape, generator=gen, dtype=torch.float64).to(dtype)) * mask
    return old, sampler, mask, adv, current, adv.to(dtype)[:, None].expand_as(old) * mask
