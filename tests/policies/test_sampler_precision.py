"""Reduced-precision samplers (``sampler_precision``): the sampler's log-prob of each drawn token is what a reference
computation in the stated precision gives — rounding by ml_dtypes / NumPy (independent of torch's casts), scales and
gathers written out here — the trainer's numbers stay the fp32 ones, and an fp32 sampler is today's sampler."""

from __future__ import annotations

import copy

import ml_dtypes
import numpy as np
import pytest
import torch
from torch import nn

from offpolicylab.contracts import Prompts
from offpolicylab.policies.precision import PRECISIONS, sampler_weights
from offpolicylab.policies.sequence_model import SequenceModelPolicy, StackedSequenceModelPolicy
from offpolicylab.policies.tabular import StackedTabularPolicy, TabularSoftmaxPolicy
from offpolicylab.policies.transformer import KVCache, TransformerPolicy
from offpolicylab.policies.transformer_stack import StackedTransformerPolicy

NUMPY_DTYPES = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp8_e4m3": ml_dtypes.float8_e4m3fn,
                "fp8_e5m2": ml_dtypes.float8_e5m2}
REDUCED = [p for p in PRECISIONS if p != "fp32"]


def np_fp8_round(x: np.ndarray, precision: str) -> np.ndarray:
    """s · fp8(x / s), s = max|row| / max_fp8 per row, in float32 (the scaled FP8 tensor of an inference engine)."""
    dtype = NUMPY_DTYPES[precision]
    largest = np.float32(float(ml_dtypes.finfo(dtype).max))
    x = x.astype(np.float32)
    scale = np.abs(x).max(-1, keepdims=True) / largest
    scale = np.where(scale > 0, scale, np.float32(1)).astype(np.float32)
    return np.clip(x / scale, -largest, largest).astype(dtype).astype(np.float32) * scale


def np_stored(table: np.ndarray, precision: str) -> np.ndarray:
    """The sampler's copy of a logits table / linear weight as float32 values of its compute dtype."""
    if precision.startswith("fp8"):
        return np_fp8_round(table, precision).astype(ml_dtypes.bfloat16).astype(np.float32)
    return table.astype(NUMPY_DTYPES[precision]).astype(np.float32)


def compute_dtype(precision: str) -> torch.dtype:
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.bfloat16)


def _tabular(precision: str, seed: int = 0, **kwargs) -> TabularSoftmaxPolicy:
    policy = TabularSoftmaxPolicy(num_prompts=3, vocab_size=6, response_len=4, eos_id=0, sampler_precision=precision,
                                  **kwargs)
    with torch.no_grad():
        policy.logits.copy_(3 * torch.randn(policy.logits.shape, generator=torch.Generator().manual_seed(seed)))
    return policy


def _prompts(n: int = 3) -> Prompts:
    return Prompts(ids=torch.zeros(n, 1, dtype=torch.long), mask=torch.ones(n, 1), index=torch.arange(n) % 3)


