"""Token MDPs: reward families on hand-made responses, enumeration (sums to 1, MC agreement, KL, χ²)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from offpolicylab.objectives import get_objective
from offpolicylab.policies import TabularSoftmaxPolicy, make_policy
from offpolicylab.worlds import make_world
from offpolicylab.worlds.exact import enumerate_responses
from offpolicylab.worlds.token_mdp import TokenMDP


def _random_tabular(world: TokenMDP, seed: int, scale: float = 1.0) -> TabularSoftmaxPolicy:
    g = torch.Generator().manual_seed(seed)
    shape = (world.num_prompts, world.max_response_len, world.vocab_size + 1, world.vocab_size)
    return TabularSoftmaxPolicy(world.num_prompts, world.vocab_size, world.max_response_len, world.eos_id,
                                init_logits=scale * torch.randn(shape, generator=g))


def _rewards(world: TokenMDP, index: int, responses: list[list[int]], lengths: list[int] | None = None) -> list[float]:
    ids = torch.tensor(responses)
    mask = torch.ones(ids.shape) if lengths is None else (torch.arange(ids.shape[1])[None] < torch.tensor(lengths)[:, None]).float()
    return world.reward(torch.full((len(responses),), index), ids, mask).tolist()


def test_target_partial_and_exact_credit():
    world = TokenMDP("target", vocab_size=4, length=4, num_prompts=3, seed=5)
    exact = TokenMDP("target", vocab_size=4, length=4, num_prompts=3, seed=5, credit="exact")
    y = world.targets[1].tolist()
    wrong_two = [y[0], (y[1] + 1) % 4, y[2], (y[3] + 1) % 4]
    assert _rewards(world, 1, [y, wrong_two]) == [1.0, 0.5]
    assert _rewards(exact, 1, [y, wrong_two]) == [1.0, 0.0]


def test_target_with_eos_uses_canonical_padding():
    world = TokenMDP("target", vocab_size=4, length=4, num_prompts=16, eos=True, seed=0)
    assert world.eos_id == 3
    index = int(next(i for i in range(16) if int((world.targets[i] == 3).sum()) >= 2))  # target ends early
    y = world.targets[index].tolist()
    length = y.index(3) + 1
    garbage_after_eos = y[:length] + [0] * (4 - length)  # anything after EOS is padding
    assert _rewards(world, index, [garbage_after_eos], [length]) == [1.0]


def test_arithmetic_spells_the_sum():
    world = TokenMDP("arithmetic", vocab_size=5, length=3, num_prompts=20, eos=True, seed=1)  # base 4, EOS = 4
    for i in range(20):
        a, b = world.operands[i].tolist()
        digits = world.prompt_tokens[i].tolist()
        assert int("".join(map(str, digits[:3])), 4) == a and int("".join(map(str, digits[3:])), 4) == b
        answer = np.base_repr(a + b, 4)
        response = [int(c) for c in answer] + [4] * (3 - len(answer))
        assert _rewards(world, i, [response])[0] == 1.0
    fixed = TokenMDP("arithmetic", vocab_size=10, length=2, num_prompts=5, seed=2)  # decimal, zero-padded
    a, b = fixed.operands[0].tolist()
    right = [(a + b) // 10, (a + b) % 10]
    assert _rewards(fixed, 0, [right, [right[0], (right[1] + 1) % 10]]) == [1.0, 0.5]


def test_forking_reward_and_prior():
    world = TokenMDP("forking", vocab_size=4, length=5, num_prompts=2, num_forks=2, seed=3)
    assert world.fork_mask.tolist() == [False, True, False, True, False]
    y = world.targets[0].tolist()
    one_fork_wrong = list(y)
    one_fork_wrong[1] = (y[1] + 1) % 4
    one_filler_wrong = list(y)
    one_filler_wrong[0] = (y[0] + 1) % 4
    assert _rewards(world, 0, [y, one_fork_wrong, one_filler_wrong]) == pytest.approx([1.0, 0.5, 2 / 3])
    prior = make_policy("tabular", world)
    # prior: fork credit 1/4 in expectation, filler credit filler_prob in expectation (independent positions)
    assert world.exact_return(prior) == pytest.approx(0.25 * 0.9, abs=1e-5)


@pytest.mark.parametrize("eos", [False, True])
def test_enumeration_counts_and_probabilities_sum_to_one(eos):
    v, t = 4, 3
    ids, mask = enumerate_responses(v, t, v - 1 if eos else None)
    expected = v ** t if not eos else sum((v - 1) ** k for k in range(t)) + (v - 1) ** t
    assert ids.shape == (expected, t)
    assert len({tuple(row) for row in ids.tolist()}) == expected
    world = TokenMDP("target", vocab_size=v, length=t, num_prompts=3, eos=eos, seed=0)
    for policy in (_random_tabular(world, 0), make_policy("sequence_model", world, seed=1)):
        total = world.enumeration.logprobs(policy).exp().sum(1)
        np.testing.assert_allclose(total.numpy(), 1.0, atol=1e-5)


@pytest.mark.parametrize("family", ["target", "arithmetic", "forking"])
def test_exact_return_matches_monte_carlo(family):
    world = make_world("token_mdp", family=family, vocab_size=3, length=4, num_prompts=4)
    policy = _random_tabular(world, 2)
    g = torch.Generator().manual_seed(0)
    rollout = policy.sample(world.eval_prompts(), 3000, 1.0, g)
    mc = float(world.reward(rollout.prompt_index, rollout.response_ids, rollout.response_mask).mean())
    assert mc == pytest.approx(world.exact_return(policy), abs=0.015)  # MC std ≤ 0.5/√12000 ≈ 0.005


def test_optimal_return_and_exact_return_of_hand_policy():
    world = TokenMDP("target", vocab_size=3, length=2, num_prompts=2, seed=0)
    assert world.optimal_return() == 1.0
    uniform = make_policy("tabular", world)
    assert world.exact_return(uniform) == pytest.approx(1 / 3, abs=1e-6)  # each position right w.p. 1/3


def test_kl_and_chi2():
    world = TokenMDP("target", vocab_size=3, length=3, num_prompts=2, seed=0)
    p, q = _random_tabular(world, 0), _random_tabular(world, 1)
    assert world.exact_kl(p, p) == pytest.approx(0.0, abs=1e-6)
    assert world.exact_chi2(p, p) == pytest.approx(0.0, abs=1e-5)
    assert world.exact_kl(p, q) > 0.0 and world.exact_chi2(p, q) > 0.0
    # independent NumPy computation of KL / χ² over all 27 responses for both prompts
    kl = chi2 = 0.0
    for index in range(2):
        lp = _numpy_seq_logprobs(p, index, 3, 3)
        lq = _numpy_seq_logprobs(q, index, 3, 3)
        kl += np.sum(np.exp(lp) * (lp - lq)) / 2
        chi2 += (np.sum(np.exp(2 * lp - lq)) - 1) / 2
    assert world.exact_kl(p, q) == pytest.approx(kl, rel=1e-4)
    assert world.exact_chi2(p, q) == pytest.approx(chi2, rel=1e-4)


def test_chi2_two_point_case():
    """One step, two tokens: π = (0.8, 0.2), q = (0.5, 0.5) → χ² = 0.64/0.5 + 0.04/0.5 − 1 = 0.36,
    KL = 0.8 ln 1.6 + 0.2 ln 0.4."""
    world = TokenMDP("target", vocab_size=2, length=1, num_prompts=1, seed=0)
    p = TabularSoftmaxPolicy.from_probs([0.8, 0.2])
    q = TabularSoftmaxPolicy.from_probs([0.5, 0.5])
    assert world.exact_chi2(p, q) == pytest.approx(0.36, abs=1e-5)
    assert world.exact_kl(p, q) == pytest.approx(0.8 * math.log(1.6) + 0.2 * math.log(0.4), abs=1e-6)


def test_exact_gradient_for_sequences_matches_numpy():
    """REINFORCE, token-mean over one sequence: ∇ = −E_x Σ_y q(y|x) A(x,y) (1/T) Σ_t ∇ log π(y_t|x,y_<t)."""
    world = TokenMDP("target", vocab_size=2, length=2, num_prompts=1, seed=0)
    policy, behaviour = _random_tabular(world, 3), _random_tabular(world, 4)
    grad = world.enumeration.expected_gradient(policy, get_objective("reinforce"), behaviour)
    theta = policy.logits.detach().double().numpy()[0]  # [T, V+1, V]
    beta = behaviour.logits.detach().double().numpy()[0]
    target = world.targets[0].numpy()
    expected = np.zeros_like(theta)
    seqs = list(itertools.product(range(2), repeat=2))
    q = {y: np.exp(sum(_log_softmax(beta[t, ([2] + list(y))[t]])[y[t]] for t in range(2))) for y in seqs}
    reward = {y: float(np.mean(np.array(y) == target)) for y in seqs}
    baseline = sum(q[y] * reward[y] for y in seqs)
    for y in seqs:
        for t in range(2):
            ctx = ([2] + list(y))[t]
            expected[t, ctx] -= q[y] * (reward[y] - baseline) * ((np.arange(2) == y[t]) - _softmax(theta[t, ctx])) / 2
    np.testing.assert_allclose(grad.numpy(), expected.reshape(-1), atol=1e-6)


def test_token_mdp_factory_errors():
    with pytest.raises(ValueError, match="family"):
        make_world("token_mdp", family="chess")
    with pytest.raises(ValueError, match="enumerable"):
        make_world("token_mdp", vocab_size=20, length=6)
    with pytest.raises(ValueError, match="eos=false"):
        make_world("token_mdp", family="forking", eos=True)
    with pytest.raises(ValueError, match="num_prompts"):
        make_world("token_mdp", family="arithmetic", vocab_size=2, length=1, num_prompts=5)
    with pytest.raises(ValueError, match="valid"):
        make_world("token_mdp", length="three")


def _log_softmax(z: np.ndarray) -> np.ndarray:
    return z - z.max() - np.log(np.exp(z - z.max()).sum())


def _softmax(z: np.ndarray) -> np.ndarray:
    return np.exp(_log_softmax(z))


def _numpy_seq_logprobs(policy: TabularSoftmaxPolicy, index: int, v: int, t: int) -> np.ndarray:
    theta = policy.logits.detach().double().numpy()[index]
    out = []
    for y in itertools.product(range(v), repeat=t):
        ctx = [v] + list(y)
        out.append(sum(_log_softmax(theta[k, ctx[k]])[y[k]] for k in range(t)))
    return np.array(out)


@pytest.mark.parametrize("params", [{"family": "target"}, {"family": "target", "eos": True, "credit": "exact"},
                                    {"family": "forking"}], ids=["target", "target-eos-exact", "forking"])
def test_rowwise_reward_of_joined_rows_equals_each_blocks_own(params: dict) -> None:
    """rowwise_reward (the trainer scores a stack's rows in one call): the rewards of three blocks of rows joined
    equal each block's own call bit for bit, and the generator is not drawn from."""
    world = make_world("token_mdp", vocab_size=3, length=4, num_prompts=3, **params)
    assert world.rowwise_reward
    generator = torch.Generator().manual_seed(0)
    blocks = []
    for _ in range(3):
        index = torch.randint(3, (6,), generator=generator)
        ids = torch.randint(3, (6, 4), generator=generator)
        mask = (torch.arange(4)[None, :] < torch.randint(1, 5, (6, 1), generator=generator)).float()
        blocks.append((index, ids, mask))
    state = generator.get_state()
    joined = world.reward(*(torch.cat(parts) for parts in zip(*blocks, strict=True)), generator=generator)
    assert torch.equal(generator.get_state(), state)
    assert torch.equal(joined, torch.cat([world.reward(*block, generator=generator) for block in blocks]))
