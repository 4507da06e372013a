"""Peak GPU memory and generated tokens/s of a Qwen2.5-1.5B-shaped model with 4-bit NF4 LoRA.

Random init from a ``Qwen2Config`` with Qwen2.5-1.5B's sizes (no weights downloaded), quantized to bitsandbytes
NF4 through a save_pretrained round trip, LoRA r=16 on all linear layers; one update = 8 prompts × 8 samples ×
512 new tokens (EOS disabled so every response is full length), score with grad, GRPO loss, backward, Adam step.
Target: peak memory within 16 GB.  Exits with a message (code 0) when CUDA is not available.

    python benchmarks/gpu_memory_qwen.py [--prompts 8 --group 8 --max-new 512 --score-micro-batch 8]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

QWEN25_15B = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                  num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                  rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new", type=int, default=512)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--score-micro-batch", type=int, default=8)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_memory_qwen: no CUDA device available; this benchmark needs a GPU (nothing was run)")
        return 0
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from offpolicylab.contracts import Prompts
    from offpolicylab.objectives import TokenBatch, get_objective
    from offpolicylab.policies.hf import HFPolicy, LoraSpec
    from offpolicylab.policies.hf_loading import bnb_4bit_config

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        Qwen2ForCausalLM(Qwen2Config(**QWEN25_15B)).to(torch.bfloat16).save_pretrained(tmp)
        model = Qwen2ForCausalLM.from_pretrained(tmp, quantization_config=bnb_4bit_config(torch.bfloat16),
                                                 dtype=torch.bfloat16, device_map={"": 0})

    class NoTokenizer:  # the policy only needs pad / eos ids here
        pad_token_id, eos_token_id = 0, QWEN25_15B["vocab_size"] - 1

    policy = HFPolicy(model, NoTokenizer(), lora=LoraSpec(r=16, alpha=32.0), max_new_tokens=args.max_new,
                      quantized=True, gradient_checkpointing=True, score_micro_batch=args.score_micro_batch,
                      score_recompute=True, eos_ids=[-1])  # -1 never sampled: full-length responses
    gen = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(1, 150000, (args.prompts, args.prompt_len), generator=gen, device="cuda")
    prompts = Prompts(ids, torch.ones_like(ids, dtype=torch.float32), torch.arange(args.prompts, device="cuda"))
    optimizer = torch.optim.Adam(policy.trainable_parameters(), lr=1e-5)
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    tick = time.perf_counter()
    rollout = policy.sample(prompts, args.group, 1.0, gen)
    torch.cuda.synchronize()
    gen_s = time.perf_counter() - tick
    tokens = float(rollout.response_mask.sum())
    rewards = torch.rand(len(rollout), generator=gen, device="cuda")
    logp, entropy = policy.score(rollout)
    adv = rewards - rewards.view(args.prompts, args.group).mean(1).repeat_interleave(args.group)
    batch = TokenBatch(logp=logp, behavior_logp=rollout.behavior_logp, advantages=adv, mask=rollout.response_mask,
                       rewards=rewards, group_ids=rollout.group_ids, entropy=entropy)
    get_objective("grpo")(batch).loss.backward()
    optimizer.step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"Qwen2.5-1.5B-shaped, 4-bit NF4 + LoRA r=16: {args.prompts} prompts x {args.group} samples x "
          f"{args.max_new} new tokens")
    print(f"generated tokens/s: {tokens / gen_s:.0f} ({tokens:.0f} tokens in {gen_s:.1f} s)")
    print(f"peak GPU memory (sample + score + backward + step): {peak:.2f} GiB (target: fits in 16 GB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
