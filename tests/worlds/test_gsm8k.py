"""GSM8k world: answer extraction (incl. hypothesis properties and adversarial inputs), rewards, prompts, data."""

from __future__ import annotations

import json
import re
import signal
from decimal import Decimal
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from offpolicylab.worlds.gsm8k import (
    INSTRUCTION,
    GSM8kWorld,
    Problem,
    extract_answer,
    load_problems,
    make_gsm8k_world,
    score_response,
)

pytestmark = pytest.mark.llm
SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k"


@pytest.mark.parametrize("text, expected", [
    ("so she makes 9 * 2 = 18.\n#### 18", "18"),
    ("#### 1,234,567", "1234567"),
    ("####-42", "-42"),
    ("#### $3.50.", "3.50"),
    ("first #### 3 then #### 4", "4"),
    ("The final answer is \\boxed{12}.", "12"),
    ("\\boxed{1,000} and then \\boxed{-0.5}", "-0.5"),
    ("So the answer is: 56", "56"),
    ("The Answer Is $7,200.", "7200"),
    ("#### 5 but \\boxed{6}", "5"),  # #### takes precedence
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == Decimal(expected)


@pytest.mark.parametrize("text", ["", "no numbers", "12 apples", "#### x", "\\boxed{x+1}", "\\boxed{\\frac{1}{2}}",
                                  "the answer is unknown", "#### 1e5"[:5]])
def test_unparsable_is_none(text):
    assert extract_answer(text) is None


def test_rewards_follow_m2po():
    assert score_response("#### 18", Decimal(18)) == 1.0
    assert score_response("#### 18.0", Decimal(18)) == 1.0
    assert score_response("#### 17", Decimal(18)) == 0.1
    assert score_response("I think 18", Decimal(18)) == 0.0


@given(st.integers(-10**12, 10**12), st.integers(0, 3), st.text(max_size=40), st.booleans())
@settings(max_examples=200, deadline=None)
def test_formatted_numbers_round_trip(value, decimals, prefix, commas):
    number = Decimal(value).scaleb(-decimals)
    text = f"{number:,}" if commas else str(number)
    prefix = prefix.replace("#", "").replace("\\", "").replace("answer", "")
    assert extract_answer(f"{prefix}\n#### {text}") == number
    assert extract_answer(f"{prefix} \\boxed{{{text}}}") == number


@given(st.text(max_size=300))
@settings(max_examples=300, deadline=None)
def test_extract_never_fails_on_arbitrary_text(text):
    value = extract_answer(text)
    assert value is None or isinstance(value, Decimal)


class _Hang(Exception):
    pass


@pytest.mark.parametrize("piece", ["#### ", "####$", "\\boxed{", "\\boxed{1", "answer is ", "answer is $", "1,", "9",
                                   "-", "#### 1,", ".5", "answer is 1,1", "$ "])
def test_megabyte_adversarial_input_finishes(piece):
    """A hang guard, not a timing test: linear extraction takes well under a second on 1 MB; a backtracking
    (quadratic) pattern would take hours, and the alarm turns that into a failure."""
    text = piece * (1_000_000 // len(piece))

    def on_alarm(signum, frame):
        raise _Hang(piece)

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(30)
    try:
        extract_answer(text)
        extract_answer(text + "x")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def write_jsonl(path: Path, rows: list[tuple[str, str]]) -> None:
    path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in rows))


@pytest.fixture
def data_dir(tmp_path) -> Path:
    write_jsonl(tmp_path / "train.jsonl", [("What is 2+3?", "2+3=5\n#### 5"), ("Add 1,000 and 1.", "#### 1,001"),
                                           ("Hi?", "#### -7")])
    write_jsonl(tmp_path / "test.jsonl", [("What is 4*4?", "#### 16"), ("Half of 3?", "#### 1.5")])
    return tmp_path


def test_task_prompts_are_left_padded_chat_prompts(tokenizer, data_dir):
    world = make_gsm8k_world(tokenizer, data=str(data_dir), n_eval=2, max_response_len=16)
    assert world.n_train == 3 and world.max_response_len == 16 and world.eos_id == tokenizer.eos_token_id
    prompts = world.make_prompts(torch.tensor([0, 2]))
    short = prompts.mask[1] == 0
    assert short.any() and prompts.mask[0].eq(1).all() and prompts.ids[1][short].eq(tokenizer.pad_token_id).all()
    assert int(short.nonzero().max()) + 1 == int(short.sum())  # padding on the left only
    text = tokenizer.decode(prompts.ids[1][~short])
    assert text.startswith("<|user|>Hi?") and text.endswith("<|assistant|>") and "####" in text
    evals = world.eval_prompts()
    assert evals.index.tolist() == [3, 4] and torch.equal(world.eval_prompts().ids, evals.ids)
    a = world.sample_prompts(5, torch.Generator().manual_seed(0))
    b = world.sample_prompts(5, torch.Generator().manual_seed(0))
    assert torch.equal(a.index, b.index) and a.index.max() < 3
    # a character tokenizer: the longest question ("Add 1,000 and 1.") makes the longest prompt
    assert world.longest_prompt_tokens() == max(len(world.prompt_tokens(i)) for i in range(5)) > 16
    assert make_gsm8k_world(tokenizer, data=str(data_dir), n_eval=2, max_prompt_tokens=16).longest_prompt_tokens() == 16


def test_plain_template_without_chat_template(tokenizer, data_dir):
    world = make_gsm8k_world(tokenizer, data=str(data_dir), n_eval=1, use_chat_template=False)
    assert world.prompt_text(0).startswith("Question: What is 2+3?") and world.prompt_text(0).endswith("Answer:")


@pytest.mark.parametrize("use_chat_template", [True, False])
def test_no_prompt_holds_a_number_beyond_its_question(tokenizer, data_dir, use_chat_template):
    """A number in the instruction (e.g. an example "#### 42") can be copied as an answer: the only digits of a prompt
    are its question's."""
    world = make_gsm8k_world(tokenizer, data=str(data_dir), n_eval=2, use_chat_template=use_chat_template)
    assert not re.search(r"\d", INSTRUCTION)
    for index, problem in enumerate(world.problems):
        text = world.prompt_text(index)
        assert problem.question in text
        assert not re.search(r"\d", text.replace(problem.question, "")), text
        decoded = tokenizer.decode(world.prompt_tokens(index))
        assert re.findall(r"\d", decoded) == re.findall(r"\d", problem.question)


def test_reward_reads_only_unmasked_tokens(tokenizer, data_dir):
    world = make_gsm8k_world(tokenizer, data=str(data_dir), n_eval=2)
    texts = ["so #### 5", "#### 4", "five", "#### 1,001", "#### 16.0", "#### 1.5"]
    width = max(len(t) for t in texts) + 6
    ids = torch.full((len(texts), width), tokenizer.pad_token_id)
    mask = torch.zeros(len(texts), width)
    for row, text in enumerate(texts):
        tokens = tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]
        ids[row, :len(tokens)] = torch.tensor(tokens)
        mask[row, :len(tokens)] = 1
    ids[2, -6:] = torch.tensor(tokenizer("#### 5")["input_ids"])  # garbage after EOS, masked out
    rewards = world.reward(torch.tensor([0, 0, 0, 1, 3, 4]), ids, mask)
    assert rewards.tolist() == pytest.approx([1.0, 0.1, 0.0, 1.0, 1.0, 1.0])


