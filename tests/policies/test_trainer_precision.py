"""The transformer's ``trainer_precision`` (autocast forwards, fp32 master weights, fp16 loss scaling) and
``lm_head_fp32``: gradients against an fp32 reference within the dtype's unit roundoff, log-probs normalised in fp32
from the 16-bit logits, the loss scaler skipping a step whose gradient overflows, and fp32 left as it was."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from offpolicylab.contracts import Prompts
from offpolicylab.policies.mixed_precision import UNIT_ROUNDOFF
from offpolicylab.policies.transformer import TransformerPolicy
from offpolicylab.policies.transformer_stack import StackedTransformerPolicy
from offpolicylab.trainer import scaled_step

VOCAB, WIDTH, LAYERS = 32, 8, 2
#: rounding sites in series along a path through the network: per block six products (qkv, q·kᵀ, attention·v, out,
#: two MLP maps), each rounding its two operands and its output (3 sites), and the head (3): 6·3·L + 3
SITES = 6 * 3 * LAYERS + 3


def policy(precision: str = "fp32", **kwargs) -> TransformerPolicy:
    return TransformerPolicy(vocab_size=VOCAB, response_len=WIDTH, max_prompt_len=4, d_model=32, num_layers=LAYERS,
                             num_heads=4, seed=3, trainer_precision=precision, **kwargs)


@pytest.fixture(scope="module")
def rollout():
    generator = torch.Generator().manual_seed(0)
    prompts = Prompts(ids=torch.randint(0, VOCAB, (4, 4), generator=generator), mask=torch.ones(4, 4),
                      index=torch.arange(4))
    return policy().sample(prompts, 4, 1.0, generator)


def gradient(precision: str, rollout, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """(the flat gradient of −mean(A · log π), log π) of a fresh policy in ``precision``."""
    net = policy(precision, **kwargs)
    advantages = torch.linspace(-1.0, 1.0, len(rollout))[:, None]
    logp, _ = net.score(rollout)
    (-(logp * advantages * rollout.response_mask).mean()).backward()
    grads = [p.grad for p in net.trainable_parameters()]
    assert all(g.dtype == torch.float32 for g in grads)  # fp32 master weights get fp32 gradients
    return torch.cat([g.flatten() for g in grads]), logp.detach()


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_gradient_matches_fp32_within_the_dtypes_unit_roundoff(precision, rollout):
    """First order, each of the SITES roundings in series perturbs by a relative δ_i with |δ_i| ≤ u; independent
    roundings add in quadrature, so ‖g − g₃₂‖ / ‖g₃₂‖ ≈ √SITES · u (6.2 u here): the bound is √SITES · u rounded up to
    8 u, and a 16-bit path must round at all (more than u / 8, where fp32 would give ≈ 1e-7)."""
    reference, _ = gradient("fp32", rollout)
    grad, _ = gradient(precision, rollout)
    u = UNIT_ROUNDOFF[precision]
    error = float((grad - reference).norm() / reference.norm())
    assert 8 * u >= math.sqrt(SITES) * u
    assert u / 8 < error < 8 * u, (precision, error / u)


def test_log_softmax_runs_in_fp32_from_16_bit_logits(rollout):
    """logp = log_softmax(float32(z))[y] with z the bf16 logits: the normalisation is not rounded to bf16."""
    net = policy("bf16")
    with torch.no_grad():
        logits = net.response_logits(rollout.prompt_ids, rollout.prompt_mask, rollout.prompt_index,
                                     rollout.response_ids)
        logp, _ = net.score(rollout)
    assert logits.dtype == torch.bfloat16
    expected = torch.log_softmax(logits.double(), -1).gather(-1, rollout.response_ids[..., None]).squeeze(-1)
    assert torch.allclose(logp.double(), expected, atol=4 * 2.0 ** -24 * 8, rtol=0)  # fp32 rounding only


def test_lm_head_fp32_gives_fp32_logits_of_the_rounded_body(rollout):
    """lm_head_fp32: z = W h + b in fp32 from the body's (autocast) hidden state h."""
    net = policy("bf16", lm_head_fp32=True)
    args = (rollout.prompt_ids, rollout.prompt_mask, rollout.prompt_index, rollout.response_ids)
    with torch.no_grad():
        logits = net.response_logits(*args)
        prompt, real = net._prompt(rollout.prompt_ids, rollout.prompt_mask)
        tokens = torch.cat([prompt, rollout.response_ids[:, :-1]], dim=1)
        mask = torch.cat([real, torch.ones_like(rollout.response_ids[:, :-1], dtype=torch.bool)], dim=1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = net.model(tokens, mask)[:, prompt.shape[1] - 1:]
        head = net.model.head
        expected = hidden.double() @ head.weight.double().T + head.bias.double()
    assert logits.dtype == torch.float32
    assert torch.allclose(logits.double(), expected, atol=1e-4, rtol=1e-5)
    assert not torch.equal(logits, policy("bf16").response_logits(*args).float())  # the head is not rounded


def test_lm_head_fp32_sampler_applies_the_fp32_head_to_the_16_bit_body(rollout):
    """MiniMax-M1's fix in the sampler too: inside the bf16 engine the body's weights are bf16 and the head's stay
    fp32; the first step's logits are z = W h + b in fp32 (h the bf16 body's hidden state, W, b the fp32 head), and
    the engine's log-probs are the fp32 log-softmax of z, not of z rounded to bf16."""
    net = policy("bf16", lm_head_fp32=True, sampler_precision="bf16")
    head = net.model.head
    weight, bias = head.weight.detach().double().clone(), head.bias.detach().double().clone()
    ids, mask, index = rollout.prompt_ids[:4], rollout.prompt_mask[:4], rollout.prompt_index[:4]
    with torch.no_grad(), net.sampler_engine():
        assert head.weight.dtype == torch.float32 and net.model.token.weight.dtype == torch.bfloat16
        prompt, real = net._prompt(ids, mask)
        hidden = net.model(prompt, real)[:, -1]
        logits = net.next_logits(net.start_decoding(ids, mask, index), ids, mask, index,
                                 torch.zeros(4, WIDTH, dtype=torch.long), 0)
    assert hidden.dtype == torch.bfloat16 and logits.dtype == torch.float32
    expected = hidden.double() @ weight.T + bias
    assert torch.allclose(logits.double(), expected, atol=1e-5, rtol=1e-6)
    assert float((expected - expected.to(torch.bfloat16).double()).abs().max()) > 1e-4  # bf16 would round them
    assert all(p.dtype == torch.float32 for p in net.model.parameters())  # the trainer's weights are back
    prompts = Prompts(ids=ids, mask=mask, index=index)
    sampled = net.sample(prompts, 1, 1.0, torch.Generator().manual_seed(1))
    first = torch.log_softmax(expected, -1).gather(1, sampled.response_ids[:, :1]).squeeze(1)
    assert torch.allclose(sampled.sampler_logp[:, 0].double(), first, atol=2e-6, rtol=0)


def test_lm_head_fp32_changes_nothing_in_an_fp32_sampler(rollout):
    """With sampler_precision=fp32 the head is fp32 already: the same draws and log-probs bit for bit."""
    prompts = Prompts(ids=rollout.prompt_ids[:4], mask=rollout.prompt_mask[:4], index=rollout.prompt_index[:4])
    plain = policy("bf16").sample(prompts, 2, 1.0, torch.Generator().manual_seed(2))
    fixed = policy("bf16", lm_head_fp32=True).sample(prompts, 2, 1.0, torch.Generator().manual_seed(2))
    assert torch.equal(plain.response_ids, fixed.response_ids)
    assert torch.equal(plain.sampler_logp, fixed.sampler_logp)


def test_fp32_is_the_plain_forward(rollout):
    """trainer_precision=fp32 runs no autocast: the same numbers as a policy built without the option."""
    plain = TransformerPolicy(vocab_size=VOCAB, response_len=WIDTH, max_prompt_len=4, d_model=32, num_layers=LAYERS,
                              num_heads=4, seed=3)
    with torch.no_grad():
        assert torch.equal(plain.score(rollout)[0], policy("fp32").score(rollout)[0])
    assert policy("fp32").loss_scaler is None and policy("bf16").loss_scaler is None


def _stack_of(net: TransformerPolicy) -> SimpleNamespace:
    optimizer = torch.optim.AdamW(net.trainable_parameters(), lr=1e-3)
    return SimpleNamespace(optimizer=optimizer, config=SimpleNamespace(grad_clip=1.0),
                           clip_gradients=lambda clip: [torch.nn.utils.clip_grad_norm_(net.trainable_parameters(),
                                                                                       clip)])


def _scaled_update(net: TransformerPolicy, stack: SimpleNamespace, rollout, factor: float):
    stack.optimizer.zero_grad(set_to_none=True)
    logp, _ = net.score(rollout)
    loss = -(logp * rollout.response_mask).mean() * factor
    output = SimpleNamespace(loss=loss)
    return scaled_step(stack, net.loss_scaler, loss[None], [output], [[]], [rollout], None)


def test_loss_scaler_skips_an_overflowing_step_and_halves_the_scale(rollout):
    """GradScaler semantics: S = 2¹⁶ at first; a loss whose scaled gradient overflows fp16 (the autocast backward
    holds S · ∂loss in fp16, max 65504) leaves every weight as it was, halves S and does not stop the run; the next
    finite step moves the weights and keeps S."""
    net = policy("fp16")
    stack = _stack_of(net)
    before = [p.detach().clone() for p in net.trainable_parameters()]
    (step,) = _scaled_update(net, stack, rollout, 1e6)
    assert step.finite and not math.isfinite(float(step.grad_norm))
    assert all(torch.equal(a, p) for a, p in zip(before, net.trainable_parameters(), strict=True))
    assert net.loss_scaler.get_scale() == 2.0 ** 15
    (step,) = _scaled_update(net, stack, rollout, 1.0)
    assert step.finite and math.isfinite(float(step.grad_norm))
    assert not all(torch.equal(a, p) for a, p in zip(before, net.trainable_parameters(), strict=True))
    assert net.loss_scaler.get_scale() == 2.0 ** 15
    state = net.state_dict()  # the scale travels with the checkpoint
    resumed = policy("fp16")
    resumed.load_state_dict(state)
    assert resumed.loss_scaler._init_scale == 2.0 ** 15
    assert set(policy("fp32").state_dict()) == {k for k in state if not k.startswith("loss_scaler.")}


def test_scaled_gradient_is_the_unscaled_one(rollout):
    """Multiplying the loss by S = 2ᵏ and the gradient by 1/S is exact unless fp16 under- or overflows: the scaled
    step's clipped gradient equals the unscaled fp16 backward's within fp16's unit roundoff."""
    net = policy("fp16")
    stack = _stack_of(net)
    stack.optimizer.step = lambda: None  # keep the gradients for the comparison
    net.loss_scaler.step = lambda optimizer: None
    _scaled_update(net, stack, rollout, 1.0)
    scaled = torch.cat([p.grad.flatten() for p in net.trainable_parameters()])
    plain = policy("fp16")
    logp, _ = plain.score(rollout)
    (-(logp * rollout.response_mask).mean()).backward()
    unscaled = torch.cat([p.grad.flatten() for p in plain.trainable_parameters()])
    unscaled = unscaled * min(1.0, 1.0 / (float(unscaled.norm()) + 1e-6))  # clip_grad_norm_ at 1
    assert float((scaled - unscaled).norm() / unscaled.norm()) < UNIT_ROUNDOFF["fp16"]


def test_batched_seeds_refuse_a_16_bit_trainer():
    with pytest.raises(ValueError, match="trainer_precision=fp32"):
        StackedTransformerPolicy([policy("bf16"), policy("bf16")])


def test_cli_refuses_batched_16_bit_seeds_and_an_unknown_precision(tmp_path, capsys):
    """docs/bad_input.md: exit code 2, the one-line message, nothing written."""
    from tests.cli.test_hostile_inputs import refused

    base = ["run", "--world", "token_mdp", "--objective", "grpo", "--policy", "transformer", "--policy-param",
            "init=random", "--updates", "2", "--out", str(tmp_path / "out")]
    err = refused([*base, "--policy-param", "trainer_precision=bf16", "--seeds", "0,1"], capsys)
    assert "batched transformer seeds need trainer_precision=fp32, lm_head_fp32=false and logp_micro_batch=0" in err
    err = refused([*base, "--policy-param", "trainer_precision=fp8"], capsys)
    assert "trainer_precision" in err and "fp32, bf16, fp16" in err
    assert not (tmp_path / "out").exists()


#: ``trainer_weights=cast`` rounds, besides the SITES of the autocast path, every weight of each product (one more
#: site per product: 6·L + 1), the two embeddings and their sum (3), each LayerNorm's output (2·L + 1), each residual
#: sum (2·L), each attention softmax and GELU output (2·L): 6·4·L + 4 + 3 + 2·L + 1 + 2·L + 2·L
CAST_SITES = 6 * 4 * LAYERS + 4 + 3 + 6 * LAYERS + 1


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_cast_weights_gradient_matches_fp32_within_the_dtypes_unit_roundoff(precision, rollout):
    """As for the autocast path, with CAST_SITES roundings in series: ‖g − g₃₂‖ / ‖g₃₂‖ ≈ √CAST_SITES · u (8.2 u
    here), bounded by 9 u, and more than u / 8."""
    reference, _ = gradient("fp32", rollout)
    grad, _ = gradient(precision, rollout, trainer_weights="cast")
    u = UNIT_ROUNDOFF[precision]
    error = float((grad - reference).norm() / reference.norm())
    assert 9 * u >= math.sqrt(CAST_SITES) * u
    assert u / 8 < error < 9 * u, (precision, error / u)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_cast_weights_is_the_network_run_in_the_16_bit_dtype(precision, rollout):
    """trainer_weights=cast: the logits and the gradient are those of a copy of the network whose every weight is
    stored in the 16-bit dtype (``Module.to(dtype)``, no autocast), bit for bit; the fp32 masters get that copy's
    gradient converted to fp32 and stay fp32."""
    net = policy(precision, trainer_weights="cast")
    copy = policy("fp32")
    copy.model.load_state_dict(net.model.state_dict())
    copy.model.to(torch.float16 if precision == "fp16" else torch.bfloat16)
    logp, _ = net.score(rollout)
    reference, _ = copy.score(rollout)
    assert torch.equal(logp, reference)
    logp.sum().backward()
    reference.sum().backward()
    for master, low in zip(net.trainable_parameters(), copy.trainable_parameters(), strict=True):
        assert master.dtype == torch.float32 and master.grad.dtype == torch.float32
        assert torch.equal(master.grad, low.grad.float())


def test_cast_weights_differ_from_autocast_on_the_master_weights(rollout):
    """The residual stream and LayerNorms round under cast, not under autocast alone: the two 16-bit forwards give
    different log-probs, each within bf16's rounding of fp32's."""
    with torch.no_grad():
        full = policy("fp32").score(rollout)[0]
        master = policy("bf16").score(rollout)[0]
        cast = policy("bf16", trainer_weights="cast").score(rollout)[0]
    assert not torch.equal(master, cast)
    for logp in (master, cast):
        assert 0 < float((logp - full).abs().max()) < 1.0


def test_cast_weights_with_an_fp32_trainer_is_refused(tmp_path, capsys):
    """docs/bad_input.md: cast needs a 16-bit trainer_precision; an unknown value names the valid ones."""
    from tests.cli.test_hostile_inputs import refused

    with pytest.raises(ValueError, match="trainer_weights=cast needs a 16-bit trainer_precision"):
        policy("fp32", trainer_weights="cast")
    base = ["run", "--world", "token_mdp", "--objective", "grpo", "--policy", "transformer", "--policy-param",
            "init=random", "--updates", "2", "--out", str(tmp_path / "out")]
    err = refused([*base, "--policy-param", "trainer_weights=cast"], capsys)
    assert "trainer_weights=cast needs a 16-bit trainer_precision (bf16 or fp16), got fp32" in err
    err = refused([*base, "--policy-param", "trainer_weights=fsdp"], capsys)
    assert "trainer_weights" in err and "master, cast" in err
    assert not (tmp_path / "out").exists()


def test_logit_offset_leaves_fp32_log_probs_and_moves_16_bit_rounding(rollout):
    """logit_offset = c: every logit + c (the head's bias), so fp32 log-probs are unchanged up to fp32 rounding at
    |z| ≈ 40 (ulp 2⁻¹⁹ ≈ 3.8e-6); bf16 logits ≥ 32 then lie on bf16's grid there, multiples of 0.25."""
    from offpolicylab.policies import make_policy
    from offpolicylab.worlds import make_world

    args = (rollout.prompt_ids, rollout.prompt_mask, rollout.prompt_index, rollout.response_ids)
    plain, shifted = policy("fp32"), policy("fp32")
    shifted.shift_logits(40.0)
    with torch.no_grad():
        assert torch.allclose(shifted.response_logits(*args).double() - plain.response_logits(*args).double(),
                              torch.full((), 40.0, dtype=torch.float64), atol=1e-5, rtol=0)
        assert float((shifted.score(rollout)[0] - plain.score(rollout)[0]).abs().max()) < 2e-5
        low = policy("bf16", trainer_weights="cast")
        low.shift_logits(40.0)
        logits = low.response_logits(*args).double()
    assert bool((logits >= 32).all()) and bool((logits < 64).all())
    assert torch.equal(torch.remainder(logits, 0.25), torch.zeros_like(logits))
    world = make_world("token_mdp")
    built = make_policy("transformer", world, init="random", logit_offset=2.5)
    reference = make_policy("transformer", world, init="random")
    assert torch.equal(built.model.head.bias, reference.model.head.bias + 2.5)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_score_padding_longest_scores_the_valid_tokens_as_the_full_length_does(rollout, precision, temperature):
    """score_padding=longest runs the forward over the rows' longest response only (here 5 of 8 positions); causal
    attention makes the valid tokens the same function, so log π, the entropy and the gradient agree with the
    full-length forward's on them (bit for bit on this CPU; within fp32 rounding in general), and the positions
    beyond are 0."""
    lengths = torch.tensor([3, 5, 2, 5] * (len(rollout) // 4))
    mask = (torch.arange(WIDTH)[None, :] < lengths[:, None]).float()
    short = rollout.with_(response_mask=mask, temperature=temperature)
    weights = {"trainer_weights": "cast"} if precision != "fp32" else {}
    full, cut = policy(precision, **weights), policy(precision, **weights)
    cut.score_padding = "longest"
    (logp_full, entropy_full), (logp_cut, entropy_cut) = full.score(short), cut.score(short)
    valid = mask > 0
    assert torch.allclose(logp_cut[valid], logp_full[valid], atol=1e-6, rtol=0)
    assert torch.allclose(entropy_cut[valid], entropy_full[valid], atol=1e-6, rtol=0)
    assert torch.equal(logp_cut[:, 5:], torch.zeros_like(logp_cut[:, 5:]))
    (logp_full * mask).sum().backward()
    (logp_cut * mask).sum().backward()
    for a, b in zip(full.trainable_parameters(), cut.trainable_parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-6, rtol=1e-5)


def test_score_padding_is_validated(tmp_path, capsys):
    from tests.cli.test_hostile_inputs import refused

    base = ["run", "--world", "token_mdp", "--objective", "grpo", "--policy", "transformer", "--policy-param",
            "init=random", "--updates", "2", "--out", str(tmp_path / "out")]
    err = refused([*base, "--policy-param", "score_padding=packed"], capsys)
    assert "score_padding" in err and "fixed, longest" in err
    assert not (tmp_path / "out").exists()
