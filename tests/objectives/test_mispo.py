"""MIS-PO golden values and the AC-MIS-PO acceptance controller on synthetic ratio streams."""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pytest
import torch

from offpolicylab.objectives import TokenBatch, get_objective
from offpolicylab.objectives.mispo import acceptance_quantile, target_acceptance
from tests.objectives._golden import log_ratio_batch

make_batch = partial(log_ratio_batch, behavior=-0.7)


# ------------------------------------------------------------------------------------------------------- MIS-PO
def test_mispo_hand_example() -> None:
    ln3 = math.log(3.0)
    delta = [
        [0.002, -0.002, 9.0],  # padded third token; log ρ = 0 → trajectory accepted, both tokens accepted
        [ln3, -ln3, 0.0],  # log ρ = 0 → accepted; r = 3 and r = 1/3 fall outside [0.5, 2]
        [0.01, 0.0, 0.0],  # log ρ = 0.00333 > log 1.001 → whole trajectory rejected
    ]
    mask = [[1, 1, 0], [1, 1, 1], [1, 1, 1]]
    adv = [1.5, -1.0, 2.0]
    batch, logp = make_batch(delta, adv, mask)
    out = get_objective("mispo")(batch)
    expected_keep = np.array([[1, 1, 0], [0, 0, 1], [0, 0, 0]], dtype=np.float32)
    np.testing.assert_array_equal(out.token_mask.numpy(), expected_keep)
    kept = -1.5 * math.exp(0.002) - 1.5 * math.exp(-0.002) + 1.0 * 1.0
    assert float(out.loss.detach()) == pytest.approx(kept / 8, rel=1e-6)
    assert float(out.metrics["tok_accept_rate"]) == pytest.approx(6 / 8)
    assert float(out.metrics["accept_rate"]) == pytest.approx(2 / 3)
    assert float(out.metrics["traj_bound"]) == pytest.approx(math.log(1.001), rel=1e-5)
    out.loss.backward()
    expected_grad = np.zeros((3, 3))
    expected_grad[0, 0] = -1.5 * math.exp(0.002) / 8
    expected_grad[0, 1] = -1.5 * math.exp(-0.002) / 8
    expected_grad[1, 2] = 1.0 / 8
    np.testing.assert_allclose(logp.grad.numpy(), expected_grad, rtol=1e-5, atol=1e-9)


def test_mispo_random_batch_against_numpy() -> None:
    gen = torch.Generator().manual_seed(4)
    delta = torch.randn(16, 10, generator=gen) * 0.01
    delta[::3] *= 60.0  # some tokens leave [0.5, 2]
    adv = torch.randn(16, generator=gen)
    mask = (torch.rand(16, 10, generator=gen) > 0.2).float()
    batch, _ = make_batch(delta, adv, mask)
    out = get_objective("mispo", tok_bounds=(0.6, 1.8), traj_bounds=(0.99, 1.005))(batch)
    d = delta.numpy().astype(np.float64)
    m = mask.numpy()
    log_rho = (d * m).sum(1) / np.maximum(m.sum(1), 1)
    keep = (np.exp(d) >= 0.6) & (np.exp(d) <= 1.8) & ((np.exp(log_rho) >= 0.99) & (np.exp(log_rho) <= 1.005))[:, None]
    keep &= m > 0
    expected = -(adv.numpy()[:, None] * np.exp(d) * keep).sum() / m.sum()
    assert 0 < keep.sum() < m.sum()
    np.testing.assert_array_equal(out.token_mask.numpy() > 0, keep)
    assert float(out.loss.detach()) == pytest.approx(expected, rel=1e-5)


def test_tuple_params_from_cli_strings() -> None:
    objective = get_objective("mispo", tok_bounds="0.5,2", traj_bounds="(0.9, 1.1)")
    assert objective.tok_bounds == (0.5, 2.0)
    assert objective.traj_bounds == (0.9, 1.1)