# ------------------------------------------------------------------------------------------------ tabular
@pytest.mark.parametrize("precision", REDUCED)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_tabular_sampler_logp_is_the_log_softmax_of_the_rounded_table_in_that_precision(
        precision: str, temperature: float) -> None:
    """ℓ_t = log softmax_p(θ̂[x, t, c_t] / τ)[y_t], θ̂ the table rounded by ml_dtypes (FP8: per logits vector).  The
    softmax is torch's kernel on those independently rounded logits (bit for bit), and within one unit in the last
    place of ℓ plus one unit roundoff u (2⁻⁸ bf16, 2⁻¹¹ fp16: the kernel rounds the normalising sum Σ e^z to the
    dtype) of the float64 log-softmax."""
    policy = _tabular(precision)
    rollout = policy.sample(_prompts(), 16, temperature, torch.Generator().manual_seed(1))
    table = np_stored(policy.logits.detach().numpy(), precision)
    dtype = compute_dtype(precision)
    ids, mask = rollout.response_ids.numpy(), rollout.response_mask.numpy()
    for row in range(ids.shape[0]):
        prompt = int(rollout.prompt_index[row])
        for t in range(ids.shape[1]):
            if not mask[row, t]:
                assert rollout.sampler_logp[row, t] == 0.0
                continue
            context = policy.vocab_size if t == 0 else ids[row, t - 1]
            z = torch.from_numpy(table[prompt, t, context]).to(dtype)
            if temperature != 1.0:
                z = z / temperature
            reference = torch.log_softmax(z, -1).float()[ids[row, t]]
            assert rollout.sampler_logp[row, t] == reference
            exact = z.double().numpy()
            exact = exact - exact.max() - np.log(np.exp(exact - exact.max()).sum())
            value = float(exact[ids[row, t]])
            bits = 8 if dtype == torch.bfloat16 else 11  # significand bits
            spacing = 2.0 ** (np.floor(np.log2(max(abs(value), 1e-30))) + 1 - bits)
            assert abs(float(reference) - value) <= spacing + 2.0 ** -bits


@pytest.mark.parametrize("precision", PRECISIONS)
def test_behavior_logp_stays_the_trainers_fp32_numbers_and_the_table_is_restored(precision: str) -> None:
    policy = _tabular(precision)
    before = policy.logits.detach().clone()
    rollout = policy.sample(_prompts(), 8, 1.0, torch.Generator().manual_seed(2))
    logp, _ = policy.score(rollout)
    assert torch.equal(rollout.behavior_logp, torch.where(rollout.response_mask > 0, logp.detach(), 0.0))
    assert policy.logits.dtype == torch.float32 and torch.equal(policy.logits.detach(), before)
    if precision == "fp32":
        assert rollout.sampler_logp is None
    else:
        gap = ((rollout.sampler_logp - rollout.behavior_logp).abs() * rollout.response_mask).sum()
        assert gap > 0


def test_fp32_sampler_is_todays_sampler_and_its_numbers_the_trainers() -> None:
    """At fp32 the engine is the trainer: the same draws and log-probs as a policy without the option, and the
    sampler's own numbers (``policy_logp=False``) equal the trainer's scoring to float tolerance for every toy
    policy (bit for bit for the table, whose sampling and scoring read the same rows)."""
    plain = _tabular("fp32")
    named = TabularSoftmaxPolicy(num_prompts=3, vocab_size=6, response_len=4, eos_id=0)
    named.load_state_dict(plain.state_dict())
    a = plain.sample(_prompts(), 8, 0.9, torch.Generator().manual_seed(3), policy_logp=False)
    b = named.sample(_prompts(), 8, 0.9, torch.Generator().manual_seed(3))
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.behavior_logp, b.behavior_logp)
    for policy, tolerance in ((plain, 0.0), (_gru("fp32"), 1e-5), (_transformer("fp32"), 1e-5)):
        rollout = policy.sample(_prompts(), 4, 0.9, torch.Generator().manual_seed(4), policy_logp=False)
        logp, _ = policy.score(rollout)
        assert rollout.sampler_logp is None
        assert ((logp.detach() - rollout.behavior_logp) * rollout.response_mask).abs().max() <= tolerance


# ------------------------------------------------------------------------------------------------ networks
def _transformer(precision: str, seed: int = 0) -> TransformerPolicy:
    return TransformerPolicy(vocab_size=12, response_len=5, eos_id=0, prompt_vocab_size=12, max_prompt_len=3,
                             d_model=16, num_layers=2, num_heads=2, seed=seed, sampler_precision=precision)


