"""``recompute_split_k``: the old-log-prob recompute's linear maps as split-K GEMMs — the same exact products as
torch's 16-bit kernel, their fp32 sum in another order, rounded once.  References are NumPy float32 / float64 sums
written out here, not our own code."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from offpolicylab.behavior import sample_rollout
from offpolicylab.contracts import Prompts
from offpolicylab.policies.mixed_precision import split_k_gemms, split_k_linear
from offpolicylab.policies.transformer import TransformerPolicy

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def operands(dtype: torch.dtype, rows: int = 64, inner: int = 16, out: int = 24, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, inner, generator=generator).to(dtype)
    weight = (torch.randn(out, inner, generator=generator) / 4).to(dtype)
    bias = torch.randn(out, generator=generator).to(dtype)
    return x, weight, bias


@pytest.mark.parametrize("name", DTYPES)
def test_one_product_per_slice_is_the_sequential_fp32_sum_rounded_once(name):
    """k = the inner dimension: each slice holds one product x_j·w_j (exact in float32), so the result is
    dtype(((x_1 w_1 + x_2 w_2) + …) + b) with every addition in float32 — written out in NumPy, bit for bit."""
    dtype = DTYPES[name]
    x, weight, bias = operands(dtype)
    got = split_k_linear(x, weight, bias, x.shape[1], dtype)
    xs, ws, b = (t.float().numpy() for t in (x, weight, bias))
    total = np.zeros((xs.shape[0], ws.shape[0]), dtype=np.float32)
    for j in range(xs.shape[1]):
        total = total + np.outer(xs[:, j], ws[:, j]).astype(np.float32)
    total = total + b
    expected = torch.from_numpy(total).to(dtype)
    assert got.dtype == dtype
    assert torch.equal(got, expected)


@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("splits", [1, 4, 5])
def test_split_k_is_the_exact_sum_rounded_once_up_to_fp32_order(name, splits):
    """Against the float64 sum of the same products: |y − s| ≤ spacing(s) + (n + 1)·2⁻²⁴·(Σ|x_j w_j| + |b|) — one
    unit in the last place of the 16-bit dtype for the final rounding plus the textbook bound of n + 1 float32
    additions (Higham 2002, "Accuracy and Stability of Numerical Algorithms", §4.2), so only the fp32 accumulation
    order separates y from rounding s once — and y = dtype(s) on all but a small share; torch's own 16-bit
    ``linear`` is held to the same bound."""
    dtype = DTYPES[name]
    x, weight, bias = operands(dtype, rows=256, inner=64, out=96)
    exact = x.double() @ weight.double().T + bias.double()
    magnitude = x.double().abs() @ weight.double().abs().T + bias.double().abs()
    rounded = exact.to(dtype)
    spacing = torch.finfo(dtype).eps * exact.abs().clamp_min(torch.finfo(dtype).tiny)
    bound = spacing + (x.shape[1] + 1) * 2.0 ** -24 * magnitude
    for got in (split_k_linear(x, weight, bias, splits, dtype), torch.nn.functional.linear(x, weight, bias)):
        assert bool(((got.double() - exact).abs() <= bound).all())
        assert float((got != rounded).double().mean()) < 0.01


def test_the_mode_splits_16_bit_maps_only():
    """Inside ``split_k_gemms``: a bf16 ``nn.Linear`` and an fp32 one under bf16 autocast run as split_k_linear
    (bit for bit); an fp32 map outside autocast is torch's own, bit for bit."""
    x, weight, bias = operands(torch.bfloat16, rows=128, inner=64, out=32)
    layer = torch.nn.Linear(64, 32)
    with torch.no_grad():
        layer.weight.copy_(weight.float())
        layer.bias.copy_(bias.float())
    expected = split_k_linear(x, weight, bias, 4, torch.bfloat16)
    with torch.no_grad(), split_k_gemms(4):
        cast = torch.nn.Linear(64, 32).to(torch.bfloat16)
        cast.load_state_dict(layer.state_dict())
        assert torch.equal(cast(x), expected)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch.equal(layer(x.float()), expected)
        assert torch.equal(layer(x.float()), torch.nn.functional.linear(x.float(), layer.weight, layer.bias))


def _policy(**kwargs) -> TransformerPolicy:
    return TransformerPolicy(vocab_size=24, response_len=6, eos_id=3, max_prompt_len=3, d_model=32, num_layers=2,
                             num_heads=2, seed=1, trainer_precision="bf16", trainer_weights="cast", **kwargs)


def _prompts() -> Prompts:
    ids = torch.tensor([[5, 6, 7], [8, 9, 10], [11, 12, 13]])
    return Prompts(ids=ids, mask=torch.ones(3, 3), index=torch.arange(3))


def test_the_recompute_scores_its_micro_batches_with_split_k_and_training_does_not():
    """behavior_logp = each micro-batch's scoring forward inside split_k_gemms(4), written out here; the training
    forward (``score``) of the same policy is the option-free policy's, bit for bit; k = 1 is the plain recompute."""
    policy = _policy()
    policy.logp_micro_batch = 5
    policy.set_recompute_split_k(4)
    rollout = sample_rollout(policy, _prompts(), 4, 1.0, torch.Generator().manual_seed(0), "trainer")
    plain = _policy()
    with torch.no_grad():
        with split_k_gemms(4):
            parts = [plain.score(rollout.select(torch.arange(a, b)))[0] for a, b in ((0, 5), (5, 10), (10, 12))]
        assert torch.equal(rollout.behavior_logp, torch.cat(parts) * rollout.response_mask)
        assert torch.equal(policy.score(rollout)[0], plain.score(rollout)[0])
    plain.logp_micro_batch = 5
    again = sample_rollout(plain, _prompts(), 4, 1.0, torch.Generator().manual_seed(0), "trainer")
    with torch.no_grad():
        unsplit = torch.cat([plain.score(rollout.select(torch.arange(a, b)))[0]
                             for a, b in ((0, 5), (5, 10), (10, 12))])
    assert torch.equal(again.behavior_logp, unsplit * rollout.response_mask)


def test_refusals_say_what_is_valid(tmp_path, capsys):
    """docs/bad_input.md: split-K needs a 16-bit trainer, a recompute (logp_micro_batch > 0) and eager blocks."""
    from tests.cli.test_hostile_inputs import refused

    base = ["run", "--world", "token_mdp", "--objective", "grpo", "--policy", "transformer", "--policy-param",
            "init=random", "--updates", "2", "--out", str(tmp_path / "out")]
    err = refused([*base, "--policy-param", "recompute_split_k=4", "--policy-param", "logp_micro_batch=4"], capsys)
    assert "recompute_split_k=4 needs a 16-bit trainer_precision (bf16 or fp16), got fp32" in err
    err = refused([*base, "--policy-param", "recompute_split_k=4", "--policy-param", "trainer_precision=bf16"], capsys)
    assert "recompute_split_k=4 splits the old-log-prob recompute's GEMMs, but logp_micro_batch=0" in err
    err = refused([*base, "--policy-param", "recompute_split_k=4", "--policy-param", "trainer_precision=bf16",
                   "--policy-param", "logp_micro_batch=4", "--policy-param", "compiled=true"], capsys)
    assert "recompute_split_k=4 cannot run with compiled=true" in err
    err = refused([*base, "--policy-param", "recompute_split_k=0"], capsys)
    assert "recompute_split_k" in err
    assert not (tmp_path / "out").exists()
