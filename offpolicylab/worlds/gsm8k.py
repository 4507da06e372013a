"""GSM8k (Cobbe et al. 2021, "Training Verifiers to Solve Math Word Problems") as a batched :class:`~offpolicylab.contracts.World`.

Reward as in M2PO's setup (Zheng et al. 2025, "Prosperity before Collapse"; verl's ``gsm8k`` scorer with
``format_score=0.1``): r = 1.0 when the extracted final answer equals the reference, 0.1 when an answer can be
extracted but is wrong, 0 when none can.  The final answer is read from the *last* ``#### N``, else the last
``\\boxed{N}``, else the last "the answer is N"; numbers are ASCII digits (``0-9`` only: ``４２`` is not a number) with
an optional sign, ``$`` and decimals, and thousands commas only in groups of three (``1,234`` is 1234; ``4,2`` is
not an answer), and are compared exactly as decimals (``18.00`` = ``18``).  Extraction uses only linear-time regular expressions (no
adjacent quantifiers over overlapping classes, no nested quantifiers) and never evaluates text.

Data: ``data=PATH`` (a ``.jsonl`` file, or a directory with ``train.jsonl`` / ``test.jsonl``; fields ``question`` and
``answer``, the reference after ``####``), or ``hub=NAME`` (e.g. ``openai/gsm8k``) through ``datasets``, when online.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from offpolicylab.contracts import Prompts
from offpolicylab.registry import parse_json

CORRECT_REWARD = 1.0
FORMAT_REWARD = 0.1

# No example answer: a literal "#### 42" in the instruction is copied by small models (3 of 6 SmolLM2 samples at
# T = 0.7), earning the format reward and, on problems whose answer is 42, the full one.
INSTRUCTION = ("Solve the problem step by step. End your response with a line that starts with '####' followed by "
               "the final answer as a plain number.")
PLAIN_TEMPLATE = "Question: {question}\n{instruction}\nAnswer:"

# ASCII digits only (Python's \d also matches ４ and other Unicode digits); a digit run ends at a non-digit, and a
# comma may follow only as a thousands separator (checked by _CLEAN_NUMBER), so "#### 4,2" yields no answer
_NUMBER = r"[-+]?[0-9][0-9,]*(?:\.[0-9]+)?"
_HASH_ANSWER = re.compile(r"####[ \t$]*(" + _NUMBER + ")")
_BOXED = re.compile(r"\\boxed\{([^{}]{0,64})\}")
_ANSWER_IS = re.compile(r"answer is[: \t$]*(" + _NUMBER + ")", re.IGNORECASE)
_CLEAN_NUMBER = re.compile(r"[-+]?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?")


def normalize_number(text: str) -> Decimal | None:
    """``"-1,234.50"`` → Decimal('-1234.50'): strip ``$``, spaces, a trailing comma or period; None unless what is
    left is an ASCII decimal number whose commas separate groups of three digits."""
    cleaned = text.strip().replace("$", "").replace(" ", "").rstrip(".").rstrip(",")
    if len(cleaned) > 64 or not _CLEAN_NUMBER.fullmatch(cleaned):
        return None
    try:
        return Decimal(cleaned.replace(",", ""))
    except InvalidOperation:  # pragma: no cover - the regex admits only valid decimals
        return None


def extract_answer(text: str) -> Decimal | None:
    """The final numeric answer of a response: the last ``#### N``, else the last ``\\boxed{N}``, else the last
    "the answer is N"; None when there is none (the response is not parsable)."""
    for pattern in (_HASH_ANSWER, _BOXED, _ANSWER_IS):
        last = None
        for match in pattern.finditer(text):
            last = match
        if last is not None:
            value = normalize_number(last.group(1))
            if value is not None:
                return value
    return None


def reference_answer(answer_field: str) -> Decimal:
    """The reference of a GSM8k ``answer`` field: the number after its ``####``."""
    value = extract_answer(answer_field[answer_field.rfind("####"):]) if "####" in answer_field else None
    if value is None:
        raise ValueError(f"GSM8k answer has no '#### N' final answer: {answer_field[-80:]!r}")
    return value


def score_response(text: str, reference: Decimal) -> float:
    """1.0 when the extracted answer equals ``reference``, 0.1 when an answer is parsable but wrong, else 0."""
    value = extract_answer(text)
    if value is None:
        return 0.0
    return CORRECT_REWARD if value == reference else FORMAT_REWARD


@dataclass(frozen=True)
class Problem:
    question: str
    reference: Decimal


