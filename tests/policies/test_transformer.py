"""The causal-transformer policy: KV-cached sampling vs full-forward scoring, padding, causality, registration."""

from __future__ import annotations

import pytest
import torch

from offpolicylab.contracts import Prompts
from offpolicylab.policies import make_policy
from offpolicylab.policies.transformer import TransformerPolicy
from offpolicylab.worlds import make_world


def _policy(**kw) -> TransformerPolicy:
    return TransformerPolicy(vocab_size=20, response_len=7, prompt_vocab_size=25, max_prompt_len=6, d_model=16,
                             num_layers=2, num_heads=4, seed=3, **kw)


def _prompts() -> Prompts:
    ids = torch.randint(25, (3, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 6)
    mask[0, :2] = 0  # left padding
    mask[2, :5] = 0
    return Prompts(ids=ids, mask=mask, index=torch.arange(3))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_kv_cached_sampling_log_probs_equal_full_forward_scoring(temperature):
    policy = _policy()
    rollout = policy.sample(_prompts(), 4, temperature, torch.Generator().manual_seed(0))
    logp, _ = policy.score(rollout)
    assert (logp.detach() - rollout.behavior_logp).abs().max() < 1e-5
    greedy = policy.greedy(_prompts())
    assert (policy.score(greedy)[0].detach() - greedy.behavior_logp).abs().max() < 1e-5


def test_kv_cached_step_logits_equal_full_forward_logits_at_every_position():
    policy = _policy()
    prompts = _prompts()
    response = torch.randint(20, (3, 7), generator=torch.Generator().manual_seed(2))
    full = policy.response_logits(prompts.ids, prompts.mask, prompts.index, response)
    state = policy.start_decoding(prompts.ids, prompts.mask, prompts.index)
    steps = torch.stack([policy.next_logits(state, prompts.ids, prompts.mask, prompts.index, response, t)
                         for t in range(7)], dim=1)
    assert (full - steps).abs().max() < 1e-5


def test_left_padding_does_not_change_the_numbers():
    policy = _policy()
    prompts = _prompts()
    response = torch.randint(20, (3, 7), generator=torch.Generator().manual_seed(2))
    padded = policy.response_logits(prompts.ids, prompts.mask, prompts.index, response)
    unpadded = policy.response_logits(prompts.ids[:1, 2:], prompts.mask[:1, 2:], prompts.index[:1], response[:1])
    assert (padded[:1] - unpadded).abs().max() < 1e-5


def test_position_t_reads_only_the_prefix():
    policy = _policy()
    prompts = _prompts()
    response = torch.randint(20, (3, 7), generator=torch.Generator().manual_seed(2))
    changed = response.clone()
    changed[:, 4] = (changed[:, 4] + 1) % 20
    a = policy.response_logits(prompts.ids, prompts.mask, prompts.index, response)
    b = policy.response_logits(prompts.ids, prompts.mask, prompts.index, changed)
    assert torch.equal(a[:, :5], b[:, :5]) and not torch.allclose(a[:, 5:], b[:, 5:])


def test_same_seed_same_weights_and_state_round_trip():
    a, b = _policy(), _policy()
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    c = TransformerPolicy(vocab_size=20, response_len=7, prompt_vocab_size=25, max_prompt_len=6, d_model=16,
                          num_layers=2, num_heads=4, seed=4, state=a.state_dict())
    assert all(torch.equal(a.state_dict()[k], c.state_dict()[k]) for k in a.state_dict())
    with pytest.raises(ValueError, match="does not match the architecture"):
        TransformerPolicy(vocab_size=20, response_len=7, d_model=8, num_heads=2, state=a.state_dict())


def test_random_init_on_a_token_mdp_and_bad_sizes():
    world = make_world("token_mdp", family="target")
    policy = make_policy("transformer", world, d_model=8, num_heads=2, num_layers=1)
    rollout = policy.sample(world.eval_prompts(), 2, 1.0, torch.Generator().manual_seed(0))
    assert rollout.response_ids.shape == (2 * world.num_prompts, world.max_response_len)
    with pytest.raises(ValueError, match="divisible"):
        make_policy("transformer", world, d_model=10, num_heads=4)