def _gru(precision: str, seed: int = 0) -> SequenceModelPolicy:
    policy = SequenceModelPolicy(vocab_size=6, response_len=4, eos_id=0, prompt_vocab_size=3, embed_dim=8,
                                 hidden_size=16, seed=seed, sampler_precision=precision)
    with torch.no_grad():  # a fresh head is zero (the uniform policy): give it logits to round
        policy.model.head.weight.normal_(0, 1, generator=torch.Generator().manual_seed(seed))
    return policy


def _reference_engine(policy: TransformerPolicy | SequenceModelPolicy, precision: str) -> nn.Module:
    """The sampler's network built independently: a copy converted by ``Module.to(dtype)``; for FP8 every
    linear weight replaced by its ml_dtypes rounding and a hook that rounds each linear input likewise."""
    model = copy.deepcopy(policy.model).to(compute_dtype(precision))
    if precision.startswith("fp8"):
        def hook(module: nn.Module, args: tuple) -> tuple:
            x = args[0]
            rounded = np_fp8_round(x.detach().float().numpy(), precision)
            return (torch.from_numpy(rounded).to(x.dtype), *args[1:])

        originals = dict(policy.model.named_parameters())
        for name, module in model.named_modules():
            weights = ["weight"] if isinstance(module, nn.Linear) else (
                [n for n, _ in module.named_parameters(recurse=False) if n.startswith("weight_")]
                if isinstance(module, nn.GRU) else [])
            for weight in weights:
                full = originals[f"{name}.{weight}"].detach().numpy()
                getattr(module, weight).data = torch.from_numpy(np_stored(full, precision)).to(torch.bfloat16)
            if weights:
                module.register_forward_pre_hook(hook)
    return model


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2"])
def test_transformer_sampler_logp_equals_its_network_run_in_that_precision(precision: str) -> None:
    """The KV-cached sampler's ℓ_t = log softmax_p(z_t^p / τ)[y_t] with z^p from the reference network (the model
    converted by ``Module.to``, FP8 rounding by ml_dtypes), decoded over the drawn tokens: bit for bit."""
    policy = _transformer(precision)
    prompts = Prompts(ids=torch.tensor([[1, 2, 3], [4, 5, 6]]), mask=torch.tensor([[0.0, 1, 1], [1, 1, 1]]),
                      index=torch.arange(2))
    rollout = policy.sample(prompts, 3, 0.8, torch.Generator().manual_seed(5))
    reference = copy.copy(policy)
    reference.model = _reference_engine(policy, precision)
    ids, state = rollout.response_ids, KVCache()
    for t in range(policy.response_len):
        with torch.no_grad():
            logits = reference.next_logits(state, rollout.prompt_ids, rollout.prompt_mask, rollout.prompt_index, ids,
                                           t)
        assert logits.dtype == compute_dtype(precision)
        expected = torch.log_softmax(logits / 0.8, -1).float().gather(1, ids[:, t:t + 1]).squeeze(1)
        alive = rollout.response_mask[:, t] > 0
        assert torch.equal(rollout.sampler_logp[alive, t], expected[alive])
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())
    logp, _ = policy.score(rollout)
    assert torch.equal(rollout.behavior_logp, torch.where(rollout.response_mask > 0, logp.detach(), 0.0))


@pytest.mark.parametrize("precision", ["bf16", "fp8_e4m3"])
def test_gru_sampler_logp_equals_its_network_run_in_that_precision(precision: str) -> None:
    """As for the transformer (the GRU's fused kernel in bf16; its gate matrices and input sequence through FP8)."""
    policy = _gru(precision)
    rollout = policy.sample(_prompts(2), 4, 1.0, torch.Generator().manual_seed(6))
    reference = copy.copy(policy)
    reference.model = _reference_engine(policy, precision)
    with torch.no_grad():
        logits = reference.response_logits(rollout.prompt_ids, rollout.prompt_mask, rollout.prompt_index,
                                           rollout.response_ids)
    expected = torch.log_softmax(logits, -1).float().gather(-1, rollout.response_ids[..., None]).squeeze(-1)
    assert torch.equal(rollout.sampler_logp, torch.where(rollout.response_mask > 0, expected, 0.0))


