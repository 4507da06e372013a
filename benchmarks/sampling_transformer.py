"""Sampling tokens/s of the transformer policy: key/value-cached decoding vs a full forward pass per token.

    python benchmarks/sampling_transformer.py [--batch 64] [--response-len 32] [--prompt-len 4] [--repeats 7]
                                              [--threads 1] [--d-model 64] [--num-layers 2] [--num-heads 4]
                                              [--seeds N]

Both paths sample the same responses (same weights, same generator seed): the cached one encodes the prompt once and
runs one position per new token against the cache (:meth:`TransformerPolicy.next_logits`); the uncached one is the
generic :class:`~offpolicylab.policies.autoregressive.AutoregressivePolicy` step, a teacher-forced pass over the
whole buffer for every token.  Each round times both, in alternating order; the table shows medians over rounds of
generated tokens per second and the median of the per-round ratio (paired, robust to load drift on a shared
machine), with the thread count.  ``--seeds N`` also times N seeds stacked into one network
(:class:`~offpolicylab.policies.transformer_stack.StackedTransformerPolicy`, N x batch rows, one generator per seed)
in the same rounds and prints the paired ratio of its time to one seed's, by wall clock and by this thread's CPU time
(the steadier measure on a busy machine).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from offpolicylab.contracts import Prompts
from offpolicylab.policies.autoregressive import AutoregressivePolicy
from offpolicylab.policies.transformer import TransformerPolicy
from offpolicylab.policies.transformer_stack import StackedTransformerPolicy


class FullForwardPolicy(TransformerPolicy):
    """The same network sampled without a cache (the base class's decoding step)."""

    start_decoding = AutoregressivePolicy.start_decoding
    next_logits = AutoregressivePolicy.next_logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64, help="sequences per sample() call (8 prompts x G = 8)")
    parser.add_argument("--response-len", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=256)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=1, help="N > 1: also time N seeds stacked (N x batch rows)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes = {"vocab_size": args.vocab_size, "response_len": args.response_len, "max_prompt_len": args.prompt_len,
             "d_model": args.d_model, "num_layers": args.num_layers, "num_heads": args.num_heads, "seed": 0}
    policies = {"kv_cache": TransformerPolicy(**sizes), "full_forward": FullForwardPolicy(**sizes)}
    ids = torch.randint(args.vocab_size, (args.batch, args.prompt_len), generator=torch.Generator().manual_seed(0))
    prompts = Prompts(ids=ids, mask=torch.ones(ids.shape), index=torch.arange(args.batch))
    calls = {name: (lambda p: lambda r: p.sample(prompts, 1, 1.0, torch.Generator().manual_seed(r)))(policy)
             for name, policy in policies.items()}
    if args.seeds > 1:
        stacked = StackedTransformerPolicy([TransformerPolicy(**{**sizes, "seed": s}) for s in range(args.seeds)])
        many = Prompts(ids=ids.repeat(args.seeds, 1), mask=torch.ones(args.seeds * args.batch, args.prompt_len),
                       index=torch.arange(args.batch).repeat(args.seeds))
        calls[f"{args.seeds}_seeds_stacked"] = lambda r: stacked.sample(
            many, 1, 1.0, [torch.Generator().manual_seed(r + s) for s in range(args.seeds)])
    tokens = args.batch * args.response_len
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    same = True
    for round_ in range(args.repeats + 1):
        order = list(calls) if round_ % 2 == 0 else list(reversed(calls))
        outputs = {}
        for name in order:
            start, start_cpu = time.perf_counter(), time.thread_time()
            outputs[name] = calls[name](round_)
            if round_:  # round 0 is warm-up
                seconds[name].append(time.perf_counter() - start)
                cpu[name].append(time.thread_time() - start_cpu)
        same &= torch.equal(outputs["kv_cache"].response_ids, outputs["full_forward"].response_ids)
    ratios = [f / c for c, f in zip(seconds["kv_cache"], seconds["full_forward"], strict=True)]
    print(f"transformer d_model={args.d_model} layers={args.num_layers} heads={args.num_heads} V={args.vocab_size}; "
          f"batch {args.batch} x {args.response_len} tokens, prompt {args.prompt_len}; "
          f"torch threads {torch.get_num_threads()}; {args.repeats} rounds")
    print("| path | median tokens/s | median ms per sample() | median CPU ms per sample() |")
    print("|---|---:|---:|---:|")
    for name, times in seconds.items():
        median, rows = statistics.median(times), args.seeds if name.endswith("_stacked") else 1
        print(f"| {name} | {rows * tokens / median:,.0f} | {1000 * median:.1f} | {1000 * statistics.median(cpu[name]):.1f} |")
    print(f"KV cache speed-up (median of paired per-round ratios): {statistics.median(ratios):.2f}x; "
          f"identical samples: {same}")
    if args.seeds > 1:
        name = f"{args.seeds}_seeds_stacked"
        for clock, table in (("wall", seconds), ("CPU", cpu)):
            ratio = statistics.median(m / o for m, o in zip(table[name], table["kv_cache"], strict=True))
            print(f"{args.seeds} seeds stacked / 1 seed ({clock}, median of paired per-round ratios): {ratio:.2f}")

if __name__ == "__main__":
    main()