@pytest.mark.parametrize(
    "params", [{"tok_bounds": (2.0, 0.5)}, {"traj_bounds": "1.1,0.9"}, {"tok_bounds": "1,2,3"}, {"traj_bounds": (-1, 1)}]
)
def test_bad_bounds_raise(params: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(params))):
        get_objective("mispo", **params)


@pytest.mark.parametrize("name", ["mispo", "ac_mispo"])
def test_finite_at_extreme_log_ratios(name: str) -> None:
    batch, logp = make_batch([[50.0, -50.0, 50.0], [0.0, 0.0, 0.0]], [1.0, -1.0])
    objective = get_objective(name)
    objective.update(batch)
    out = objective(batch)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(logp.grad).all()
    assert logp.grad[0].abs().sum() == 0  # the ±50 trajectory is rejected, the on-policy one kept
    assert logp.grad[1].abs().sum() > 0


# ------------------------------------------------------------------------------------------ AC-MIS-PO controller
def test_target_schedule() -> None:
    """The paper's eq. 8, A*_k = a_start + (a_end − a_start)·min(k/K, 1), by hand for K = 200: update 1 already
    moves by 1/200 of the way (0.4 − 0.2/200 = 0.399), update K = 200 reaches a_end."""
    assert target_acceptance(1, 0.4, 0.2, 200) == pytest.approx(0.399)
    assert target_acceptance(100, 0.4, 0.2, 200) == pytest.approx(0.3)
    assert target_acceptance(199, 0.4, 0.2, 200) == pytest.approx(0.201)
    assert target_acceptance(200, 0.4, 0.2, 200) == pytest.approx(0.2)
    assert target_acceptance(900, 0.4, 0.2, 200) == pytest.approx(0.2)
    assert target_acceptance(1, 0.4, 0.2, 0) == pytest.approx(0.2)


def test_quantile_convention_accepts_target_share() -> None:
    z = torch.tensor([0.5, 0.1, 0.9, 0.3, 0.7, 0.2, 1.0, 0.4, 0.6, 0.8, 5.0, 5.0])
    valid = torch.tensor([True] * 10 + [False, False])
    for level, expected in [(0.4, 0.4), (0.2, 0.2), (0.7, 0.7), (0.35, 0.4), (1.0, 1.0), (0.01, 0.1)]:
        b = acceptance_quantile(z, valid, level)
        assert float(((z <= b) & valid).sum()) / 10 == pytest.approx(expected)


def stream_batch(gen: torch.Generator, sigma: float, n_seq: int = 2048, length: int = 4) -> TokenBatch:
    """Per-sequence log ρ ~ N(0, σ²): each token carries log ρ plus zero-mean noise that cancels over the valid
    tokens of its sequence; the last token of every other sequence is padding."""
    log_rho = torch.randn(n_seq, generator=gen) * sigma
    mask = torch.ones(n_seq, length)
    mask[::2, -1] = 0
    noise = torch.randn(n_seq, length, generator=gen) * 0.05 * mask
    noise = noise - (noise.sum(1, keepdim=True) / mask.sum(1, keepdim=True)) * mask
    delta = log_rho[:, None] + noise
    advantages = torch.randn(n_seq, generator=gen)
    return TokenBatch(logp=delta - 1.0, behavior_logp=torch.full_like(delta, -1.0), advantages=advantages, mask=mask)