def test_the_mismatch_grows_as_the_precision_falls() -> None:
    """Mean |ℓ_sampler − ℓ_trainer| of the same tokens: fp16 < bf16 < fp8 E4M3 < fp8 E5M2 (2, 3 and 4 mantissa
    bits fewer each), the order of the formats' unit roundoffs 2⁻¹¹, 2⁻⁸, 2⁻⁴, 2⁻³."""
    gaps = {}
    for precision in REDUCED:
        policy = _transformer(precision, seed=1)
        rollout = policy.sample(_prompts(), 16, 1.0, torch.Generator().manual_seed(7))
        mask = rollout.response_mask
        gaps[precision] = float(((rollout.sampler_logp - rollout.behavior_logp).abs() * mask).sum() / mask.sum())
    assert 0 < gaps["fp16"] < gaps["bf16"] < gaps["fp8_e4m3"] < gaps["fp8_e5m2"]


def test_sampler_weights_restores_the_trainers_tensors_even_after_an_error() -> None:
    policy = _gru("fp8_e4m3")
    before = {name: (param, param.detach().clone()) for name, param in policy.model.named_parameters()}
    with pytest.raises(RuntimeError, match="inside"), sampler_weights(policy.model, "fp8_e4m3"):
        assert policy.model.gru.weight_ih_l0.dtype == torch.bfloat16
        raise RuntimeError("inside")
    for name, param in policy.model.named_parameters():
        assert param is before[name][0] and torch.equal(param, before[name][1]), name
    assert not policy.model.head._forward_pre_hooks and not policy.model.gru._forward_pre_hooks


# ------------------------------------------------------------------------------------------------ batched seeds
@pytest.mark.parametrize("precision", ["bf16", "fp8_e4m3"])
def test_stacked_transformer_and_table_sample_what_each_member_samples_alone(precision: str) -> None:
    """Per-row rounding scales and per-block kernels: each seed's tokens and both log-probs are its own, bit for
    bit."""
    for make, stack in ((_transformer, StackedTransformerPolicy), (_tabular, StackedTabularPolicy)):
        members = [make(precision, seed=s) for s in (3, 4)]
        alone = [make(precision, seed=s) for s in (3, 4)]
        stacked = stack(members)
        prompts = _prompts(2)
        joined = Prompts(prompts.ids.repeat(2, 1), prompts.mask.repeat(2, 1), prompts.index.repeat(2))
        together = stacked.sample(joined, 3, 1.0, [torch.Generator().manual_seed(20 + s) for s in range(2)])
        for s, member in enumerate(alone):
            own = member.sample(prompts, 3, 1.0, torch.Generator().manual_seed(20 + s))
            block = slice(6 * s, 6 * (s + 1))
            for name in ("response_ids", "sampler_logp"):
                assert torch.equal(getattr(together, name)[block], getattr(own, name)), (make.__name__, name)
            assert (together.behavior_logp[block] - own.behavior_logp).abs().max() <= 1e-6


def test_stacked_policies_refuse_members_of_other_precisions_and_the_gru_any_reduced_one() -> None:
    with pytest.raises(ValueError, match="sampler precision"):
        StackedTransformerPolicy([_transformer("bf16", 1), _transformer("fp32", 2)])
    with pytest.raises(ValueError, match="sampler precision"):
        StackedTabularPolicy([_tabular("bf16"), _tabular("fp16")])
    with pytest.raises(ValueError, match="batched sequence_model seeds need sampler_precision=fp32, got 'bf16'"):
        StackedSequenceModelPolicy([_gru("bf16", 1), _gru("bf16", 2)])


def test_an_unknown_precision_is_refused_naming_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="sampler_precision must be one of fp32, bf16, fp16, fp8_e4m3, fp8_e5m2"):
        _tabular("fp4")