def load_problems(data: str | Path, split: str) -> list[Problem]:
    """Problems of ``split`` from a ``.jsonl`` file, or from ``DIR/{split}.jsonl`` when ``data`` is a directory."""
    path = Path(data)
    if path.is_dir():
        path = path / f"{split}.jsonl"
    if not path.is_file():
        raise ValueError(f"GSM8k data {str(path)!r} not found; valid: a .jsonl file or a directory with "
                         "train.jsonl and test.jsonl")
    problems = []
    try:
        lines = path.read_bytes().decode("utf-8").split("\n")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise ValueError(f"{path}:{line}: not UTF-8 text ({exc.reason} at byte {exc.start}); valid: one JSON object "
                         "per line, UTF-8 encoded") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        row = parse_json(line, f"{path}:{number}", "one JSON object per line", at="column")
        if not isinstance(row, dict) or "question" not in row or "answer" not in row:
            got = sorted(row) if isinstance(row, dict) else f"a JSON {type(row).__name__}"
            raise ValueError(f"{path}:{number}: a GSM8k row needs 'question' and 'answer', got {got}")
        wrong = [key for key in ("question", "answer") if not isinstance(row[key], str)]
        if wrong:
            raise ValueError(f"{path}:{number}: a GSM8k row's {wrong[0]} must be a string, got "
                             f"{type(row[wrong[0]]).__name__}")
        try:
            problems.append(Problem(row["question"], reference_answer(row["answer"])))
        except ValueError as exc:
            raise ValueError(f"{path}:{number}: {exc}") from None
    if not problems:
        raise ValueError(f"GSM8k data {str(path)!r} holds no rows")
    return problems


def load_hub_problems(name: str, split: str) -> list[Problem]:
    """Problems of ``split`` from the Hugging Face hub through ``datasets`` (e.g. ``openai/gsm8k``, config main)."""
    try:
        from datasets import load_dataset
    except ImportError:
        raise ValueError("hub=NAME needs the datasets package (the llm extra: pip install 'offpolicylab[llm]'); "
                         "offline, pass data=PATH (a directory with train.jsonl and test.jsonl)") from None
    try:
        rows = load_dataset(name, "main", split=split)
    except Exception as exc:
        raise ValueError(f"cannot load GSM8k {name!r} from the hub ({exc}); offline, pass data=PATH "
                         "(a directory with train.jsonl and test.jsonl)") from exc
    return [Problem(row["question"], reference_answer(row["answer"])) for row in rows]


class GSM8kWorld:
    """GSM8k prompts → responses → rewards for one tokenizer.

    Prompt ids ``index`` are global: training problems are ``0 … n_train−1`` and the held-out test problems
    ``n_train + j``, so :meth:`reward` looks up the reference of either split.

    Args:
        tokenizer: the policy's tokenizer (its chat template is used when it has one, else :data:`PLAIN_TEMPLATE`).
        train, test: the problems.
        max_response_len: T, the longest response (the policy's ``max_new_tokens``).
        n_eval: size of the fixed held-out set (the first ``n_eval`` test problems).
        max_prompt_tokens: prompts longer than this are cut from the left (keeping the instruction at the end).
        system_prompt: a system message for chat templates (None: the template's default).
        use_chat_template: False forces the plain template.
    """

    def __init__(
        self,
        tokenizer: Any,
        train: Sequence[Problem],
        test: Sequence[Problem],
        *,
        max_response_len: int = 200,
        n_eval: int = 16,
        max_prompt_tokens: int = 512,
        system_prompt: str | None = None,
        use_chat_template: bool = True,
        instruction: str = INSTRUCTION,
    ) -> None:
        if not train or not test:
            raise ValueError("GSM8k needs non-empty train and test problems")
        if not 1 <= n_eval <= len(test):
            raise ValueError(f"n_eval={n_eval} is invalid; valid: an integer in [1, {len(test)}]")
        if max_response_len < 1 or max_prompt_tokens < 8:
            raise ValueError("max_response_len must be >= 1 and max_prompt_tokens >= 8")
        self.tokenizer = tokenizer
        self.problems: list[Problem] = [*train, *test]
        self.n_train = len(train)
        self.n_eval = n_eval
        self.max_response_len = int(max_response_len)
        self.max_prompt_tokens = int(max_prompt_tokens)
        self.system_prompt = system_prompt
        self.instruction = instruction
        self.use_chat_template = bool(use_chat_template and getattr(tokenizer, "chat_template", None))
        self.vocab_size = len(tokenizer)
        self.eos_id: int | None = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._token_cache: dict[int, list[int]] = {}
        self.model: str | None = None  # set by build_gsm8k_world: the model the hf policy loads
        self.gguf_file: str | None = None

    # --------------------------------------------------------------------------------------------- prompts
    def prompt_text(self, index: int) -> str:
        question = self.problems[index].question
        if not self.use_chat_template:
            return PLAIN_TEMPLATE.format(question=question, instruction=self.instruction)
        messages = [{"role": "user", "content": f"{question}\n{self.instruction}"}]
        if self.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def prompt_tokens(self, index: int) -> list[int]:
        if index not in self._token_cache:
            ids = self.tokenizer(self.prompt_text(index), add_special_tokens=not self.use_chat_template)["input_ids"]
            self._token_cache[index] = list(ids)[-self.max_prompt_tokens:]
        return self._token_cache[index]

    def longest_prompt_tokens(self) -> int:
        """The token count of the prompt with the longest question in characters (train and test): the longest
        prompt, or close to it, without tokenizing every problem (used to plan memory)."""
        index = max(range(len(self.problems)), key=lambda i: len(self.problems[i].question))
        return len(self.prompt_tokens(index))

    def make_prompts(self, indices: Tensor) -> Prompts:
        """Tokenize and left-pad the problems ``indices`` (global ids) into :class:`Prompts`."""
        rows = [self.prompt_tokens(int(i)) for i in indices.tolist()]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.float32)
        for row, tokens in enumerate(rows):
            ids[row, width - len(tokens):] = torch.tensor(tokens, dtype=torch.long)
            mask[row, width - len(tokens):] = 1.0
        return Prompts(ids=ids, mask=mask, index=indices.to(torch.long).clone())

    def sample_prompts(self, n: int, generator: torch.Generator) -> Prompts:
        """``n`` training problems drawn uniformly with replacement."""
        if n < 1:
            raise ValueError(f"n={n} is invalid; valid: an integer >= 1")
        return self.make_prompts(torch.randint(0, self.n_train, (n,), generator=generator))

    def eval_prompts(self, n: int | None = None) -> Prompts:
        """The fixed held-out set: the first ``n`` (default ``n_eval``) test problems."""
        n = self.n_eval if n is None else n
        if not 1 <= n <= len(self.problems) - self.n_train:
            raise ValueError(f"n={n} is invalid; valid: an integer in [1, {len(self.problems) - self.n_train}]")
        return self.make_prompts(torch.arange(self.n_train, self.n_train + n))

    # -------------------------------------------------------------------------------------------- rewards
    def decode(self, response_ids: Tensor, response_mask: Tensor) -> list[str]:
        rows = [ids[mask > 0].tolist() for ids, mask in zip(response_ids.cpu(), response_mask.cpu(), strict=True)]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def reward(self, prompt_index: Tensor, response_ids: Tensor, response_mask: Tensor,
               generator: torch.Generator | None = None) -> Tensor:
        """[B] rewards: 1.0 correct, 0.1 parsable but wrong, 0 otherwise (``generator`` is unused)."""
        texts = self.decode(response_ids, response_mask)
        values = [score_response(text, self.problems[int(i)].reference)
                  for text, i in zip(texts, prompt_index.tolist(), strict=True)]
        return torch.tensor(values, dtype=torch.float32, device=response_ids.device)


