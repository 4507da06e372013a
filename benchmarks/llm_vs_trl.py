"""Seconds per update on CPU: offpolicylab's HFPolicy + GRPO objective vs TRL's ``GRPOTrainer``.

Both sides get the same model, tokenizer, prompts, group size G, prompts per update N, ``--max-new`` tokens, LoRA
(rank r, alpha 2r, on q_proj and v_proj), temperature 1, no KL term (TRL ``beta=0``), one optimizer step per
generation batch.  An update = generate N·G responses, reward them, score, loss, backward, Adam step.  Reports the
median of ``--updates`` timed updates after ``--warmup`` and the ratio ours / TRL (target ≤ 1.0).

Without ``--model``: a tiny random Llama (tests/tiny_llm.py; ``--hidden`` wide, 2 layers), a local character
tokenizer, arithmetic prompts and a toy reward (the share of digits).  With ``--model PATH`` (a model directory
or ``.gguf`` file) and ``--data DIR`` (GSM8k jsonl): that model, the GSM8k world's prompts (chat template and
instruction) and its reward (1 correct, 0.1 parsable, 0).

    python benchmarks/llm_vs_trl.py --updates 8 --warmup 2
    python benchmarks/llm_vs_trl.py --model models/smollm2-135m-instruct --data ../shared/data/gsm8k \
        --prompts 4 --group 4 --max-new 64 --updates 3 --warmup 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from offpolicylab.objectives import TokenBatch, get_objective  # noqa: E402
from offpolicylab.objectives.advantages import group_advantages  # noqa: E402
from offpolicylab.policies.hf import HFPolicy, LoraSpec  # noqa: E402
from tests.tiny_llm import build_model, build_tokenizer  # noqa: E402

ARITHMETIC = [f"What is {a} plus {b}?" for a, b in zip(range(3, 40, 3), range(11, 99, 7), strict=False)]


def digit_share(text: str) -> float:
    """Toy verifiable reward of the tiny setup: the share of digits in the response."""
    return sum(c.isdigit() for c in text) / max(len(text), 1)


@dataclass
class Setup:
    """What both sides share: a fresh copy of the model, its tokenizer, the prompt texts (used in order, N per
    update) and the reward of (prompt number, response text)."""

    new_model: Callable[[], Any]
    tokenizer: Any
    prompts: list[str]
    reward: Callable[[int, str], float]


def tiny_setup(args: argparse.Namespace) -> Setup:
    tokenizer = build_tokenizer()
    return Setup(lambda: build_model(len(tokenizer), 0, args.hidden), tokenizer, ARITHMETIC,
                 lambda _, text: digit_share(text))


def model_setup(args: argparse.Namespace) -> Setup:
    """``--model`` and the GSM8k world of ``--data``: the first N·(warmup + updates) training problems."""
    from offpolicylab.policies.hf_loading import load_model_and_tokenizer
    from offpolicylab.worlds.gsm8k import make_gsm8k_world, score_response

    _, tokenizer = load_model_and_tokenizer(args.model)
    world = make_gsm8k_world(tokenizer, data=args.data, max_response_len=args.max_new, n_eval=1)
    count = args.prompts * (args.warmup + args.updates)
    return Setup(lambda: load_model_and_tokenizer(args.model)[0], tokenizer,
                 [world.prompt_text(i) for i in range(count)],
                 lambda i, text: score_response(text, world.problems[i % count].reference))


def encode(tokenizer: Any, texts: list[str], first: int):
    """``texts`` tokenized as TRL does (no special tokens added: the chat template has them) and left-padded."""
    from offpolicylab.contracts import Prompts

    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((len(rows), width), pad)
    mask = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    return Prompts(ids, mask, torch.arange(first, first + len(rows)))


def time_ours(args: argparse.Namespace, setup: Setup) -> tuple[list[float], float]:
    torch.manual_seed(0)
    tokenizer = setup.tokenizer
    policy = HFPolicy(setup.new_model(), tokenizer,
                      lora=LoraSpec(r=args.lora_r, alpha=2.0 * args.lora_r, target_modules=("q_proj", "v_proj")),
                      max_new_tokens=args.max_new)
    objective = get_objective("grpo")
    optimizer = torch.optim.Adam(policy.trainable_parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    times, lengths = [], []
    for update in range(args.warmup + args.updates):
        tick = time.perf_counter()
        first = (update * args.prompts) % len(setup.prompts)
        texts = [setup.prompts[(first + i) % len(setup.prompts)] for i in range(args.prompts)]
        rollout = policy.sample(encode(tokenizer, texts, first), args.group, 1.0, gen)
        decoded = tokenizer.batch_decode([ids[m > 0].tolist() for ids, m in
                                          zip(rollout.response_ids, rollout.response_mask, strict=True)],
                                         skip_special_tokens=True)
        rewards = torch.tensor([setup.reward(int(i), t) for i, t in zip(rollout.prompt_index, decoded,
                                                                        strict=True)])
        logp, entropy = policy.score(rollout)
        batch = TokenBatch(logp=logp, behavior_logp=rollout.behavior_logp, mask=rollout.response_mask,
                           advantages=group_advantages(rewards, rollout.group_ids, "std"), rewards=rewards,
                           group_ids=rollout.group_ids, entropy=entropy)
        loss = objective(batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if update >= args.warmup:
            times.append(time.perf_counter() - tick)
            lengths.append(float(rollout.response_mask.sum(1).mean()))
    return times, statistics.mean(lengths)


def time_trl(args: argparse.Namespace, setup: Setup) -> tuple[list[float], float]:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    tokenizer = setup.tokenizer
    model = setup.new_model()
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if model.generation_config.eos_token_id is None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    steps = args.warmup + args.updates
    numbers = [i % len(setup.prompts) for i in range(steps * args.prompts)]
    times: list[float] = []
    lengths: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.tick = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.tick)

        def on_log(self, _args, _state, _control, logs=None, **k):
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    def reward(completions, number, **kwargs):
        return [setup.reward(int(i), c) for i, c in zip(number, completions, strict=True)]

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, per_device_train_batch_size=args.prompts * args.group, num_generations=args.group,
            max_completion_length=args.max_new, max_steps=steps, learning_rate=1e-4, beta=0.0, temperature=1.0,
            top_k=0, top_p=1.0, logging_steps=1, report_to="none", save_strategy="no", use_cpu=True, bf16=False,
            gradient_accumulation_steps=1, num_iterations=1, shuffle_dataset=False, dataloader_num_workers=0,
            disable_tqdm=True, seed=0,
        )
        trainer = GRPOTrainer(
            model=model, reward_funcs=reward, args=config, processing_class=tokenizer,
            train_dataset=Dataset.from_dict({"prompt": [setup.prompts[i] for i in numbers], "number": numbers}),
            peft_config=LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, target_modules=["q_proj", "v_proj"],
                                   task_type="CAUSAL_LM"),
            callbacks=[Clock()],
        )
        trainer.train()
    return times[args.warmup:], statistics.mean(lengths[args.warmup:]) if lengths else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8, help="prompts per update N")
    parser.add_argument("--group", type=int, default=4, help="responses per prompt G")
    parser.add_argument("--max-new", type=int, default=32, help="max new tokens")
    parser.add_argument("--hidden", type=int, default=64, help="tiny Llama width (without --model)")
    parser.add_argument("--model", help="a model directory or .gguf file (default: the tiny random Llama)")
    parser.add_argument("--data", help="GSM8k jsonl directory (with --model)")
    parser.add_argument("--lora-r", type=int, default=8)
    parser.add_argument("--updates", type=int, default=8, help="timed updates")
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    if (args.model is None) != (args.data is None):
        parser.error("--model and --data go together")
    setup = model_setup(args) if args.model else tiny_setup(args)
    ours, ours_len = time_ours(args, setup)
    trl, trl_len = time_trl(args, setup)
    ours_s, trl_s = statistics.median(ours), statistics.median(trl)
    print(f"model={args.model or f'tiny random Llama, hidden={args.hidden}'}: N={args.prompts} prompts x "
          f"G={args.group}, max_new={args.max_new}, torch threads={torch.get_num_threads()}, "
          f"LoRA r={args.lora_r}, {args.updates} timed updates after {args.warmup} warm-up")
    print(f"ours: {ours_s:.3f} s/update (mean response length {ours_len:.1f}; each: {[round(t, 2) for t in ours]})")
    print(f"TRL GRPOTrainer: {trl_s:.3f} s/update (mean response length {trl_len:.1f}; each: {[round(t, 2) for t in trl]})")
    print(f"ratio ours/TRL = {ours_s / trl_s:.3f} (target <= 1.0)")


if __name__ == "__main__":
    main()
