"""Recipe v6 of the synthetic-LM world (preset ``seed_scale_v6``): grammar, EOS and truncation, the chain's credit,
the teacher's two code paths, and the preset plumbing.  A tiny recipe (1 distillation step) keeps every test fast."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from offpolicylab.worlds import make_world
from offpolicylab.worlds.synthetic_lm_v6 import (
    ANS,
    EOS,
    STEP,
    ChainLM,
    ChainRecipe,
    ChainState,
    chain_states,
    parse,
    random_prompts,
    response_mask,
)

TEXT = 40  # an ordinary text token


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> ChainLM:
    recipe = ChainRecipe(num_train_prompts=16, distill_steps=1, distill_batch=4, threshold_samples=1)
    built = ChainLM(recipe, cache_dir=tmp_path_factory.mktemp("pi0_v6"))
    built.threshold = -31.0  # below the floored m(y): only the grammar and the chain decide, except where set
    return built


def spell(world: ChainLM, steps: list[int], answer: int | None, text: int = 2, eos: bool = True,
          width: int | None = None) -> torch.Tensor:
    """A response: for each step ``text`` text tokens, ``=``, the digit; then ANS and ``answer``; then EOS padding."""
    tokens: list[int] = []
    for digit in steps:
        tokens += [TEXT] * text + [STEP, digit]
    tokens += [TEXT]
    if answer is not None:
        tokens += [ANS, answer]
    if eos:
        tokens += [EOS]
    width = width or world.max_response_len
    fill = EOS if eos else TEXT
    return torch.tensor((tokens + [fill] * width)[:width])


def right_chain(world: ChainLM, prompt: int, n: int) -> tuple[list[int], int]:
    digit = int(world.teacher.start[world.prompt_keys[prompt]])
    steps = [digit]
    for _ in range(n - 1):
        steps.append(int(world.teacher.rules[0][steps[-1]]))
    return steps, int(world.teacher.rules[0][steps[-1]])


def reward(world: ChainLM, prompt: int, response: torch.Tensor) -> float:
    index = torch.tensor([prompt])
    return float(world.reward(index, response[None], response_mask(response[None]))[0])


def test_prompts_spell_the_key_after_the_special_tokens(world):
    """A prompt is [13 + key, 3 text tokens ≥ 13]: the key token and the context never hit a digit, ANS, EOS (11)
    or ``=`` (12); the draws are the recipe's own (seed r.seed, contexts drawn in one call, as written here)."""
    tokens, keys = world.prompt_tokens, world.prompt_keys
    assert torch.equal(tokens[:, 0], 13 + keys)
    assert int(tokens[:, 1:].min()) >= 13
    generator = torch.Generator().manual_seed(world.recipe.seed)
    context = torch.randint(13, world.recipe.vocab_size, (len(keys), 3), generator=generator)
    assert torch.equal(tokens[:, 1:], context)


def test_rule_is_a_permutation_without_fixed_points_and_starts_are_balanced(world):
    rule = world.teacher.rules[0]
    assert sorted(rule.tolist()) == list(range(10)) and bool((rule != torch.arange(10)).all())
    counts = torch.bincount(world.teacher.start, minlength=10)
    assert int(counts.max() - counts.min()) <= 1


def test_reward_on_hand_built_responses(world):
    steps, answer = right_chain(world, 0, 3)
    assert reward(world, 0, spell(world, steps, answer)) == 1.0
    assert reward(world, 0, spell(world, steps, (answer + 1) % 10)) == pytest.approx(0.1)  # wrong answer
    wrong_start = [(steps[0] + 1) % 10]
    for _ in range(2):
        wrong_start.append(int(world.teacher.rules[0][wrong_start[-1]]))
    consistent = int(world.teacher.rules[0][wrong_start[-1]])
    assert reward(world, 0, spell(world, wrong_start, consistent)) == pytest.approx(0.1)  # consistent but wrong
    long_steps, long_answer = right_chain(world, 0, 6)
    assert reward(world, 0, spell(world, long_steps, long_answer)) == 1.0  # more steps, still right