def make_gsm8k_world(
    tokenizer: Any,
    *,
    data: str | None = None,
    hub: str | None = None,
    train_split: str = "train",
    test_split: str = "test",
    **options: Any,
) -> GSM8kWorld:
    """The GSM8k world for ``tokenizer`` from ``data=PATH`` (file or directory) or, online, ``hub=NAME``.

    ``options`` go to :class:`GSM8kWorld` (``max_response_len``, ``n_eval``, ``max_prompt_tokens``, ``system_prompt``,
    ``use_chat_template``, ``instruction``)."""
    if (data is None) == (hub is None):
        raise ValueError("gsm8k needs exactly one of data=PATH (a .jsonl file or a directory with train.jsonl and "
                         "test.jsonl) or hub=NAME (e.g. openai/gsm8k, needs the network)")
    if data is not None:
        train, test = load_problems(data, train_split), load_problems(data, test_split)
    else:
        train, test = load_hub_problems(hub, train_split), load_hub_problems(hub, test_split)
    return GSM8kWorld(tokenizer, train, test, **options)


def gsm8k_params() -> dict[str, Any]:
    """Parameter specs of the ``gsm8k`` world (``--world-param k=v``) for ``worlds.register_world``."""
    from offpolicylab.registry import Param

    return {
        "model": Param(None, str, optional=True, doc="hub id, local directory or .gguf file (its tokenizer "
                                                     "builds the prompts; the hf policy loads it)"),
        "gguf_file": Param(None, str, optional=True, doc="GGUF file name inside the model directory"),
        "data": Param(None, str, optional=True, doc="a .jsonl file or a directory with train.jsonl / test.jsonl"),
        "hub": Param(None, str, optional=True, doc="hub dataset name (e.g. openai/gsm8k; needs the network)"),
        "max_response_len": Param(200, int, low=1, doc="longest response T (the policy's max_new_tokens)"),
        "n_eval": Param(16, int, low=1, doc="fixed held-out test questions for evaluation (each costs one greedy "
                                                "and eval_samples sampled responses)"),
        "max_prompt_tokens": Param(512, int, low=8, doc="prompts are cut from the left to this many tokens"),
        "use_chat_template": Param(True, bool, doc="use the tokenizer's chat template when it has one"),
    }


def build_gsm8k_world(model: str | None = None, gguf_file: str | None = None, **options: Any) -> GSM8kWorld:
    """The ``gsm8k`` world for ``worlds.make_world``: loads ``model``'s tokenizer and remembers the model so that the
    ``hf`` policy (``offpolicylab.policies.hf.make_hf_policy``) loads the same one."""
    from offpolicylab.policies.hf_loading import load_tokenizer, split_model_path

    if not model:
        raise ValueError("gsm8k needs --world-param model=PATH (a hub id, a local directory or a .gguf file)")
    model, gguf_file = split_model_path(model, gguf_file)
    world = make_gsm8k_world(load_tokenizer(model, gguf_file), **options)
    world.model, world.gguf_file = model, gguf_file
    return world
