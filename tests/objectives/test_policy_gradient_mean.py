"""REINFORCE's ``token-mean`` loss computed directly (``policy_gradient_mean``: one product and one sum forward, one
product backward) against (1) the written-out form ``aggregate(-A * logp, m, "token-mean")`` differentiated by
autograd — loss and gradient bit for bit, per run block too — and (2) the definition in float64 NumPy:
L = −Σ_valid A·log π / n, ∂L/∂log π = −A·m / n."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import Tensor

from offpolicylab.objectives import AGG_CHOICES, TokenBatch, aggregate, get_objective
from offpolicylab.objectives.policy_gradient import Reinforce, policy_gradient_mean


def ragged(seed: int, dtype: torch.dtype, rows: int = 12, length: int = 33) -> dict[str, Tensor]:
    """Ragged batch with garbage (inf / nan) in the padding, an empty row and zero advantages in one group."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (rows,), generator=gen)
    lengths[rows // 3] = 0
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(dtype)
    garbage = torch.tensor([math.inf, -math.inf, math.nan], dtype=dtype)[torch.randint(0, 3, (rows, length),
                                                                                     generator=gen)]
    logp = torch.where(mask > 0, torch.log(torch.rand(rows, length, generator=gen, dtype=dtype)), garbage)
    advantages = torch.randn(rows, generator=gen, dtype=dtype)
    advantages[:3] = 0.0
    return {"logp": logp, "behavior_logp": torch.where(mask > 0, logp.nan_to_num() - 0.1, garbage),
            "advantages": advantages, "mask": mask,
            "entropy": torch.where(mask > 0, torch.rand(rows, length, generator=gen, dtype=dtype), garbage)}


def loss_and_grad(fields: dict[str, Tensor], compute, runs: int = 1) -> tuple[Tensor, Tensor]:
    leaf = fields["logp"].clone().requires_grad_(True)
    batch = TokenBatch(**{**fields, "logp": leaf}, runs=runs)
    loss = compute(batch)
    loss.sum().backward()
    return loss.detach(), leaf.grad


def written_out(batch: TokenBatch) -> Tensor:
    return aggregate(-batch.advantages * batch.logp, batch.mask, "token-mean", finite_padding=True,
                     blocks=batch.runs)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("runs", [1, 2, 4])
def test_direct_loss_equals_the_written_out_form_bit_for_bit(seed: int, dtype: torch.dtype, runs: int) -> None:
    fields = ragged(seed, dtype)
    want_loss, want_grad = loss_and_grad(fields, written_out, runs)
    got_loss, got_grad = loss_and_grad(
        fields, lambda b: policy_gradient_mean(b.logp, b.advantages, b.tokens(), b.runs), runs)
    assert want_loss.shape == got_loss.shape == (() if runs == 1 else (runs,))
    assert torch.equal(got_loss, want_loss)
    assert torch.equal(got_grad, want_grad)
    objective = get_objective("reinforce")
    obj_loss, obj_grad = loss_and_grad(fields, lambda b: objective(b).loss, runs)
    assert torch.equal(obj_loss, want_loss) and torch.equal(obj_grad, want_grad)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("runs", [1, 3])
def test_direct_loss_equals_the_numpy_definition(seed: int, runs: int) -> None:
    fields = ragged(seed, torch.float32)
    loss, grad = loss_and_grad(fields, lambda b: get_objective("reinforce")(b).loss, runs)
    mask = fields["mask"].double().numpy()
    logp = np.where(mask > 0, fields["logp"].double().numpy(), 0.0)
    advantages = fields["advantages"].double().numpy()[:, None] * mask
    rows = mask.shape[0] // runs
    for run in range(runs):
        part = slice(run * rows, (run + 1) * rows)
        n = max(mask[part].sum(), 1.0)
        want = -(advantages[part] * logp[part]).sum() / n
        assert float(loss.reshape(runs)[run]) == pytest.approx(want, rel=1e-5, abs=1e-7)
        np.testing.assert_allclose(grad[part].double().numpy(), -advantages[part] / n, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("agg", AGG_CHOICES)
def test_every_aggregation_and_regularization_gives_the_written_out_loss(agg: str) -> None:
    """Only ``token-mean`` (and its TRL names) takes the direct form; every mode, with the KL penalty and the entropy
    bonus added, equals the objective whose direct form is switched off, bit for bit (metrics included)."""
    fields = ragged(7, torch.float32)
    fields["ref_logp"] = fields["behavior_logp"] + 0.05
    fields["entropy"] = fields["entropy"].nan_to_num(posinf=0.0, neginf=0.0)
    params = {"agg": agg, "kl_coef": 0.1, "entropy_coef": 0.01}

    class Written(Reinforce):
        def aggregated_loss(self, batch: TokenBatch) -> None:
            return None

    outputs = []
    for objective in (get_objective("reinforce", **params), Written(**params)):
        leaf = fields["logp"].clone().requires_grad_(True)
        entropy = fields["entropy"].clone().requires_grad_(True)
        out = objective(TokenBatch(**{**fields, "logp": leaf, "entropy": entropy}))
        out.loss.backward()
        outputs.append((out, leaf.grad, entropy.grad))
    (direct, grad, entropy_grad), (plain, plain_grad, plain_entropy_grad) = outputs
    assert torch.equal(direct.loss, plain.loss)
    assert torch.equal(grad, plain_grad) and torch.equal(entropy_grad, plain_entropy_grad)
    assert direct.metrics.keys() == plain.metrics.keys()
    assert all(torch.equal(direct.metrics[key], plain.metrics[key]) for key in plain.metrics)
    assert torch.equal(direct.token_mask, plain.token_mask)


def test_a_mismatch_correction_takes_the_per_token_form() -> None:
    """With ``tis_cap`` (and a batch with ``sampler_logp``) the per-token loss is weighted before it is aggregated:
    the direct form is not used, and the loss is the TIS-weighted one."""
    fields = ragged(3, torch.float64)
    fields["sampler_logp"] = fields["behavior_logp"] - 0.2
    leaf = fields["logp"].clone().requires_grad_(True)
    batch = TokenBatch(**{**fields, "logp": leaf})
    loss = get_objective("reinforce", tis_cap=2.0)(batch).loss
    weight = torch.exp(batch.behavior_logp - batch.sampler_logp).clamp(max=2.0)
    want = aggregate(-batch.advantages * batch.logp.detach() * weight, batch.mask, finite_padding=True)
    assert torch.equal(loss.detach(), want)
