"""Seconds per update on CPU: offpolicylab's HFPolicy + GRPO objective vs TRL's ``GRPOTrainer``.

Same tiny random Llama (tests/tiny_llm.py; ``--hidden`` wide, 2 layers), same local character tokenizer, same
prompts, group size G, prompts per update N, ``--max-new`` tokens, LoRA rank, temperature 1, no KL term (TRL
``beta=0``), one optimizer step per generation batch.  An update = generate N·G responses, reward them, score,
loss, backward, Adam step.  Reports the median of ``--updates`` timed updates after ``--warmup`` and the ratio
ours / TRL (target ≤ 1.0).

    python benchmarks/llm_vs_trl.py --updates 8 --warmup 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from offpolicylab.objectives import TokenBatch, get_objective  # noqa: E402
from offpolicylab.policies.hf import HFPolicy, LoraSpec  # noqa: E402
from offpolicylab.trainer import group_advantages  # noqa: E402
from tests.tiny_llm import build_model, build_tokenizer, encode_prompts  # noqa: E402

PROMPTS = [f"What is {a} plus {b}?" for a, b in zip(range(3, 40, 3), range(11, 99, 7), strict=False)]


def reward_text(text: str) -> float:
    """Toy verifiable reward shared by both sides: the share of digits in the response."""
    return sum(c.isdigit() for c in text) / max(len(text), 1)


def time_ours(args: argparse.Namespace, tokenizer) -> tuple[list[float], float]:
    torch.manual_seed(0)
    policy = HFPolicy(build_model(len(tokenizer), 0, args.hidden), tokenizer,
                      lora=LoraSpec(r=args.lora_r, alpha=2.0 * args.lora_r, target_modules=("q_proj", "v_proj")),
                      max_new_tokens=args.max_new)
    objective = get_objective("grpo")
    optimizer = torch.optim.Adam(policy.trainable_parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    times, lengths = [], []
    for update in range(args.warmup + args.updates):
        tick = time.perf_counter()
        texts = [PROMPTS[(update * args.prompts + i) % len(PROMPTS)] for i in range(args.prompts)]
        prompts = encode_prompts(tokenizer, texts)
        rollout = policy.sample(prompts, args.group, 1.0, gen)
        decoded = tokenizer.batch_decode([ids[m > 0].tolist() for ids, m in
                                          zip(rollout.response_ids, rollout.response_mask, strict=True)],
                                         skip_special_tokens=True)
        rewards = torch.tensor([reward_text(t) for t in decoded])
        logp, entropy = policy.score(rollout)
        batch = TokenBatch(logp=logp, behavior_logp=rollout.behavior_logp, mask=rollout.response_mask,
                           advantages=group_advantages(rewards, rollout.group_ids, True), rewards=rewards,
                           group_ids=rollout.group_ids, entropy=entropy)
        loss = objective(batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if update >= args.warmup:
            times.append(time.perf_counter() - tick)
            lengths.append(float(rollout.response_mask.sum(1).mean()))
    return times, statistics.mean(lengths)


def time_trl(args: argparse.Namespace, tokenizer) -> tuple[list[float], float]:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    model = build_model(len(tokenizer), 0, args.hidden)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    steps = args.warmup + args.updates
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(steps * args.prompts)]
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

    def reward(completions, **kwargs):
        return [reward_text(c) for c in completions]

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
            train_dataset=Dataset.from_dict({"prompt": prompts}),
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
    parser.add_argument("--hidden", type=int, default=64, help="tiny Llama width")
    parser.add_argument("--lora-r", type=int, default=8)
    parser.add_argument("--updates", type=int, default=8, help="timed updates")
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    tokenizer = build_tokenizer()
    ours, ours_len = time_ours(args, tokenizer)
    trl, trl_len = time_trl(args, tokenizer)
    ours_s, trl_s = statistics.median(ours), statistics.median(trl)
    print(f"N={args.prompts} prompts x G={args.group}, max_new={args.max_new}, hidden={args.hidden}, "
          f"LoRA r={args.lora_r}, {args.updates} timed updates after {args.warmup} warm-up")
    print(f"ours: {ours_s:.3f} s/update (mean response length {ours_len:.1f})")
    print(f"TRL GRPOTrainer: {trl_s:.3f} s/update (mean response length {trl_len:.1f})")
    print(f"ratio ours/TRL = {ours_s / trl_s:.3f} (target <= 1.0)")


if __name__ == "__main__":
    main()
