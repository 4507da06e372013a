"""``token_draw = inverse_cdf``: one uniform per row and step, y = min{v : Σ_{w≤v} p_w > u Σ p}.  Checked on values
worked out by hand, against the exact response distribution of a small transformer (enumeration), against the
policy's own scoring, and for batched seeds (each block's tokens and generator are its separate run's)."""

from __future__ import annotations

import pytest
import torch

from offpolicylab.contracts import Prompts
from offpolicylab.policies import make_policy
from offpolicylab.policies.autoregressive import inverse_cdf
from offpolicylab.policies.transformer import TransformerPolicy
from offpolicylab.policies.transformer_stack import StackedTransformerPolicy
from offpolicylab.worlds import make_world


def test_inverse_cdf_on_hand_worked_values() -> None:
    # p = [0.2, 0.5, 0.3]: cumulative 0.2, 0.7, 1.0; token = the first v with cumulative_v > u
    probs = torch.tensor([[0.2, 0.5, 0.3]]).repeat(6, 1)
    u = torch.tensor([[0.0], [0.1], [0.2], [0.69], [0.7], [0.999]], dtype=torch.float64)
    assert inverse_cdf(probs, u).tolist() == [0, 0, 1, 1, 2, 2]
    # unnormalised weights: the same split of [0, 1) (Σ = 2)
    assert inverse_cdf(2 * probs, u).tolist() == [0, 0, 1, 1, 2, 2]
    # a token of probability 0 is never drawn, also at u = 0 and at the largest u below 1
    zeros = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]]).repeat(4, 1)
    largest = 1 - 2.0 ** -53
    assert inverse_cdf(zeros, torch.tensor([[0.0], [0.4999], [0.5], [largest]], dtype=torch.float64)).tolist() == [
        1, 1, 3, 3]
    # the largest u below 1 with a trailing zero and a total that is not a power of two: the last positive token
    weights = torch.tensor([[0.2, 0.5, 0.3, 0.0], [0.1, 0.0, 0.7, 0.0]])
    assert inverse_cdf(weights, torch.full((2, 1), largest, dtype=torch.float64)).tolist() == [2, 2]
    with pytest.raises(RuntimeError, match="inf"):
        inverse_cdf(torch.full((1, 3), float("nan")), torch.zeros(1, 1, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="sums to 0"):
        inverse_cdf(torch.zeros(1, 3), torch.zeros(1, 1, dtype=torch.float64))


def _policy(seed: int = 0, **options: object) -> TransformerPolicy:
    return TransformerPolicy(vocab_size=4, response_len=2, prompt_vocab_size=5, max_prompt_len=3, d_model=8,
                             num_layers=1, num_heads=2, seed=seed, **options)  # type: ignore[arg-type]


def _prompts(rows: int) -> Prompts:
    return Prompts(ids=torch.tensor([[1, 2, 3]] * rows), mask=torch.ones(rows, 3), index=torch.zeros(rows).long())


def test_inverse_cdf_samples_follow_the_exact_response_distribution() -> None:
    """All 16 responses of a V = 4, T = 2 transformer: π(y) by enumeration (the prefix tree), frequencies of 40,000
    draws within 5 standard errors of it."""
    policy = _policy(token_draw="inverse_cdf")
    with torch.no_grad():
        tree = policy.prefix_tree_log_probs(_prompts(1))[0].exp()  # [1 + 4, 4]: root, then the 4 first tokens
    exact = (tree[0][:, None] * tree[1:]).flatten()  # π(y1, y2) = p(y1) p(y2 | y1), y1-major
    n = 40_000
    rollout = policy.sample(_prompts(1), n, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(rollout.response_ids[:, 0] * 4 + rollout.response_ids[:, 1], minlength=16).double()
    sigma = (exact * (1 - exact) / n).sqrt()
    assert ((counts / n - exact).abs() <= 5 * sigma + 1e-12).all()
    assert exact.min() > 0.005  # every response is reachable, so every count was checked, not only zeros


def test_inverse_cdf_sampling_agrees_with_scoring_and_stops_where_the_full_loop_would() -> None:
    world = make_world("synthetic_lm", preset="seed_scale_v6")
    policy = make_policy("transformer", world, token_draw="inverse_cdf")
    prompts = world.sample_prompts(4, torch.Generator().manual_seed(0))
    generator, reference = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    rollout = policy.sample(prompts, 4, generator=generator)
    logp, _ = policy.score(rollout)
    mask = rollout.response_mask > 0
    assert (logp.detach() - rollout.behavior_logp)[mask].abs().max() < 1e-5
    assert int(mask.sum(1).max()) < policy.response_len  # every row ended early, so decoding stopped early
    torch.rand((policy.response_len, 16, 1), dtype=torch.float64, generator=reference)
    assert torch.equal(generator.get_state(), reference.get_state())
    race = make_policy("transformer", world).sample(prompts, 4, generator=torch.Generator().manual_seed(3))
    assert not torch.equal(race.response_ids, rollout.response_ids)  # the option changes which tokens are drawn


def test_batched_seeds_draw_what_each_member_draws_alone() -> None:
    seeds = [3, 7, 11]
    stacked = StackedTransformerPolicy([_policy(seed, token_draw="inverse_cdf") for seed in seeds])
    prompts = _prompts(2)
    together = stacked.sample(Prompts(prompts.ids.repeat(3, 1), prompts.mask.repeat(3, 1), prompts.index.repeat(3)),
                              5, 1.0, [torch.Generator().manual_seed(10 + s) for s in range(3)])
    for s, seed in enumerate(seeds):
        generator = torch.Generator().manual_seed(10 + s)
        own = _policy(seed, token_draw="inverse_cdf").sample(prompts, 5, 1.0, generator)
        assert torch.equal(own.response_ids, together.response_ids[10 * s:10 * (s + 1)])
        assert torch.equal(own.behavior_logp, together.behavior_logp[10 * s:10 * (s + 1)])
    with pytest.raises(ValueError, match="token draw"):
        StackedTransformerPolicy([_policy(3, token_draw="inverse_cdf"), _policy(7)])


def test_the_option_is_checked() -> None:
    with pytest.raises(ValueError, match="valid: race, inverse_cdf"):
        _policy(token_draw="gumbel")


@pytest.mark.parametrize("engine", [{"sampler_noise_std": 0.5}, {"sampler_precision": "bf16"}],
                         ids=["noisy", "bf16"])
def test_the_other_engines_draw_by_inverse_cdf_too(engine: dict[str, object]) -> None:
    """A noisy sampler draws its noise and then its uniform each step; a bf16 engine's probabilities are drawn as
    they are.  Both: same seed, same tokens (reproducible), other tokens than the race's, the engine's log-probs
    recorded; batched seeds draw what each member draws alone."""
    seeds = [3, 7]
    prompts = _prompts(2)
    rows = _policy(3, token_draw="inverse_cdf", **engine).sample(prompts, 64, 1.0, torch.Generator().manual_seed(1))
    again = _policy(3, token_draw="inverse_cdf", **engine).sample(prompts, 64, 1.0, torch.Generator().manual_seed(1))
    race = _policy(3, **engine).sample(prompts, 64, 1.0, torch.Generator().manual_seed(1))
    assert torch.equal(rows.response_ids, again.response_ids)
    assert not torch.equal(rows.response_ids, race.response_ids)
    assert rows.sampler_logp is not None and (rows.sampler_logp <= 0).all()
    stacked = StackedTransformerPolicy([_policy(seed, token_draw="inverse_cdf", **engine) for seed in seeds])
    together = stacked.sample(Prompts(prompts.ids.repeat(2, 1), prompts.mask.repeat(2, 1), prompts.index.repeat(2)),
                              3, 1.0, [torch.Generator().manual_seed(10 + s) for s in range(2)])
    for s, seed in enumerate(seeds):
        own = _policy(seed, token_draw="inverse_cdf", **engine).sample(prompts, 3, 1.0,
                                                                       torch.Generator().manual_seed(10 + s))
        assert torch.equal(own.response_ids, together.response_ids[6 * s:6 * (s + 1)])


def test_batched_seeds_that_stop_early_leave_each_generator_where_its_own_run_does() -> None:
    """With EOS, decoding of the stack stops when every member's rows have ended; each member alone stops when its
    own have: the generators must still agree (every step's uniforms are drawn at the first step)."""
    def policy(seed: int) -> TransformerPolicy:
        made = TransformerPolicy(vocab_size=4, response_len=8, eos_id=0, prompt_vocab_size=5, max_prompt_len=3,
                                 d_model=8, num_layers=1, num_heads=2, seed=seed, token_draw="inverse_cdf")
        with torch.no_grad():
            made.model.head.bias[0] += 2.0  # EOS likely at every step, so rows end early
        return made

    prompts = _prompts(2)
    generators = [torch.Generator().manual_seed(10 + s) for s in range(2)]
    together = StackedTransformerPolicy([policy(3), policy(7)]).sample(
        Prompts(prompts.ids.repeat(2, 1), prompts.mask.repeat(2, 1), prompts.index.repeat(2)), 4, 1.0, generators)
    lengths = together.response_mask.sum(1)
    assert lengths.max() < 8  # every row ended before the last position: the loop stopped early
    for s, seed in enumerate((3, 7)):
        generator = torch.Generator().manual_seed(10 + s)
        own = policy(seed).sample(prompts, 4, 1.0, generator)
        assert torch.equal(own.response_ids, together.response_ids[8 * s:8 * (s + 1)])
        assert torch.equal(generator.get_state(), generators[s].get_state())
