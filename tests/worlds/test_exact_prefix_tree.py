"""Exact log π(y|x) through the prefix tree (``prefix_tree_log_probs``) equals teacher-forced ``policy.score`` summed
over the response mask, for every enumerated response (random, non-uniform policies; EOS and not; τ ≠ 1)."""

import pytest
import torch

from offpolicylab import worlds
from offpolicylab.policies import SequenceModelPolicy, TabularSoftmaxPolicy
from offpolicylab.policies.autoregressive import AutoregressivePolicy
from offpolicylab.policies.tabular import StackedTabularPolicy
from offpolicylab.worlds.exact import _all_pairs, prefix_tree_nodes, sequence_logprobs


def _scored_logprobs(policy, enumeration, temperature):
    pairs = _all_pairs(enumeration.prompts, enumeration.ids, enumeration.mask, temperature)
    with torch.no_grad():
        logp = policy.score(pairs)[0].double()
    return (logp * pairs.response_mask).sum(-1).reshape(enumeration.rewards.shape)


def _policies(world):
    gen = torch.Generator().manual_seed(7)
    v, t = world.vocab_size, world.max_response_len
    tabular = TabularSoftmaxPolicy(num_prompts=world.num_prompts, vocab_size=v, response_len=t, eos_id=world.eos_id,
                                   init_logits=torch.randn(world.num_prompts, t, v + 1, v, generator=gen))
    gru = SequenceModelPolicy(v, t, eos_id=world.eos_id, prompt_vocab_size=getattr(world, "prompt_vocab_size", None),
                              hidden_size=16, embed_dim=8, num_layers=2, seed=3)
    with torch.no_grad():
        for p in gru.model.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=gen))
    return [tabular, gru]


@pytest.mark.parametrize("options", [dict(family="target"), dict(family="arithmetic", eos=True),
                                   dict(family="target", vocab_size=3, length=4, eos=True)])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_prefix_tree_matches_teacher_forced_score(options, temperature):
    world = worlds.make_world("token_mdp", **options)
    enumeration = world.enumeration
    for policy in _policies(world):
        tree = enumeration.logprobs(policy, temperature)
        scored = _scored_logprobs(policy, enumeration, temperature)
        assert tree.std() > 0.1  # a non-uniform policy (log π varies), so the comparison can fail
        torch.testing.assert_close(tree, scored, atol=1e-5, rtol=0)
        torch.testing.assert_close(tree.exp().sum(1), torch.ones(len(enumeration.prompts), dtype=tree.dtype),
                                   atol=1e-5, rtol=0)


def test_incremental_gru_tree_matches_default_teacher_forced_tree():
    world = worlds.make_world("token_mdp", family="arithmetic", eos=True)
    gru = _policies(world)[1]
    prompts = world.eval_prompts()
    with torch.no_grad():
        incremental = gru.prefix_tree_logits(prompts.ids, prompts.mask, prompts.index)
        teacher_forced = super(SequenceModelPolicy, gru).prefix_tree_logits(prompts.ids, prompts.mask, prompts.index)
    v, t = world.vocab_size, world.max_response_len
    assert incremental.shape == (len(prompts), sum(v ** s for s in range(t)), v)
    torch.testing.assert_close(incremental, teacher_forced, atol=1e-5, rtol=0)


@pytest.mark.parametrize("context", ["prev_token", "none"])
@pytest.mark.parametrize(("vocab", "length"), [(4, 5), (3, 4), (5, 1)])
def test_tabular_tree_gather_equals_teacher_forced_tree(context, vocab, length):
    # the tabular tree reads one table row per node; the default reads T rows per leaf: the same values, bit for bit
    gen = torch.Generator().manual_seed(vocab * 10 + length)
    contexts = vocab + 1 if context == "prev_token" else 1
    policies = [TabularSoftmaxPolicy(num_prompts=6, vocab_size=vocab, response_len=length, context=context,
                                     eos_id=vocab - 1, init_logits=torch.randn(6, length, contexts, vocab, generator=gen))
                for _ in range(3)]
    index = torch.tensor([0, 3, 5, 1, 3])
    ids, mask = torch.zeros(5, 2, dtype=torch.long), torch.ones(5, 2)
    for policy in policies:
        tree = policy.prefix_tree_logits(ids, mask, index)
        assert tree.shape == (5, sum(vocab ** t for t in range(length)), vocab)
        assert torch.equal(tree, AutoregressivePolicy.prefix_tree_logits(policy, ids, mask, index))
    stacked = StackedTabularPolicy(policies)  # block s of the rows from table s
    rows = (ids.repeat(3, 1), mask.repeat(3, 1), index.repeat(3))
    tree = stacked.prefix_tree_logits(*rows)
    assert torch.equal(tree, AutoregressivePolicy.prefix_tree_logits(stacked, *rows))
    assert torch.equal(tree[5:10], policies[1].prefix_tree_logits(ids, mask, index))


def test_prefix_tree_nodes_by_hand():
    ids = torch.tensor([[0, 0, 0], [2, 1, 0], [1, 2, 2]])
    # V = 3: depth offsets 0, 1, 4; node_t = offset_t + base-3 code of y_<t
    expected = torch.tensor([[0, 1, 4], [0, 1 + 2, 4 + 2 * 3 + 1], [0, 1 + 1, 4 + 1 * 3 + 2]])
    assert torch.equal(prefix_tree_nodes(ids, 3), expected)


def test_policy_without_prefix_tree_falls_back_to_score():
    world = worlds.make_world("token_mdp", family="target", vocab_size=3, length=3)
    policy = _policies(world)[0]

    class ScoreOnly:
        score = staticmethod(policy.score)

    enumeration = world.enumeration
    fallback = sequence_logprobs(ScoreOnly(), enumeration.prompts, enumeration.ids, enumeration.mask, 1.0,
                                 world.vocab_size)
    torch.testing.assert_close(fallback, enumeration.logprobs(policy), atol=1e-5, rtol=0)
