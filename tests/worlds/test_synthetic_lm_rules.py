"""The chain world's ``num_rules`` (docs/synthetic_lm_v7.md, part 20): key k's chain follows G_{k mod R}.  R = 1 keeps
recipes v6 and v7 bit for bit (digest, so shipped π₀, and the rule drawn); R > 1 reaches the teacher, the reward and
``parse`` alike.  Expected values are spelled from the rule tables, not from the code under test."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from offpolicylab.worlds import make_world
from offpolicylab.worlds.synthetic_lm_v6 import (
    CHAIN_PRESETS,
    EOS,
    FIRST_TEXT,
    NUM_DIGITS,
    STEP,
    ChainLM,
    ChainRecipe,
    ChainTeacher,
)

TEXT = 40
TINY = ChainRecipe(num_keys=8, num_train_prompts=16, distill_steps=1, distill_batch=4, threshold_samples=1)
PACKAGED = Path(__file__).resolve().parents[2] / "offpolicylab" / "data" / "synthetic_lm"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> ChainLM:
    built = ChainLM(replace(TINY, num_rules=4), cache_dir=tmp_path_factory.mktemp("pi0_rules"))
    built.threshold = -31.0  # below the floored m(y): only the grammar and the chain decide
    return built


def test_one_rule_keeps_the_shipped_recipes() -> None:
    # the shipped π₀ files are named by the digests v6 and v7 had before the field existed
    for preset in ("seed_scale_v6", "seed_scale_v7"):
        recipe = CHAIN_PRESETS[preset]
        assert recipe.num_rules == 1 and "num_rules" not in recipe.identity()
        assert (PACKAGED / f"{recipe.digest()[:32]}.pt").exists()
        assert replace(recipe, num_rules=2).digest() != recipe.digest()


def test_the_first_rule_is_the_one_rule_and_every_rule_moves_every_digit() -> None:
    one, four = ChainTeacher(TINY), ChainTeacher(replace(TINY, num_rules=4))
    assert one.rules.shape == (1, NUM_DIGITS) and four.rules.shape == (4, NUM_DIGITS)
    assert torch.equal(four.rules[0], one.rules[0]) and torch.equal(four.start, one.start)
    for rule in four.rules:
        assert sorted(rule.tolist()) == list(range(NUM_DIGITS))
        assert all(rule[d] != d for d in range(NUM_DIGITS))
    assert len({tuple(rule.tolist()) for rule in four.rules}) == 4
    keys = torch.arange(8)
    assert torch.equal(four.rule_of(keys), four.rules[torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])])


def spell(start: int, table: list[int], steps: int, width: int) -> torch.Tensor:
    """A grammatical response whose chain starts at ``start`` and follows ``table`` for ``steps`` steps and the
    answer."""
    digits = [start]
    for _ in range(steps):
        digits.append(table[digits[-1]])
    tokens: list[int] = []
    for digit in digits[:-1]:
        tokens += [TEXT, STEP, digit]
    tokens += [TEXT, 10, digits[-1], EOS]  # ANS = 10
    return torch.tensor((tokens + [EOS] * width)[:width])


def test_the_reward_follows_each_keys_own_rule(world: ChainLM) -> None:
    rules = world.teacher.rules.tolist()
    keys = world.prompt_keys.tolist()
    first = next(i for i, k in enumerate(keys) if k % 4 == 0)
    start = int(world.teacher.start[keys[first]])
    # another rule that differs from key 0's within the spelled chain
    other = next(r for r in range(1, 4) if rules[r][start] != rules[0][start])
    width = world.max_response_len
    own = spell(start, rules[0], 3, width)
    foreign = spell(start, rules[other], 3, width)
    reward = world.reward(torch.tensor([first, first]), torch.stack([own, foreign]),
                          torch.ones(2, width))
    assert reward.tolist() == pytest.approx([1.0, 0.1])
    second = next(i for i, k in enumerate(keys) if k % 4 == other)
    start2 = int(world.teacher.start[keys[second]])
    reward2 = world.reward(torch.tensor([second]), spell(start2, rules[other], 3, width)[None], torch.ones(1, width))
    assert reward2.tolist() == [1.0]


def test_the_teacher_steps_by_the_keys_rule() -> None:
    """At a step digit, p_T ∝ exp(β_G 1[d = G(prev)] + g ẑ_d): the same network with R = 4 and R = 1 differs in log p
    by exactly β_G at G_{k mod 4}(prev) and −β_G at G_0(prev), up to one constant over the digits."""
    one, four = ChainTeacher(TINY), ChainTeacher(replace(TINY, num_rules=4))
    key = next(k for k in range(8) if not torch.equal(four.rule_of(torch.tensor([k]))[0], four.rules[0]))
    table = four.rules[key % 4].tolist()
    start = next(d for d in range(NUM_DIGITS) if table[d] != int(four.rules[0][d]))
    response = spell(start, table, 3, TINY.response_len)[None]
    prompt = torch.tensor([[FIRST_TEXT + key, 50, 60, 70]])
    slot = 5  # TEXT = s_1 d_1 TEXT = [digit]: the first step after a step
    assert response[0, slot - 1] == STEP and response[0, slot - 3] == start
    diff = (four.probs(prompt, response)[0, slot, :NUM_DIGITS].log()
            - one.probs(prompt, response)[0, slot, :NUM_DIGITS].log()).double()
    expected = torch.zeros(NUM_DIGITS, dtype=torch.float64)
    expected[table[start]] += TINY.rule_bonus
    expected[int(four.rules[0][start])] -= TINY.rule_bonus
    shift = diff - expected
    assert torch.allclose(shift, shift.mean().expand(NUM_DIGITS), atol=1e-4)


def test_num_rules_is_refused_where_it_cannot_apply() -> None:
    with pytest.raises(ValueError, match="num_rules=2 is a parameter of the chain presets only"):
        make_world("synthetic_lm", preset="seed_scale", num_rules=2)
    with pytest.raises(ValueError, match=r"num_rules=9 is invalid; valid: an integer in \[1, num_keys\]"):
        replace(TINY, num_rules=9)