def test_every_step_carries_credit(world):
    """Changing any one step digit of a right chain loses the answer credit (0.1 remains)."""
    steps, answer = right_chain(world, 3, 5)
    for j in range(len(steps)):
        broken = list(steps)
        broken[j] = (broken[j] + 3) % 10
        assert reward(world, 3, spell(world, broken, answer)) == pytest.approx(0.1), j


def test_format_rules_give_zero(world):
    steps, answer = right_chain(world, 1, 3)
    short, short_answer = right_chain(world, 1, 2)
    assert reward(world, 1, spell(world, short, short_answer)) == 0.0  # fewer than min_steps steps
    assert reward(world, 1, spell(world, steps, None)) == 0.0  # EOS without an answer
    truncated = spell(world, steps, answer, eos=False)
    assert reward(world, 1, truncated) == 0.0  # no EOS within T
    digit_in_text = spell(world, steps, answer)
    digit_in_text[0] = 5
    assert reward(world, 1, digit_in_text) == 0.0
    text_after_ans = spell(world, steps, answer)
    position = int((text_after_ans == ANS).nonzero()[0])
    text_after_ans[position + 1] = TEXT
    assert reward(world, 1, text_after_ans) == 0.0


def test_a_truncated_right_chain_earns_nothing(world):
    """A right chain whose answer fits in the last two positions but whose EOS does not: no credit; one text
    token fewer, so that EOS fits, earns 1."""
    steps, answer = right_chain(world, 2, 3)
    width = world.max_response_len
    body = spell(world, steps, None, eos=False, width=4 * len(steps))
    truncated = torch.cat([body, torch.full((width - body.numel() - 2,), TEXT), torch.tensor([ANS, answer])])
    assert truncated.numel() == width
    assert not bool(world.parse(torch.tensor([2]), truncated[None])["ended"][0])
    assert reward(world, 2, truncated) == 0.0
    fits = torch.cat([body, torch.full((width - body.numel() - 3,), TEXT), torch.tensor([ANS, answer, EOS])])
    assert reward(world, 2, fits) == 1.0


def test_off_manifold_text_loses_the_format_credit(world):
    steps, answer = right_chain(world, 0, 3)
    response = spell(world, steps, answer)
    m = world.teacher.mean_log_prob(world.prompt_tokens[[0]], response[None])
    try:
        world.threshold = float(m) + 1.0
        assert reward(world, 0, response) == 0.0
        world.threshold = float(m) - 1.0
        assert reward(world, 0, response) == 1.0
    finally:
        world.threshold = -31.0


def test_response_mask_counts_eos_and_masks_the_padding():
    response = torch.tensor([[20, STEP, 3, ANS, 4, EOS, EOS, EOS], [20] * 8])
    assert response_mask(response).tolist() == [[1, 1, 1, 1, 1, 1, 0, 0], [1] * 8]


def test_teacher_samples_follow_the_grammar_and_its_two_paths_agree(world):
    generator = torch.Generator().manual_seed(0)
    prompts = random_prompts(world.recipe, 64, generator)
    response, sampled = world.teacher.sample(prompts, generator)
    found = parse(response, world.teacher.start[prompts[:, 0] - 13], world.teacher.rules[0], prompts)
    assert bool((found["grammar"] | ~found["ended"]).all())
    assert float(found["ended"].float().mean()) > 0.9
    forced = world.teacher.log_probs(prompts, response)
    finite = torch.isfinite(sampled)
    assert torch.equal(finite, torch.isfinite(forced))
    # α κ multiplies the float32 rounding of the hidden state (cached against full pass): measured 3e-5 / 6e-5
    assert float((sampled.exp() - forced.exp()).abs().max()) < 1e-4
    read = sampled.gather(-1, response[..., None]) - forced.gather(-1, response[..., None])
    assert float(read.abs().max()) < 1e-3
    after_eos = response_mask(response) == 0
    assert bool((response[after_eos] == EOS).all())


