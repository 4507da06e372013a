"""The sampler's categorical draw equals ``torch.multinomial``'s bit for bit (tokens and generator state), so the
faster exponential race changes no run: checked on millions of draws and on values at float32 rounding boundaries."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from offpolicylab.policies.autoregressive import _multinomial, exponential, exponential_of


def test_exponential_equals_torch_exponential_and_leaves_the_generator_where_it_does() -> None:
    for seed in range(3):
        ours, theirs = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        expected = torch.empty(1000, 1000).exponential_(generator=theirs)
        assert torch.equal(exponential((1000, 1000), ours), expected)
        assert torch.equal(ours.get_state(), theirs.get_state())


def test_values_at_float32_rounding_boundaries_follow_the_scalar_log1p() -> None:
    """u chosen so that −log1p(−u) sits on midpoints between neighbouring float32 numbers: the float32 result must
    be the one of the scalar ``math.log1p`` (what ``exponential_`` computes), whatever the vectorised log1p gives."""
    floats = np.sort(np.random.default_rng(0).exponential(size=4000).astype(np.float32))
    midpoints = (floats.astype(np.float64) + np.nextafter(floats, np.float32(np.inf)).astype(np.float64)) / 2
    minus_u = torch.from_numpy(np.expm1(-midpoints))  # −u = expm1(−q), so −log1p(−u) ≈ q
    expected = torch.tensor([-math.log1p(v) for v in minus_u.tolist()], dtype=torch.float64).to(torch.float32)
    assert torch.equal(exponential_of(minus_u.clone()), expected)
    naive = torch.log1p(minus_u).neg().to(torch.float32)
    assert not torch.equal(naive, expected)  # the boundary handling is exercised, not idle


@pytest.mark.parametrize("blocks", [1, 3])
def test_draws_equal_torch_multinomial(blocks: int) -> None:
    logits = 3 * torch.randn(300, 256, generator=torch.Generator().manual_seed(5))
    probs = torch.log_softmax(logits, -1).exp()
    ours = [torch.Generator().manual_seed(10 + b) for b in range(blocks)]
    theirs = [torch.Generator().manual_seed(10 + b) for b in range(blocks)]
    for _ in range(20):
        expected = torch.cat([torch.multinomial(p, 1, generator=g).squeeze(1)
                              for p, g in zip(probs.split(300 // blocks), theirs, strict=True)])
        assert torch.equal(_multinomial(probs, ours[0] if blocks == 1 else ours), expected)
    assert all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(ours, theirs, strict=True))
    with pytest.raises(RuntimeError, match="inf"):
        _multinomial(torch.full((2, 3), float("nan")), torch.Generator())


@pytest.mark.parametrize("blocks", [1, 3])
@pytest.mark.parametrize("all_end", [False, True])
def test_sampling_draws_each_step_as_torch_multinomial_does(blocks: int, all_end: bool) -> None:
    """``sample`` draws every step's exponential-race numbers at the first step (one call per generator); tokens,
    log-probs and generator states must be those of a plain loop of ``torch.multinomial`` per step and block, with
    rows ending at EOS before the last step.  ``all_end``: EOS is all but certain from step 1, so every row has
    ended by step 3 and ``sample`` stops decoding there; the plain loop still draws every step."""
    from offpolicylab.contracts import Prompts
    from offpolicylab.policies import TabularSoftmaxPolicy

    vocab, length, group = 5, 6, 4
    logits = torch.randn(4, length, vocab + 1, vocab, generator=torch.Generator().manual_seed(1))
    if all_end:
        logits[:, 1:, :, 0] += 30.0
    policy = TabularSoftmaxPolicy(num_prompts=4, vocab_size=vocab, response_len=length, eos_id=0,
                                  init_logits=logits)
    index = torch.tensor([0, 2, 3] * blocks)
    prompts = Prompts(ids=index[:, None], mask=torch.ones(len(index), 1), index=index)
    ours = [torch.Generator().manual_seed(20 + b) for b in range(blocks)]
    theirs = [torch.Generator().manual_seed(20 + b) for b in range(blocks)]
    rollout = policy.sample(prompts, group, generator=ours[0] if blocks == 1 else ours)

    rows = index.repeat_interleave(group)
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    alive = torch.ones(len(rows), dtype=torch.bool)
    with torch.no_grad():
        for t in range(length):
            logp = torch.log_softmax(policy.logits[rows, t, ids[:, t - 1] if t else vocab], -1)
            token = torch.cat([torch.multinomial(p, 1, generator=g).squeeze(1)
                               for p, g in zip(logp.exp().split(len(rows) // blocks), theirs, strict=True)])
            token = torch.where(alive, token, 0)
            ids[:, t] = token
            assert torch.equal(rollout.behavior_logp[:, t], torch.where(alive, logp.gather(1, token[:, None])[:, 0], 0.0))
            assert torch.equal(rollout.response_mask[:, t], alive.float())
            alive = alive & (token != 0)
    assert torch.equal(rollout.response_ids, ids)
    assert 0 < int(rollout.response_mask.sum()) < ids.numel()  # some rows ended early: EOS is exercised
    if all_end:
        assert int(rollout.response_mask[:, 3:].sum()) == 0  # decoding stopped before the last step
    assert all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(ours, theirs, strict=True))
