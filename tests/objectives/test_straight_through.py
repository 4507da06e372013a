"""The PPO clip loss computed on detached floats with a straight-through gradient (``ppo_clip_loss``) against the
formula differentiated by autograd: ℓ = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)), dual clip min(ℓ, −A·c) for A < 0,
r = exp(logp − log π_old) — loss, gradient and kept tokens bit for bit (grpo), and GSPO's sequence ratio likewise."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from offpolicylab.objectives import TokenBatch, get_objective
from offpolicylab.objectives.policy_gradient import ppo_clip_loss

CLIPS = [(0.2, 0.28, None), (0.2, 0.28, 3.0), (0.2, 0.2, 1.4), (math.inf, math.inf, None), (1.0, 4.0, None),
         (0.2, math.inf, 3.0)]


def autograd_ppo(log_ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float,
                 dual_clip: float | None) -> tuple[Tensor, Tensor]:
    """The clipped surrogate as written in the PPO / dual-clip papers, differentiated by autograd; (ℓ, clipped)."""
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    low = 1.0 - eps_low if math.isfinite(eps_low) else None
    high = 1.0 + eps_high if math.isfinite(eps_high) else None
    surrogate = -advantages * (ratio if low is None and high is None else ratio.clamp(min=low, max=high))
    loss = torch.maximum(unclipped, surrogate)
    clipped = surrogate > unclipped
    if dual_clip is not None:
        cap = -advantages * dual_clip
        dual = (advantages < 0) & (loss > cap)
        loss = torch.where(dual, cap, loss)
        clipped = clipped | dual
    return loss, clipped


def clip_batch(seed: int, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """log π_old, log-ratios with tokens exactly at the clip edges and beyond the dual cap, advantages with zeros."""
    gen = torch.Generator().manual_seed(seed)
    behavior = torch.log(torch.rand(16, 30, generator=gen, dtype=dtype).clamp_min(1e-4))
    log_ratio = 0.6 * torch.randn(16, 30, generator=gen, dtype=dtype)
    edges = torch.tensor([0.8, 1.2, 1.28, 3.0, 1.4, 1.0], dtype=dtype)
    log_ratio[:, :6] = torch.log(edges)  # ties with the clip edges / the dual cap
    advantages = torch.randn(16, 1, generator=gen, dtype=dtype).expand(16, 30).clone()
    advantages[:3] = 0.0
    return behavior, log_ratio, advantages


@pytest.mark.parametrize(("eps_low", "eps_high", "dual_clip"), CLIPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", range(3))
def test_ppo_clip_loss_equals_the_autograd_formula_bit_for_bit(
    eps_low: float, eps_high: float, dual_clip: float | None, dtype: torch.dtype, seed: int
) -> None:
    behavior, log_ratio, advantages = clip_batch(seed, dtype)
    logp_ref = (behavior + log_ratio).requires_grad_(True)
    ref, clipped = autograd_ppo(logp_ref - behavior, advantages, eps_low, eps_high, dual_clip)
    ref.sum().backward()
    logp = (behavior + log_ratio).requires_grad_(True)
    loss, kept = ppo_clip_loss(logp, torch.exp(logp.detach() - behavior), advantages, eps_low, eps_high, dual_clip)
    loss.sum().backward()
    assert torch.equal(loss.detach(), ref.detach())
    assert torch.equal(logp.grad, logp_ref.grad)
    assert torch.equal(kept, (~clipped).to(dtype))


@pytest.mark.parametrize(("eps_low", "eps_high", "dual_clip"), CLIPS)
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_grpo_loss_and_gradient_equal_the_autograd_formula(
    eps_low: float, eps_high: float, dual_clip: float | None, agg: str
) -> None:
    behavior, log_ratio, advantages = clip_batch(7, torch.float32)
    mask = (torch.arange(30)[None, :] < torch.randint(1, 31, (16, 1), generator=torch.Generator().manual_seed(1)))
    mask = mask.float()
    logp = (behavior + log_ratio).requires_grad_(True)
    objective = get_objective("grpo", eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip, agg=agg)
    out = objective(TokenBatch(logp=logp, behavior_logp=behavior, advantages=advantages, mask=mask))
    out.loss.backward()
    logp_ref = (behavior + log_ratio).requires_grad_(True)
    ref, clipped = autograd_ppo((logp_ref - behavior) * mask, advantages * mask, eps_low, eps_high, dual_clip)
    masked = torch.where(mask > 0, ref, 0.0)
    if agg == "token-mean":
        ref_loss = masked.sum() / mask.sum()
    else:
        ref_loss = (masked.sum(-1) / mask.sum(-1)).sum() / (mask.sum(-1) > 0).sum()
    ref_loss.backward()
    assert torch.equal(out.loss, ref_loss)
    assert torch.equal(logp.grad, logp_ref.grad)
    assert float(out.metrics["clip_frac"]) == float((clipped.float() * mask).sum() / mask.sum())


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_gspo_equals_the_autograd_token_form(agg: str) -> None:
    """GSPO-token, s_it = sg(s_i)·π_θ/sg(π_θ) differentiated by autograd (s_i = exp(mean_t log r_t)), against the
    sequence-ratio straight-through form: equal loss and gradient (float rounding of exp on [B] vs [B, T] aside)."""
    behavior, log_ratio, advantages = clip_batch(5, torch.float64)
    log_ratio = 2e-3 * log_ratio  # sequence ratios around GSPO's 3e-4 / 4e-4 clip edges
    mask = (torch.arange(30)[None, :] < torch.randint(1, 31, (16, 1), generator=torch.Generator().manual_seed(2)))
    mask = mask.double()
    logp = (behavior + log_ratio).requires_grad_(True)
    out = get_objective("gspo", agg=agg)(TokenBatch(logp=logp, behavior_logp=behavior, advantages=advantages,
                                                    mask=mask))
    out.loss.backward()
    logp_ref = (behavior + log_ratio).requires_grad_(True)
    log_seq = (((logp_ref - behavior) * mask).sum(-1) / mask.sum(-1)).detach()
    log_token = logp_ref - logp_ref.detach() + log_seq[:, None]
    ref, _ = autograd_ppo(log_token, advantages, 3e-4, 4e-4, None)
    masked = ref * mask
    ref_loss = masked.sum() / mask.sum() if agg == "token-mean" else (masked.sum(-1) / mask.sum(-1)).mean()
    ref_loss.backward()
    torch.testing.assert_close(out.loss, ref_loss, rtol=1e-14, atol=0.0)
    torch.testing.assert_close(logp.grad, logp_ref.grad, rtol=1e-14, atol=0.0)
    assert 0.0 < float(out.metrics["clip_frac"]) < 1.0  # both sides of the clip edges occur


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ratio_or_one_equals_exp_of_the_kept_log_ratio(dtype: torch.dtype) -> None:
    """r on kept tokens and 1 on dropped ones from the batch's r = e^Δ: exactly exp(kept·Δ), also where e^Δ
    overflows (a dropped token's inf must not leak, a kept token's inf stays inf)."""
    from offpolicylab.objectives.policy_gradient import ratio_or_one

    gen = torch.Generator().manual_seed(0)
    delta = torch.randn(40, 30, generator=gen, dtype=dtype) * 3.0
    delta[::7, ::5] = 800.0  # e^800 overflows float32 and float64
    dropped = (torch.rand(40, 30, generator=gen) < 0.4).to(dtype)
    kept = 1.0 - dropped
    expected = torch.exp(kept * delta)
    got = ratio_or_one(torch.exp(delta), dropped, kept)
    assert torch.isinf(expected).any() and (torch.isinf(torch.exp(delta)) & (dropped > 0)).any()
    assert torch.equal(got, expected)
