"""M2PO: paper mask variant against a brute-force NumPy loop, cap variant against its defining equation."""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pytest
import torch

from offpolicylab.objectives import get_objective
from offpolicylab.objectives.m2po import m2po_cap_bound, m2po_mask
from tests.objectives._golden import log_ratio_batch

make_batch = partial(log_ratio_batch, behavior=-1.5)


def random_batch(seed: int, batch: int = 8, length: int = 12, scale: float = 0.4):
    gen = torch.Generator().manual_seed(seed)
    log_ratio = torch.randn(batch, length, generator=gen) * scale
    advantages = torch.randn(batch, generator=gen)
    lengths = torch.randint(3, length + 1, (batch,), generator=gen)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    return log_ratio, advantages, mask


def trust_region_np(delta: np.ndarray, adv: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return (((adv > 0) & (delta > 0)) | ((adv < 0) & (delta < 0))) & (mask > 0)


def brute_force_mask(delta: np.ndarray, adv: np.ndarray, mask: np.ndarray, tau: float) -> np.ndarray:
    """Remove the largest (log r)² of H one at a time until the mean over the rest of H is ≤ τ."""
    in_tr = trust_region_np(delta, adv, mask)
    kept = {idx: float(delta[idx]) ** 2 for idx in zip(*np.nonzero(in_tr), strict=True)}
    masked = np.zeros_like(in_tr)
    while kept and sum(kept.values()) / len(kept) > tau:
        worst = max(kept, key=kept.get)
        masked[worst] = True
        del kept[worst]
    return masked


def assert_plain_importance_sampling(out, logp, log_ratio, adv, mask) -> None:
    """Nothing masked or clipped: L = −(1/n) Σ A·r and ∂L/∂logp = −A·r/n (NumPy reference)."""
    ratio = np.exp(log_ratio.numpy().astype(np.float64))
    adv_tok = np.broadcast_to(adv.numpy()[:, None], ratio.shape)
    valid = mask.numpy()
    n_valid = valid.sum()
    assert float(out.loss.detach()) == pytest.approx((-adv_tok * ratio * valid).sum() / n_valid, rel=1e-5)
    out.loss.backward()
    np.testing.assert_allclose(logp.grad.numpy(), -adv_tok * ratio * valid / n_valid, rtol=1e-5, atol=1e-8)


# ------------------------------------------------------------------------------------------- paper mask variant
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("tau", [0.01, 0.04, 0.2])
def test_mask_variant_matches_brute_force_loop(seed: int, tau: float) -> None:
    log_ratio, adv, mask = random_batch(seed)
    batch, _ = make_batch(log_ratio, adv, mask)
    out = get_objective("m2po", tau=tau, variant="mask")(batch)
    adv_tok = np.broadcast_to(adv.numpy()[:, None], log_ratio.shape)
    expected_masked = brute_force_mask(log_ratio.numpy(), adv_tok, mask.numpy(), tau)
    got_masked = (out.token_mask.numpy() == 0) & (mask.numpy() > 0)
    np.testing.assert_array_equal(got_masked, expected_masked)
    in_tr = trust_region_np(log_ratio.numpy(), adv_tok, mask.numpy())
    kept_tr = in_tr & ~expected_masked
    after = (log_ratio.numpy()[kept_tr] ** 2).mean() if kept_tr.any() else 0.0
    assert float(out.metrics["m2_tr_after"]) == pytest.approx(after, rel=1e-5, abs=1e-7)
    assert float(out.metrics["m2_tr_after"]) <= tau + 1e-7
    assert float(out.metrics["m2_tr"]) == pytest.approx((log_ratio.numpy()[in_tr] ** 2).mean(), rel=1e-5)
    # minimal: putting back the smallest masked token would break the budget
    if expected_masked.any():
        smallest = (log_ratio.numpy()[expected_masked] ** 2).min()
        assert (np.sum(log_ratio.numpy()[kept_tr] ** 2) + smallest) / (kept_tr.sum() + 1) > tau


def test_mask_variant_hand_example() -> None:
    # H = tokens (A>0, r>1) with Δ = 0.1, 0.2, 0.3, 0.5 (Δ² = .01, .04, .09, .25); mean .0975 > .04.
    # Drop .25 → mean .04667 > .04; drop .09 → mean .025 ≤ .04.  So Δ = 0.5 and 0.3 are masked.
    # Tokens outside H: Δ = −0.4 (A>0, r<1) and Δ = −0.7 in the A<0 row is inside H (A<0, r<1).
    delta = [[0.1, 0.2, 0.3, 0.5, -0.4], [-0.05, 0.6, 0.0, 0.0, 0.0]]
    adv = [1.0, -2.0]
    mask = [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    # Row 1: A<0 and Δ=−0.05 (r<1) is in H with Δ² = .0025; Δ=0.6 (r>1) is outside H.
    # H values: .01, .04, .09, .25, .0025 → mean .0785; drop .25 → .035625 ≤ .04.  Only Δ = 0.5 masked.
    batch, logp = make_batch(delta, adv, mask)
    out = get_objective("m2po", tau=0.04)(batch)
    expected_keep = np.array([[1, 1, 1, 0, 1], [1, 1, 0, 0, 0]], dtype=np.float32)
    np.testing.assert_array_equal(out.token_mask.numpy(), expected_keep)
    # loss = −Σ_kept A·r / 7 valid tokens (masked tokens stay in the denominator)
    r = np.exp(np.array(delta))
    kept_terms = [1 * r[0, 0], 1 * r[0, 1], 1 * r[0, 2], 1 * r[0, 4], -2 * r[1, 0], -2 * r[1, 1]]
    assert float(out.loss.detach()) == pytest.approx(-sum(kept_terms) / 7, rel=1e-6)
    assert float(out.metrics["mask_frac"]) == pytest.approx(1 / 7)
    assert float(out.metrics["m2_tr_after"]) == pytest.approx((0.01 + 0.04 + 0.09 + 0.0025) / 4, rel=1e-5)
    out.loss.backward()
    expected_grad = np.zeros((2, 5))
    expected_grad[0, [0, 1, 2, 4]] = -1.0 * r[0, [0, 1, 2, 4]] / 7
    expected_grad[1, [0, 1]] = 2.0 * r[1, [0, 1]] / 7
    np.testing.assert_allclose(logp.grad.numpy(), expected_grad, rtol=1e-5, atol=1e-8)


def test_mask_variant_keeps_everything_under_budget() -> None:
    log_ratio, adv, mask = random_batch(3, scale=0.05)
    batch, logp = make_batch(log_ratio, adv, mask)
    out = get_objective("m2po", tau=0.04)(batch)
    assert float(out.metrics["mask_frac"]) == 0.0
    assert_plain_importance_sampling(out, logp, log_ratio, adv, mask)


# --------------------------------------------------------------------------------------- official-code cap variant
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("tau", [0.01, 0.04])
def test_cap_bound_solves_budget_equation(seed: int, tau: float) -> None:
    log_ratio, adv, mask = random_batch(seed, scale=0.5)
    batch, logp = make_batch(log_ratio, adv, mask)
    out = get_objective("m2po", tau=tau, variant="cap")(batch)
    adv_tok = np.broadcast_to(adv.numpy()[:, None], log_ratio.shape)
    delta = log_ratio.numpy().astype(np.float64)
    in_tr = trust_region_np(delta, adv_tok, mask.numpy())
    values = delta[in_tr] ** 2
    assert values.mean() > tau  # the random batch needs clipping
    bound = float(out.metrics["m2po_bound"])
    np.testing.assert_allclose(np.minimum(values, bound**2).sum(), tau * in_tr.sum(), rtol=1e-5)
    assert float(out.metrics["m2_tr_after"]) == pytest.approx(tau, rel=1e-5)
    # clipped tokens: exactly the H tokens beyond the bound; loss and gradient of PPO with [e^−τ', e^τ']
    clipped = in_tr & (np.abs(delta) > bound)
    assert float(out.metrics["clip_frac"]) == pytest.approx(clipped.sum() / mask.sum().item(), rel=1e-6)
    ratio = np.exp(delta)
    ppo = np.maximum(-adv_tok * ratio, -adv_tok * np.clip(ratio, math.exp(-bound), math.exp(bound)))
    n_valid = mask.sum().item()
    assert float(out.loss.detach()) == pytest.approx((ppo * mask.numpy()).sum() / n_valid, rel=1e-5)
    out.loss.backward()
    expected_grad = np.where(clipped | (mask.numpy() == 0), 0.0, -adv_tok * ratio) / n_valid
    np.testing.assert_allclose(logp.grad.numpy(), expected_grad, rtol=1e-5, atol=1e-7)


def test_cap_bound_hand_example() -> None:
    # H values Δ² = .01, .04, .09, .25 (all A>0, r>1), τ = .04 → target .16.
    # c ∈ [.04, .09]: .01 + .04 + 2c = .16 → c = .055, τ' = √.055.
    delta = [[0.1, 0.2, 0.3, 0.5]]
    batch, _ = make_batch(delta, [1.0])
    out = get_objective("m2po", tau=0.04, variant="cap")(batch)
    assert float(out.metrics["m2po_bound"]) == pytest.approx(math.sqrt(0.055), rel=1e-6)
    np.testing.assert_array_equal(out.token_mask.numpy(), [[1, 1, 0, 0]])
    expected = -(math.exp(0.1) + math.exp(0.2) + 2 * math.exp(math.sqrt(0.055))) / 4
    assert float(out.loss.detach()) == pytest.approx(expected, rel=1e-6)


def test_cap_bound_first_segment() -> None:
    # Δ² = .01, .81 → target .08 ≤ 2·.01? no: g(.01) = .01 + .01 = .02 ≤ .08, c = (.08 − .01)/1 = .07.
    batch, _ = make_batch([[0.1, 0.9]], [1.0])
    out = get_objective("m2po", tau=0.04, variant="cap")(batch)
    assert float(out.metrics["m2po_bound"]) == pytest.approx(math.sqrt(0.07), rel=1e-6)
    # all H values equal and above budget: the root is below every value, c = τ
    batch, _ = make_batch([[0.5, 0.5, 0.5]], [1.0])
    out = get_objective("m2po", tau=0.04, variant="cap")(batch)
    assert float(out.metrics["m2po_bound"]) == pytest.approx(0.2, rel=1e-6)
    assert float(out.metrics["clip_frac"]) == 1.0


def test_cap_variant_no_clipping_under_budget() -> None:
    log_ratio, adv, mask = random_batch(5, scale=0.1)
    batch, logp = make_batch(log_ratio, adv, mask)
    out = get_objective("m2po", tau=0.04, variant="cap")(batch)
    assert float(out.metrics["m2_tr"]) <= 0.04
    assert float(out.metrics["clip_frac"]) == 0.0
    assert float(out.metrics["m2_tr_after"]) == pytest.approx(float(out.metrics["m2_tr"]))
    assert_plain_importance_sampling(out, logp, log_ratio, adv, mask)
    # the logged bound is finite: the largest |Δ| over H
    adv_tok = np.broadcast_to(adv.numpy()[:, None], log_ratio.shape)
    in_tr = trust_region_np(log_ratio.numpy(), adv_tok, mask.numpy())
    assert float(out.metrics["m2po_bound"]) == pytest.approx(np.abs(log_ratio.numpy()[in_tr]).max(), rel=1e-6)


def test_empty_trust_region() -> None:
    batch, _ = make_batch([[-0.3, -0.2], [0.4, 0.1]], [1.0, -1.0])  # no (A>0, r>1) nor (A<0, r<1)
    for variant in ("mask", "cap"):
        out = get_objective("m2po", variant=variant)(batch)
        assert float(out.metrics["m2_tr"]) == 0.0
        assert float(out.metrics["mask_frac"]) == 0.0
        assert torch.isfinite(out.loss)


# --------------------------------------------------------------------------------------------- robustness, params
@pytest.mark.parametrize("variant", ["mask", "cap"])
def test_finite_at_extreme_log_ratios(variant: str) -> None:
    delta = [[50.0, -50.0, 0.1, 50.0], [-50.0, 50.0, 0.0, -0.2]]
    batch, logp = make_batch(delta, [1.0, -1.0])
    out = get_objective("m2po", variant=variant)(batch)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert torch.isfinite(logp.grad).all()
    assert all(torch.isfinite(torch.as_tensor(value)).all() for value in out.metrics.values())


def test_padding_does_not_matter() -> None:
    log_ratio, adv, mask = random_batch(11, scale=0.5)
    garbage = torch.where(mask > 0, log_ratio, torch.full_like(log_ratio, 37.0))
    for variant in ("mask", "cap"):
        first, logp_a = make_batch(log_ratio * mask, adv, mask)
        second, logp_b = make_batch(garbage, adv, mask)
        objective = get_objective("m2po", variant=variant)
        out_a, out_b = objective(first), objective(second)
        np.testing.assert_allclose(out_a.loss.detach().numpy(), out_b.loss.detach().numpy(), rtol=1e-5, atol=1e-7)
        out_a.loss.backward()
        out_b.loss.backward()
        np.testing.assert_allclose(logp_a.grad.detach().numpy(), logp_b.grad.detach().numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("params", [{"tau": 0.0}, {"tau": -1.0}, {"variant": "clip"}])
def test_bad_params_raise(params: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(params))):
        get_objective("m2po", **params)


# ------------------------------------------------------------------------- tail-only sort vs sorting all of H
def full_sort_cut(values: np.ndarray, tau: float) -> tuple[float, float, bool]:
    """Both variants from ONE ascending sort of all H values (the definition): (mask threshold v_(k*+1) or inf,
    cap c = τ'², active)."""
    ordered = np.sort(values.astype(np.float64))
    prefix = np.cumsum(ordered)
    ranks = np.arange(1, ordered.size + 1)
    k_mask = int((prefix <= tau * ranks).sum())
    threshold = ordered[k_mask] if k_mask < ordered.size else math.inf
    n = ordered.size
    k_cap = int(((prefix + (n - ranks) * ordered) <= tau * n).sum())
    below = prefix[k_cap - 1] if k_cap else 0.0
    active = bool(prefix[-1] > tau * n)
    cap = (tau * n - below) / max(n - k_cap, 1) if active else ordered[-1]
    return threshold, cap, active


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("tau", [1e-4, 0.04, 0.3, 10.0])
def test_sorting_only_the_tail_above_tau_gives_the_full_sort_cut(seed: int, tau: float) -> None:
    """m2po_mask / m2po_cap_bound sort only the H values ≥ τ; values exactly at τ and ties included."""
    gen = torch.Generator().manual_seed(seed)
    delta_sq = (torch.randn(10, 30, generator=gen, dtype=torch.float64) * 0.3) ** 2
    delta_sq[0, :4] = tau  # at τ exactly
    delta_sq[1, :6] = delta_sq[1, 6]  # ties
    region = (torch.rand(10, 30, generator=gen) < 0.6).double()
    values = delta_sq.numpy()[region.numpy() > 0]
    threshold, cap, active = full_sort_cut(values, tau)
    np.testing.assert_array_equal(m2po_mask(delta_sq, region, tau).numpy(),
                                  (region.numpy() > 0) & (delta_sq.numpy() >= threshold))
    bound, got_active = m2po_cap_bound(delta_sq, region, tau)
    assert bool(got_active) == active
    assert float(bound) == pytest.approx(math.sqrt(cap), rel=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_mask_variant_loss_and_gradient_equal_autograd_bit_for_bit(seed: int) -> None:
    """ℓ = keep·(−A·exp(keep·Δ)) written out and differentiated by autograd (the mask from ``m2po_mask``, tested
    against the brute-force loop above), log-ratios up to ±80: loss and gradient equal the objective's exactly."""
    from offpolicylab.diagnostics.stats import trust_region_mask
    from offpolicylab.objectives import TokenBatch
    from offpolicylab.objectives.aggregation import aggregate

    gen = torch.Generator().manual_seed(seed)
    behavior = torch.rand(16, 12, generator=gen).clamp_min(1e-6).log()
    scale = torch.tensor([0.05, 0.5, 60.0])[torch.randint(3, (16, 12), generator=gen)]
    logp0 = behavior + (torch.randn(16, 12, generator=gen) * scale).clamp(-80.0, 80.0)
    mask = (torch.arange(12)[None, :] < torch.randint(1, 13, (16, 1), generator=gen)).float()
    advantages = torch.randn(16, generator=gen).round()
    logp = logp0.clone().requires_grad_(True)
    batch = TokenBatch(logp=logp, behavior_logp=behavior, advantages=advantages, mask=mask)
    out = get_objective("m2po")(batch)
    (grad,) = torch.autograd.grad(out.loss, logp)

    reference = logp0.clone().requires_grad_(True)
    ref_batch = TokenBatch(logp=reference, behavior_logp=behavior, advantages=advantages, mask=mask)
    delta = ref_batch.delta()
    keep = 1.0 - m2po_mask(delta**2, trust_region_mask(delta, ref_batch.advantages, mask), 0.04)
    per_token = keep * (-ref_batch.advantages * torch.exp(keep * ref_batch.log_ratio))
    loss = aggregate(per_token, mask, "token-mean", finite_padding=True)
    (expected,) = torch.autograd.grad(loss, reference)
    assert keep.sum() < mask.numel()  # some tokens are masked
    assert torch.equal(out.loss.detach(), loss.detach()) and torch.equal(grad, expected)
