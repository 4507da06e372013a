"""Policies: sample/score agreement, temperature, EOS masks, sampler noise, state round trips, factory errors."""

from __future__ import annotations

import pytest
import torch

from offpolicylab.policies import Policy, Rollout, TabularSoftmaxPolicy, make_policy
from offpolicylab.worlds import make_world

WORLDS = [("token_mdp", {"family": "target", "eos": True}), ("token_mdp", {"family": "arithmetic"}),
          ("three_arm_pitfall", {})]


def _perturb(policy) -> None:
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("kind", ["tabular", "sequence_model"])
@pytest.mark.parametrize("name,params", WORLDS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sample_and_score_agree(kind, name, params, temperature):
    world = make_world(name, **params)
    policy = make_policy(kind, world)
    _perturb(policy)
    assert isinstance(policy, Policy)
    g = torch.Generator().manual_seed(0)
    rollout = policy.sample(world.sample_prompts(5, g), 4, temperature, g)
    assert len(rollout) == 20 and rollout.temperature == temperature
    assert rollout.group_ids.tolist() == [i // 4 for i in range(20)]
    logp, entropy = policy.score(rollout)
    assert logp.requires_grad and entropy.requires_grad
    diff = ((logp.detach() - rollout.behavior_logp) * rollout.response_mask).abs().max()
    assert float(diff) <= 1e-6
    assert bool((entropy >= -1e-6).all()) and bool((entropy <= torch.log(torch.tensor(float(world.vocab_size))) + 1e-5).all())


def test_behavior_logp_is_at_the_sampling_temperature():
    policy = TabularSoftmaxPolicy.from_probs([0.7, 0.2, 0.1])
    world = make_world("bandit", rewards="0,0.5,1")
    rollout = policy.sample(world.sample_prompts(1), 50, 0.5, torch.Generator().manual_seed(0))
    tempered = torch.log_softmax(torch.log(torch.tensor([0.7, 0.2, 0.1])) / 0.5, -1)
    torch.testing.assert_close(rollout.behavior_logp[:, 0], tempered[rollout.response_ids[:, 0]], atol=1e-6, rtol=0)
    scored, _ = policy.score(rollout.with_(temperature=1.0))  # scoring at another temperature changes logp
    torch.testing.assert_close(scored[:, 0], torch.log(torch.tensor([0.7, 0.2, 0.1]))[rollout.response_ids[:, 0]],
                               atol=1e-6, rtol=0)


def test_eos_masks_and_padding():
    world = make_world("token_mdp", family="target", eos=True, vocab_size=3, length=6)
    policy = make_policy("tabular", world)  # uniform: EOS (id 2) w.p. 1/3 at each step
    rollout = policy.sample(world.sample_prompts(20, torch.Generator().manual_seed(0)), 5,
                            1.0, torch.Generator().manual_seed(1))
    ids, mask = rollout.response_ids, rollout.response_mask
    saw_early_eos = False
    for row_ids, row_mask in zip(ids.tolist(), mask.tolist(), strict=True):
        n = int(sum(row_mask))
        assert row_mask == [1.0] * n + [0.0] * (6 - n)  # mask is a prefix
        assert 2 not in row_ids[: n - 1]  # no EOS before the last counted token
        if n < 6:
            saw_early_eos = True
            assert row_ids[n - 1] == 2 and row_ids[n:] == [2] * (6 - n)  # EOS counted, then EOS padding
    assert saw_early_eos
    assert bool((rollout.behavior_logp[mask == 0] == 0).all())


def test_sampler_noise_fills_sampler_logp():
    world = make_world("token_mdp", family="forking")
    policy = make_policy("tabular", world, sampler_noise_std=0.5)
    g = torch.Generator().manual_seed(0)
    rollout = policy.sample(world.sample_prompts(8, g), 8, 1.0, g)
    assert rollout.sampler_logp is not None and rollout.sampler_logp.shape == rollout.behavior_logp.shape
    gap = (rollout.sampler_logp - rollout.behavior_logp).abs().mean()
    assert float(gap) > 0.05  # the noisy engine reports different log-probs
    logp, _ = policy.score(rollout)
    assert float((logp.detach() - rollout.behavior_logp).abs().max()) <= 1e-6  # behaviour stays the trainer-side value
    assert make_policy("tabular", world).sample(world.sample_prompts(2, g), 2, 1.0, g).sampler_logp is None


def test_sampling_is_deterministic_given_generator():
    world = make_world("token_mdp")
    policy = make_policy("sequence_model", world)
    a = policy.sample(world.eval_prompts(), 3, 1.0, torch.Generator().manual_seed(5))
    b = policy.sample(world.eval_prompts(), 3, 1.0, torch.Generator().manual_seed(5))
    assert torch.equal(a.response_ids, b.response_ids)


def test_score_gradient_and_concat_select():
    world = make_world("token_mdp", family="target")
    policy = make_policy("sequence_model", world)
    g = torch.Generator().manual_seed(0)
    parts = [policy.sample(world.sample_prompts(2, g), 2, 1.0, g) for _ in range(2)]
    merged = Rollout.concat(parts)
    logp, _ = policy.score(merged)
    torch.testing.assert_close(logp * merged.response_mask, merged.behavior_logp, atol=1e-6, rtol=0)
    (logp * merged.response_mask).sum().backward()
    assert all(p.grad is not None for p in policy.trainable_parameters())
    sub = merged.select(torch.tensor([3, 0]))
    torch.testing.assert_close(policy.score(sub)[0].detach(), logp.detach()[[3, 0]], atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind", ["tabular", "sequence_model"])
def test_state_dict_round_trip_and_clone(kind):
    world = make_world("token_mdp")
    policy = make_policy(kind, world)
    other = make_policy(kind, world)
    _perturb(policy)
    other.load_state_dict(policy.state_dict())
    assert world.exact_kl(policy, other) == pytest.approx(0.0, abs=1e-6)
    frozen = policy.clone()
    _perturb(policy)
    assert world.exact_kl(policy, frozen) > 1e-3
    with pytest.raises(ValueError):
        other.load_state_dict({"bogus": torch.zeros(1)})


def test_greedy_picks_argmax():
    policy = TabularSoftmaxPolicy.from_probs([0.2, 0.5, 0.3])
    rollout = policy.greedy(make_world("bandit", rewards="0,1,0").eval_prompts())
    assert rollout.response_ids.tolist() == [[1]]


def test_factory_errors():
    world = make_world("token_mdp")
    with pytest.raises(ValueError, match="valid: tabular, sequence_model"):
        make_policy("lstm", world)
    with pytest.raises(ValueError, match="valid"):
        make_policy("tabular", world, hidden_size=3)
    with pytest.raises(ValueError, match="valid"):
        make_policy("sequence_model", world, hidden_size="big")
    with pytest.raises(ValueError, match="temperature"):
        make_policy("tabular", world).sample(world.eval_prompts(), 1, 0.0, torch.Generator())
    with pytest.raises(ValueError, match="sum to 1"):
        TabularSoftmaxPolicy.from_probs([0.5, 0.6])


def test_the_old_types_module_is_a_deprecated_alias_of_contracts() -> None:
    import importlib
    import sys

    from offpolicylab import contracts

    sys.modules.pop("offpolicylab.policies.base", None)
    with pytest.warns(DeprecationWarning, match="offpolicylab.contracts"):
        old = importlib.import_module("offpolicylab.policies.base")
    assert (old.Prompts, old.Rollout, old.Policy) == (contracts.Prompts, contracts.Rollout, contracts.Policy)