def test_chain_states_track_steps_and_the_answer_slot():
    prompt = torch.tensor([[13, 20, 21, 22]])
    response = torch.tensor([[20, STEP, 3, 20, STEP, 7, ANS, 1, EOS, EOS]])
    states = chain_states(prompt, response)
    assert [int(s.steps[0]) for s in states] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    assert [int(s.last_step[0]) for s in states] == [-1, -1, -1, 3, 3, 3, 7, 7, 7, 7]
    assert [bool(s.after_answer()[0]) for s in states] == [False] * 8 + [True, False]
    assert bool(states[-1].ended[0]) and isinstance(states[0], ChainState)


def test_pi0_samples_end_with_eos_and_mask_the_rest(world):
    policy = world.pretrained_policy()
    assert policy.eos_id == EOS and policy.response_len == world.max_response_len
    rollout = policy.sample(world.eval_prompts(), 2, 1.0, torch.Generator().manual_seed(0))
    assert torch.equal(rollout.response_mask, response_mask(rollout.response_ids))
    rewards = world.reward(rollout.prompt_index, rollout.response_ids, rollout.response_mask)
    assert rewards.shape == (rollout.response_ids.shape[0],)


def test_preset_dispatch_and_parameters(world, tmp_path):
    built = make_world("synthetic_lm", preset="seed_scale_v6", num_train_prompts=16, distill_steps=1,
                       distill_batch=4, cache_dir=str(tmp_path))
    assert isinstance(built, ChainLM)
    assert built.recipe == replace(ChainRecipe(), num_train_prompts=16, distill_steps=1, distill_batch=4)
    assert built.recipe.response_len == 64  # the registry's v5 default (32) means "the preset's value"
    with pytest.raises(ValueError, match="not a parameter of preset"):
        make_world("synthetic_lm", preset="seed_scale_v6", ans_prob=0.5, num_train_prompts=16, distill_steps=1,
                   cache_dir=str(tmp_path))


def test_v5_recipe_is_untouched():
    """Recipe v5 (preset ``seed_scale``) is unchanged: its recipe digest (the shipped π₀'s file name) is the same."""
    from offpolicylab.worlds.synthetic_lm import PACKAGED_DIR, PRESETS

    assert (PACKAGED_DIR / f"{PRESETS['seed_scale'].digest()[:32]}.pt").exists()
    assert (PACKAGED_DIR / f"{PRESETS['smollm2'].digest()[:32]}.pt").exists()


def test_seed_scale_v6_pi0_has_a_reasoning_llms_token_entropies(tmp_path, capsys):
    """Calibration target (a) at the shipped ``seed_scale_v6`` π₀: 45–60 % of its temperature-1 tokens below
    0.01 nat and the 80th percentile in [0.5, 0.85] nat (Qwen3-8B's chain of thought: 50.64 %, 0.672 nat; Wang et
    al. 2025, arXiv:2506.01939); π₀'s responses end with EOS and carry a chain of ≥ 3 steps on average."""
    from offpolicylab.synthetic_lm_calibration import (
        SEED_SCALE_TARGETS,
        seed_scale_table,
        world_profile_document,
    )

    world = make_world("synthetic_lm", preset="seed_scale_v6", cache_dir=str(tmp_path))
    assert not any(tmp_path.iterdir()), "the shipped π₀ must be found without a build"
    pi0 = world.pretrained_policy()
    print(seed_scale_table(world, pi0))
    stats = world_profile_document(world, pi0)["profile"]
    (low_s, high_s), (low_p, high_p) = SEED_SCALE_TARGETS.values()
    assert low_s <= stats["share_entropy_below_0.01"] <= high_s
    assert low_p <= stats["entropy_p80"] <= high_p
    rollout = pi0.sample(world.eval_prompts(), 4, 1.0, torch.Generator().manual_seed(0))
    found = world.parse(rollout.prompt_index, rollout.response_ids)
    assert float(found["ended"].float().mean()) > 0.95
    assert float(found["steps"].float().mean()) >= 3.0