def test_bad_data_arguments(tokenizer, data_dir, tmp_path):
    with pytest.raises(ValueError, match="exactly one of data"):
        make_gsm8k_world(tokenizer)
    with pytest.raises(ValueError, match="not found"):
        make_gsm8k_world(tokenizer, data=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="n_eval"):
        make_gsm8k_world(tokenizer, data=str(data_dir), n_eval=3)
    (tmp_path / "bad.jsonl").write_text(json.dumps({"question": "q", "answer": "no final"}) + "\n")
    with pytest.raises(ValueError, match="####"):
        load_problems(tmp_path / "bad.jsonl", "train")


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="the shared GSM8k files are not on this machine")
def test_real_gsm8k_files_parse():
    train, test = load_problems(SHARED_DATA, "train"), load_problems(SHARED_DATA, "test")
    assert (len(train), len(test)) == (7473, 1319)
    assert test[0].reference == Decimal(18)  # Janet's ducks
    assert all(isinstance(p, Problem) and p.reference == p.reference.to_integral_value() for p in train[:200])


def test_task_rollout_to_rewards_end_to_end(make_policy, tokenizer, data_dir):
    world = GSM8kWorld(tokenizer, load_problems(data_dir, "train"), load_problems(data_dir, "test"), n_eval=2,
                     max_response_len=6)
    policy = make_policy(max_new_tokens=world.max_response_len)
    rollout = policy.sample(world.sample_prompts(2, torch.Generator().manual_seed(0)), 3, 1.0,
                            torch.Generator().manual_seed(0))
    rewards = world.reward(rollout.prompt_index, rollout.response_ids, rollout.response_mask)
    assert rewards.shape == (6,) and set(rewards.tolist()) <= {0.0, 0.1, 1.0}


def test_world_builder_and_hf_policy_factory(tokenizer, data_dir, tmp_path):
    """The wiring the trainer uses: build_gsm8k_world(model=DIR, ...) then make_hf_policy(world, **params)."""
    from offpolicylab.policies import POLICIES
    from offpolicylab.policies.hf import BaseModelPolicy, make_hf_policy
    from offpolicylab.worlds import WORLDS
    from offpolicylab.worlds.gsm8k import build_gsm8k_world
    from tests.tiny_llm import build_model

    build_model(len(tokenizer), seed=0).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    options = WORLDS.resolve("gsm8k", {"model": str(tmp_path / "tiny"), "data": str(data_dir), "n_eval": "2",
                                       "max_response_len": "5"})
    world = build_gsm8k_world(**options)
    assert world.model == str(tmp_path / "tiny") and world.max_response_len == 5
    policy = make_hf_policy(world, **POLICIES.resolve("hf", {"lora_r": "4"}))
    assert policy.lora.r == 4 and policy.max_new_tokens == 5
    assert isinstance(policy.clone(), BaseModelPolicy)  # fresh adapter: π_0 is the base model
    rollout = policy.greedy(world.eval_prompts())
    assert len(rollout) == 2 and rollout.response_ids.shape[1] <= 5
    assert world.reward(rollout.prompt_index, rollout.response_ids, rollout.response_mask).shape == (2,)
    with pytest.raises(ValueError, match="model=PATH"):
        build_gsm8k_world(data=str(data_dir))
