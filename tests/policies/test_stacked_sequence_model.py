"""The stacked GRU policy (batched seeds of ``sequence_model``): its unrolled recurrence against ``nn.GRU``, and
every block of a stacked batch against the member policy alone (logits, prefix tree, gradients), within float
rounding (the stacked path sums in another order than the fused GRU kernel)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.nn import functional

from offpolicylab.contracts import Prompts
from offpolicylab.policies.sequence_model import SequenceModelPolicy, StackedSequenceModelPolicy, unrolled_gru

TOL = {"rtol": 1e-5, "atol": 1e-6}


def linear_maps(gru: torch.nn.GRU, kind: str) -> list:
    return [lambda x, k=k: functional.linear(x, getattr(gru, f"weight_{kind}_l{k}"), getattr(gru, f"bias_{kind}_l{k}"))
            for k in range(gru.num_layers)]


@pytest.mark.parametrize("layers", [1, 2])
def test_unrolled_gru_equals_nn_gru_and_its_gradient(layers: int) -> None:
    gen = torch.Generator().manual_seed(0)
    gru = torch.nn.GRU(7, 5, num_layers=layers, batch_first=True)
    inputs, state = torch.randn(4, 6, 7, generator=gen), torch.randn(layers, 4, 5, generator=gen)
    expected_out, expected_state = gru(inputs, state)
    out, final = unrolled_gru(inputs, state, linear_maps(gru, "ih"), linear_maps(gru, "hh"))
    torch.testing.assert_close(out, expected_out, **TOL)
    torch.testing.assert_close(final, expected_state, **TOL)
    weights = torch.randn(4, 6, 5, generator=gen)
    expected = torch.autograd.grad((expected_out * weights).sum(), list(gru.parameters()))
    got = torch.autograd.grad((out * weights).sum(), list(gru.parameters()))
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, **TOL)


def perturbed_members(count: int, layers: int = 1) -> list[SequenceModelPolicy]:
    """Members with distinct, non-trivial weights (a fresh model's head is zero, which would hide mistakes)."""
    members = []
    for seed in range(count):
        policy = SequenceModelPolicy(4, 3, eos_id=1, prompt_vocab_size=5, embed_dim=6, hidden_size=8,
                                     num_layers=layers, seed=seed, max_prompt_len=4)
        gen = torch.Generator().manual_seed(100 + seed)
        with torch.no_grad():
            for param in policy.model.parameters():
                param.add_(0.3 * torch.randn(param.shape, generator=gen))
        members.append(policy)
    return members


def batch(rows: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(5, (rows, 4), generator=gen)
    mask = torch.ones(rows, 4)
    mask[::3, :2] = 0  # left padding on some rows
    return prompts, mask, torch.arange(rows), torch.randint(4, (rows, 3), generator=gen)


@pytest.mark.parametrize("layers", [1, 2])
def test_each_block_is_answered_by_its_member(layers: int) -> None:
    members = perturbed_members(3, layers)
    alone = [copy.deepcopy(m) for m in members]
    stacked = StackedSequenceModelPolicy(members)
    prompts, mask, index, responses = batch(12)
    logits = stacked.response_logits(prompts, mask, index, responses)
    tree = stacked.prefix_tree_logits(prompts, mask, index)
    for s, policy in enumerate(alone):
        rows = slice(4 * s, 4 * s + 4)
        torch.testing.assert_close(logits[rows], policy.response_logits(prompts[rows], mask[rows], index[rows],
                                                                        responses[rows]), **TOL)
        torch.testing.assert_close(tree[rows], policy.prefix_tree_logits(prompts[rows], mask[rows], index[rows]),
                                   **TOL)
    assert not torch.allclose(logits[:4], logits[4:8])  # the members really differ


def test_gradient_of_the_summed_losses_is_each_members_own() -> None:
    members = perturbed_members(3)
    alone = [copy.deepcopy(m) for m in members]
    stacked = StackedSequenceModelPolicy(members)
    prompts, mask, index, responses = batch(9, seed=1)
    weights = torch.randn(9, 3, 4, generator=torch.Generator().manual_seed(2))
    loss = (stacked.response_logits(prompts, mask, index, responses).log_softmax(-1) * weights).sum()
    grads = torch.autograd.grad(loss, stacked.trainable_parameters())
    for s, policy in enumerate(alone):
        rows = slice(3 * s, 3 * s + 3)
        own = (policy.response_logits(prompts[rows], mask[rows], index[rows], responses[rows]).log_softmax(-1)
               * weights[rows]).sum()
        for stacked_grad, grad in zip(grads, torch.autograd.grad(own, policy.trainable_parameters()), strict=True):
            torch.testing.assert_close(stacked_grad[s], grad, **TOL)


def test_members_see_the_steps_of_the_stack() -> None:
    members = perturbed_members(2)
    before = [m.state_dict() for m in members]
    stacked = StackedSequenceModelPolicy(members)
    with torch.no_grad():
        stacked.trainable_parameters()[0][1] += 1.0  # what an optimizer step does to member 1's slice ...
    name = next(iter(before[1]))
    assert torch.equal(members[1].state_dict()[name], before[1][name] + 1.0)  # ... member 1 sees
    assert torch.equal(members[0].state_dict()[name], before[0][name])
    with pytest.raises(TypeError, match="checkpoint its members"):
        stacked.state_dict()


def test_members_of_different_architectures_do_not_stack() -> None:
    wide = SequenceModelPolicy(4, 3, hidden_size=16, embed_dim=6, max_prompt_len=4, prompt_vocab_size=5)
    with pytest.raises(ValueError, match="share their architecture"):
        StackedSequenceModelPolicy([perturbed_members(1)[0], wide])


def test_decoding_step_by_step_gives_the_teacher_forced_logits_and_the_members_samples() -> None:
    members = perturbed_members(3, layers=2)
    alone = [copy.deepcopy(m) for m in members]
    stacked = StackedSequenceModelPolicy(members)
    prompts, mask, index, responses = batch(6, seed=3)
    teacher_forced = stacked.response_logits(prompts, mask, index, responses)
    with torch.no_grad():
        state = stacked.start_decoding(prompts, mask, index)
        for t in range(3):
            torch.testing.assert_close(stacked.next_logits(state, prompts, mask, index, responses, t),
                                       teacher_forced[:, t], **TOL)
    together = stacked.sample(Prompts(prompts, mask, index), 4, 0.8,
                              [torch.Generator().manual_seed(s) for s in range(3)])
    for s, policy in enumerate(alone):
        rows = slice(2 * s, 2 * s + 2)
        own = policy.sample(Prompts(prompts[rows], mask[rows], index[rows]), 4, 0.8,
                            torch.Generator().manual_seed(s))
        block = slice(8 * s, 8 * s + 8)
        assert torch.equal(together.response_ids[block], own.response_ids)
        torch.testing.assert_close(together.behavior_logp[block], own.behavior_logp, **TOL)