def test_acceptance_tracks_schedule() -> None:
    gen = torch.Generator().manual_seed(0)
    objective = get_objective("ac_mispo")
    sigma = 0.01  # |N(0, σ²)| quantiles at 0.4 / 0.2: 0.0052 / 0.0025, inside [log 1.0002, log 1.01]
    errors = []
    for k in range(1, 321):
        batch = stream_batch(gen, sigma, length=2)
        objective.update(batch)
        assert objective.step == k
        target = target_acceptance(k, 0.4, 0.2, 200)
        # independent acceptance count from the raw stream: accepted iff |log ρ| ≤ b_k
        log_rho = (batch.log_ratio.sum(1) / batch.mask.sum(1)).abs()
        accepted = float((log_rho <= objective.bound.float()).float().mean())
        if k % 20 == 0:  # the objective's own metrics agree
            out = objective(batch)
            assert float(out.metrics["accept_target"]) == pytest.approx(target, rel=1e-6)
            assert float(out.metrics["accept_rate"]) == pytest.approx(accepted, abs=1e-6)
        if k > 40:  # after the EMA warm-up (β^40 ≈ 0.015)
            errors.append(abs(accepted - target))
    assert max(errors) < 0.05
    assert np.mean(errors) < 0.02


def test_bound_clamps() -> None:
    gen = torch.Generator().manual_seed(1)
    wide = get_objective("ac_mispo")
    narrow = get_objective("ac_mispo")
    for _ in range(100):
        wide.update(stream_batch(gen, sigma=0.2, n_seq=256))
        narrow.update(stream_batch(gen, sigma=1e-6, n_seq=256))
        assert math.log(1.0002) - 1e-12 <= float(wide.bound) <= math.log(1.01) + 1e-12
        assert math.log(1.0002) - 1e-12 <= float(narrow.bound) <= math.log(1.01) + 1e-12
    assert float(wide.bound) == pytest.approx(math.log(1.01), rel=1e-12)
    assert float(narrow.bound) == pytest.approx(math.log(1.0002), rel=1e-12)
    assert float(wide(stream_batch(gen, sigma=0.2, n_seq=256)).metrics["traj_bound"]) == pytest.approx(
        math.log(1.01), rel=1e-6
    )


def test_initial_bound_and_call_is_pure() -> None:
    gen = torch.Generator().manual_seed(2)
    objective = get_objective("ac_mispo")
    assert objective.state_dict() == {"k": 0, "b": pytest.approx(math.log(1.01))}
    batch = stream_batch(gen, sigma=0.01, n_seq=128)
    for _ in range(3):
        objective(batch)
    assert objective.state_dict() == {"k": 0, "b": pytest.approx(math.log(1.01))}
    objective.update(batch)
    state = objective.state_dict()
    assert state["k"] == 1 and state["b"] < math.log(1.01)
    assert isinstance(state["k"], int) and isinstance(state["b"], float)


def test_state_round_trip_continues_identically() -> None:
    gen = torch.Generator().manual_seed(3)
    original = get_objective("ac_mispo", warmup=30)
    for _ in range(25):
        original.update(stream_batch(gen, sigma=0.01, n_seq=256))
    restored = get_objective("ac_mispo", warmup=30)
    restored.load_state_dict(original.state_dict())
    assert restored.state_dict() == original.state_dict()
    for _ in range(15):
        batch = stream_batch(gen, sigma=0.01, n_seq=256)
        original.update(batch)
        restored.update(batch)
        out_a, out_b = original(batch), restored(batch)
        assert torch.equal(out_a.loss, out_b.loss)
        assert float(out_a.metrics["accept_target"]) == float(out_b.metrics["accept_target"])
        assert original.state_dict() == restored.state_dict()


@pytest.mark.parametrize("state", [{"k": 1}, {"k": -1, "b": 0.005}, {"k": 2, "b": 0.5}, {"k": 1.5, "b": 0.005}])
def test_bad_state_raises(state: dict) -> None:
    with pytest.raises(ValueError, match="ac_mispo state"):
        get_objective("ac_mispo").load_state_dict(state)


@pytest.mark.parametrize(
    "params", [{"b_min": 0.02, "b_max": 0.01}, {"a_start": 0.0}, {"ema": 1.0}, {"warmup": -1}, {"a_end": 1.5}]
)
def test_ac_bad_params_raise(params: dict) -> None:
    with pytest.raises(ValueError):
        get_objective("ac_mispo", **params)
