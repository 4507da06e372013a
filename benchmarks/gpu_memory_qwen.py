"""Peak GPU memory, generated tokens/s and seconds per update of a Qwen2.5-1.5B-shaped model with 4-bit NF4 LoRA.

Random init from a ``Qwen2Config`` with Qwen2.5-1.5B's sizes (no weights downloaded), quantized to bitsandbytes
NF4 through a save_pretrained round trip (``--no-4bit``: bf16 base weights instead), LoRA r=16 on all linear layers;
one update = 8 prompts × 8 samples × 512 new tokens (EOS disabled so every response is full length), score with
grad (gradient checkpointing, micro-batches recomputed in backward), GRPO loss, backward, Adam step.
Target: peak memory within 16 GB.  Exits with a message (code 0) when CUDA is not available.

    python benchmarks/gpu_memory_qwen.py [--prompts 8 --group 8 --max-new 512 --score-micro-batch 8 --updates 1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEVICE = "cuda:0"
QWEN25_15B = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                  num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                  rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)


def build_model(load_in_4bit: bool) -> torch.nn.Module:
    """The random-init Qwen2.5-1.5B-shaped model on :data:`DEVICE`: bf16, or NF4 through a save/load round trip."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from offpolicylab.policies.hf_loading import bnb_4bit_config

    torch.manual_seed(0)
    with torch.device(DEVICE):  # random init on the device: seconds instead of a minute on the host
        model = Qwen2ForCausalLM(Qwen2Config(**QWEN25_15B)).to(torch.bfloat16)
    if not load_in_4bit:
        return model
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        del model
        return Qwen2ForCausalLM.from_pretrained(tmp, quantization_config=bnb_4bit_config(torch.bfloat16),
                                                dtype=torch.bfloat16, device_map={"": DEVICE})


def sync() -> None:
    torch.cuda.synchronize()


def versions() -> str:
    import peft
    import transformers

    try:
        import bitsandbytes
        bnb = bitsandbytes.__version__
    except ImportError:
        bnb = "not installed"
    return (f"{torch.cuda.get_device_name(0)}; torch {torch.__version__}, transformers {transformers.__version__}, "
            f"peft {peft.__version__}, bitsandbytes {bnb}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new", type=int, default=512)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--score-micro-batch", type=int, default=8)
    parser.add_argument("--updates", type=int, default=1, help="updates to run (the first includes warm-up)")
    parser.add_argument("--no-4bit", action="store_true", help="bf16 base weights instead of NF4")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_memory_qwen: no CUDA device available; this benchmark needs a GPU (nothing was run)")
        return 0
    from offpolicylab.contracts import Prompts
    from offpolicylab.objectives import TokenBatch, get_objective
    from offpolicylab.policies.hf import HFPolicy, LoraSpec

    print(versions())
    tick = time.perf_counter()
    model = build_model(not args.no_4bit)
    torch.cuda.empty_cache()

    class NoTokenizer:  # the policy only needs pad / eos ids here
        pad_token_id, eos_token_id = 0, QWEN25_15B["vocab_size"] - 1

    policy = HFPolicy(model, NoTokenizer(), lora=LoraSpec(r=16, alpha=32.0), max_new_tokens=args.max_new,
                      quantized=not args.no_4bit, gradient_checkpointing=True,
                      score_micro_batch=args.score_micro_batch, score_recompute=True,
                      eos_ids=[-1])  # -1 never sampled: full-length responses
    sync()
    weights = "4-bit NF4" if not args.no_4bit else "bf16"
    print(f"Qwen2.5-1.5B-shaped, {weights} base + LoRA r=16: {args.prompts} prompts x {args.group} samples x "
          f"{args.max_new} new tokens (prompts of {args.prompt_len}); model ready in {time.perf_counter() - tick:.1f} s, "
          f"{torch.cuda.memory_allocated() / 2**30:.2f} GiB")
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    ids = torch.randint(1, QWEN25_15B["vocab_size"] - 1, (args.prompts, args.prompt_len), generator=gen, device=DEVICE)
    prompts = Prompts(ids, torch.ones_like(ids, dtype=torch.float32), torch.arange(args.prompts, device=DEVICE))
    optimizer = torch.optim.Adam(policy.trainable_parameters(), lr=1e-5)
    torch.cuda.reset_peak_memory_stats()
    for update in range(args.updates):
        sync()
        tick = time.perf_counter()
        rollout = policy.sample(prompts, args.group, 1.0, gen)
        sync()
        gen_s = time.perf_counter() - tick
        tokens = float(rollout.response_mask.sum())
        rewards = torch.rand(len(rollout), generator=gen, device=DEVICE)
        logp, entropy = policy.score(rollout)
        adv = rewards - rewards.view(args.prompts, args.group).mean(1).repeat_interleave(args.group)
        batch = TokenBatch(logp=logp, behavior_logp=rollout.behavior_logp, advantages=adv,
                           mask=rollout.response_mask, rewards=rewards, group_ids=rollout.group_ids, entropy=entropy)
        optimizer.zero_grad(set_to_none=True)
        get_objective("grpo")(batch).loss.backward()
        optimizer.step()
        sync()
        train_s = time.perf_counter() - tick - gen_s
        scored = rollout.prompt_ids.numel() + rollout.response_ids.numel()
        print(f"update {update}: sampling {gen_s:.1f} s ({tokens:.0f} tokens, {tokens / gen_s:.0f} generated tokens/s); "
              f"score + backward + step {train_s:.1f} s ({scored / train_s:.0f} scored tokens/s); "
              f"update {gen_s + train_s:.1f} s; peak so far {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    peak = torch.cuda.max_memory_allocated()
    print(f"peak GPU memory (sample + score + backward + step): {peak / 2**30:.2f} GiB = {peak / 1e9:.2f} GB "
          f"(target: within 16 GB); reserved {torch.cuda.max_memory_reserved() / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
