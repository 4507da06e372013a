"""Mu-GRPO: each veto scope masks exactly the tokens it names; relaxed clip [0, 5] on the rest."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from offpolicylab.objectives import TokenBatch, get_objective
from offpolicylab.objectives.aggregation import aggregate
from offpolicylab.objectives.mu_grpo import negative_advantage_veto
from tests.objectives._golden import log_ratio_batch


def make_batch(ratios, advantages, mask) -> tuple[TokenBatch, torch.Tensor]:
    log_ratio = torch.log(torch.as_tensor(ratios, dtype=torch.float32))
    return log_ratio_batch(log_ratio, advantages, mask, behavior=-2.0)


# κ = 2.  Row 0: A > 0 with large ratios — never vetoed (6 is clipped at 5).  Row 1: A < 0, triggers at t = 2
# (r = 3) and t = 4 (r = 2.5); r = 2 at t = 5 does not *exceed* κ.  Row 2: A < 0, no trigger.  Row 3: A < 0,
# trigger at t = 1, then padding (whose ratio 9 must never count).
RATIOS = [
    [1.0, 3.0, 1.0, 6.0, 1.0, 1.0],
    [1.0, 1.5, 3.0, 1.0, 2.5, 2.0],
    [1.2, 1.0, 0.5, 0.8, 1.0, 1.0],
    [1.0, 2.5, 1.1, 9.0, 9.0, 9.0],
]
ADVANTAGES = [1.0, -1.0, -0.5, -2.0]
MASK = [
    [1, 1, 1, 1, 1, 1],
    [1, 1, 1, 1, 1, 1],
    [1, 1, 1, 1, 1, 0],
    [1, 1, 1, 0, 0, 0],
]
EXPECTED_VETO = {
    "none": [],
    "trigger": [(1, 2), (1, 4), (3, 1)],
    "nontrigger_suffix": [(1, 3), (1, 5), (3, 2)],  # H_κ: after the first trigger, triggers excluded
    "suffix": [(1, 2), (1, 3), (1, 4), (1, 5), (3, 1), (3, 2)],
    "response": [(1, t) for t in range(6)] + [(3, 0), (3, 1), (3, 2)],
}
N_VALID = 20


def veto_matrix(scope: str) -> np.ndarray:
    veto = np.zeros((4, 6), dtype=bool)
    for row, col in EXPECTED_VETO[scope]:
        veto[row, col] = True
    return veto


def relaxed_clip_reference(veto: np.ndarray) -> tuple[float, np.ndarray]:
    """NumPy: ℓ = max(−A·r, −A·clip(r, 0, 5)) outside the veto, 0 inside; token-mean over valid tokens."""
    r = np.array(RATIOS, dtype=np.float64)
    adv = np.broadcast_to(np.array(ADVANTAGES)[:, None], r.shape)
    mask = np.array(MASK, dtype=np.float64)
    unclipped, clipped = -adv * r, -adv * np.clip(r, 0.0, 5.0)
    per_token = np.maximum(unclipped, clipped) * (~veto) * mask
    grad = np.where((clipped > unclipped) | veto, 0.0, -adv * r) * mask / N_VALID
    return per_token.sum() / N_VALID, grad


@pytest.mark.parametrize("scope", ["none", "trigger", "nontrigger_suffix", "suffix", "response"])
def test_each_scope_masks_exactly_the_named_tokens(scope: str) -> None:
    batch, logp = make_batch(RATIOS, ADVANTAGES, MASK)
    out = get_objective("mu_grpo", nav_kappa=2.0, nav_scope=scope)(batch)
    veto = veto_matrix(scope)
    got_veto = (out.token_mask.numpy() == 0) & (np.array(MASK) > 0)
    got_veto[0, 3] = False  # row 0, t = 3 is *clipped* (A > 0, r = 6 > 5), not vetoed
    np.testing.assert_array_equal(got_veto, veto)
    assert out.token_mask.numpy()[0, 3] == 0
    assert float(out.metrics["nav_frac"]) == pytest.approx(veto.sum() / N_VALID)
    assert float(out.metrics["clip_frac"]) == pytest.approx(1 / N_VALID)
    raw = negative_advantage_veto(batch.log_ratio, batch.advantages, batch.mask, 2.0, scope)
    np.testing.assert_array_equal(raw.numpy(), veto)
    loss, grad = relaxed_clip_reference(veto)
    assert float(out.loss.detach()) == pytest.approx(loss, rel=1e-6, abs=1e-6)
    out.loss.backward()
    np.testing.assert_allclose(logp.grad.numpy(), grad, rtol=1e-6, atol=1e-9)


def test_scopes_nest_and_spare_positive_advantages() -> None:
    gen = torch.Generator().manual_seed(0)
    log_ratio = torch.randn(32, 20, generator=gen) * 0.8
    adv = torch.randn(32, generator=gen)
    mask = (torch.arange(20)[None, :] < torch.randint(1, 21, (32,), generator=gen)[:, None]).float()
    adv_tok = adv[:, None].expand(32, 20)
    vetoes = {scope: negative_advantage_veto(log_ratio, adv_tok, mask, 2.0, scope) for scope in
              ("none", "trigger", "nontrigger_suffix", "suffix", "response")}
    assert not vetoes["none"].any()
    assert (vetoes["trigger"] <= vetoes["suffix"]).all() and (vetoes["suffix"] <= vetoes["response"]).all()
    for veto in vetoes.values():
        assert not (veto & (adv_tok >= 0)).any()
        assert not (veto & (mask == 0)).any()
    assert vetoes["trigger"].sum() < vetoes["suffix"].sum() < vetoes["response"].sum()
    assert not (vetoes["trigger"] & vetoes["nontrigger_suffix"]).any()
    assert torch.equal(vetoes["trigger"] | vetoes["nontrigger_suffix"], vetoes["suffix"])
    # suffix: per row, vetoed ⇔ valid and at/after the first trigger (a loop reference)
    for row in range(32):
        triggers = [t for t in range(20) if bool(vetoes["trigger"][row, t])]
        expected = [bool(mask[row, t]) and bool(triggers) and t >= triggers[0] for t in range(20)]
        assert vetoes["suffix"][row].tolist() == expected


def test_no_veto_equals_relaxed_grpo() -> None:
    batch, logp = make_batch(RATIOS, ADVANTAGES, MASK)
    out = get_objective("mu_grpo", nav_kappa=math.inf, nav_scope="response")(batch)
    assert float(out.metrics["nav_frac"]) == 0.0
    ref_batch, ref_logp = make_batch(RATIOS, ADVANTAGES, MASK)
    reference = get_objective("grpo", eps_low=1.0, eps_high=4.0)(ref_batch)
    np.testing.assert_allclose(out.loss.detach().numpy(), reference.loss.detach().numpy(), rtol=1e-5, atol=1e-7)
    out.loss.backward()
    reference.loss.backward()
    np.testing.assert_allclose(logp.grad.detach().numpy(), ref_logp.grad.detach().numpy(), rtol=1e-5, atol=1e-7)


def test_defaults() -> None:
    objective = get_objective("mu_grpo")
    assert (objective.eps_low, objective.eps_high, objective.nav_kappa, objective.nav_scope) == (1.0, 4.0, 2.0, "suffix")


@pytest.mark.parametrize("scope", ["none", "trigger", "nontrigger_suffix", "suffix", "response"])
def test_finite_at_extreme_log_ratios(scope: str) -> None:
    ratios = np.exp(np.array([[50.0, -50.0, 0.0], [-50.0, 50.0, 0.1]]))
    batch, logp = make_batch(ratios, [1.0, -1.0], np.ones((2, 3)))
    out = get_objective("mu_grpo", nav_scope=scope)(batch)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(logp.grad).all()


@pytest.mark.parametrize("params", [{"nav_scope": "prefix"}, {"nav_kappa": 0.5}, {"eps_high": -1.0}])
def test_bad_params_raise(params: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(params))):
        get_objective("mu_grpo", **params)


def written_out_mu_grpo(logp: torch.Tensor, behavior: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                        kappa: float, scope: str, low: float, high: float) -> torch.Tensor:
    """ℓ averaged over valid tokens as the paper writes it, for autograd: the veto by a plain loop over each response
    (trigger: A < 0 and r > κ; the scopes of the docstring), then (1 − veto)·max(−A·r, −A·clip(r, low, high)) with
    r = exp((1 − veto)·Δ) (vetoed tokens read e^0, so nothing overflows there)."""
    delta = (logp - behavior).detach()
    veto = torch.zeros_like(mask)
    for row in range(mask.shape[0]):
        triggers = [t for t in range(mask.shape[1])
                    if mask[row, t] > 0 and advantages[row, t] < 0 and delta[row, t] > math.log(kappa)]
        valid = [t for t in range(mask.shape[1]) if mask[row, t] > 0]
        first = triggers[0] if triggers else None
        chosen = {"none": [], "trigger": triggers,
                  "suffix": [t for t in valid if first is not None and t >= first],
                  "nontrigger_suffix": [t for t in valid if first is not None and t > first and t not in triggers],
                  "response": valid if triggers else []}[scope]
        for t in chosen:
            veto[row, t] = 1.0
    allowed = 1.0 - veto
    ratio = torch.exp(allowed * (logp - behavior))
    loss = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(min=low, max=high))
    return aggregate(allowed * loss, mask, "token-mean", finite_padding=True)


@pytest.mark.parametrize("scope", ["none", "trigger", "nontrigger_suffix", "suffix", "response"])
@pytest.mark.parametrize("seed", range(4))
def test_loss_and_gradient_equal_the_written_out_objective_bit_for_bit(scope: str, seed: int) -> None:
    """Random responses with triggers anywhere, log-ratios up to ±80 (ratios up to e^80 on vetoed tokens, which read e^0),, padding and zero advantages: loss and gradient equal autograd through the written-out objective, bit for bit."""
    gen = torch.Generator().manual_seed(seed)
    behavior = torch.rand(24, 10, generator=gen).clamp_min(1e-6).log()
    scale = torch.tensor([0.3, 1.0, 60.0])[torch.randint(3, (24, 10), generator=gen)]
    logp0 = behavior + (torch.randn(24, 10, generator=gen) * scale).clamp(-80.0, 80.0)
    mask = (torch.arange(10)[None, :] < torch.randint(1, 11, (24, 1), generator=gen)).float()
    advantages = torch.randn(24, generator=gen).round()  # zeros among them
    logp = logp0.clone().requires_grad_(True)
    batch = TokenBatch(logp=logp, behavior_logp=behavior, advantages=advantages, mask=mask)
    out = get_objective("mu_grpo", nav_scope=scope)(batch)
    (grad,) = torch.autograd.grad(out.loss, logp)
    reference = logp0.clone().requires_grad_(True)
    expected_loss = written_out_mu_grpo(reference, behavior, advantages[:, None].expand(24, 10), mask, 2.0, scope,
                                        0.0, 5.0)
    (expected_grad,) = torch.autograd.grad(expected_loss, reference)
    assert torch.isfinite(expected_loss) and torch.equal(out.loss.detach(), expected_loss.detach())
    assert torch.equal(grad, expected_grad)


@pytest.mark.parametrize("scope", ["trigger", "nontrigger_suffix", "suffix", "response"])
def test_zero_padded_log_ratios_need_no_mask_product(scope: str) -> None:
    from offpolicylab.objectives.mu_grpo import veto_weights

    gen = torch.Generator().manual_seed(5)
    mask = (torch.arange(9)[None, :] < torch.randint(0, 10, (30, 1), generator=gen)).float()
    log_ratio = torch.randn(30, 9, generator=gen) * mask  # 0 on padding, as TokenBatch.delta()
    advantages = torch.randn(30, 1, generator=gen).expand(30, 9) * mask
    for kappa in (1.0, 2.0):
        plain = veto_weights(log_ratio, advantages, mask, kappa, scope)
        assert plain.sum() > 0 and torch.equal(veto_weights(log_ratio, advantages, mask, kappa, scope, zero_padded=True),
                                               plain)
