"""Per-update cost of a 16-bit trainer and sampler (recipe v7) against v6's fp32, with and without the CPU's bf16
instructions (oneDNN's ISA cap ``ONEDNN_MAX_CPU_ISA=AVX512_CORE`` leaves out AVX512-BF16 and AMX).

    python benchmarks/precision_update.py [--updates 6] [--threads 1] [--fp16]

One update's pieces, as the trainer runs them at the world's defaults (8 prompts × 8 responses): sampling (the
sampler's engine), the old-log-prob recompute (v7: 16-row micro-batches), the scoring forward + backward of the
policy-gradient surrogate, gradient clipping and one AdamW step.  Each configuration runs in its own process (the ISA
cap is read when oneDNN starts); the median process time per update over ``--updates`` updates after one warm-up is
printed with its ratio to v6 fp32 at the default ISA, the thread count and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CONFIGS = {  # name: (preset (None: --v7-preset), world parameters, policy parameters)
    "v6 fp32": ("seed_scale_v6", {}, {}),
    "v6 fp32 8x64": ("seed_scale_v6", {"num_layers": 8}, {}),  # v7's network in fp32: the depth's own cost
    "v7": (None, {}, {}),  # the preset: 8 x 64, bf16 trainer on cast weights, bf16 sampler, split-K recompute
}
FP16 = ("v7 fp16", (None, {}, {"trainer_precision": "fp16", "sampler_precision": "fp16"}))
NO_BF16_ISA = "AVX512_CORE"


def child(preset: str, world_params: dict, params: dict, updates: int, threads: int) -> list[float]:
    """Process seconds of each of ``updates`` + 1 updates (the first a warm-up)."""
    import torch

    from offpolicylab.behavior import sample_rollout
    from offpolicylab.policies import make_policy
    from offpolicylab.worlds import make_world

    torch.set_num_threads(threads)
    world = make_world("synthetic_lm", preset=preset, **world_params)
    policy = make_policy("transformer", world, **params)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1.5e-5, weight_decay=0.01)
    generator = torch.Generator().manual_seed(0)
    times = []
    for _ in range(updates + 1):
        start = time.process_time()
        rollout = sample_rollout(policy, world.sample_prompts(8, generator), 8, 1.0, generator, "trainer")
        logp, _ = policy.score(rollout)
        advantages = torch.randn(len(rollout), 1, generator=generator)
        loss = -((logp - rollout.behavior_logp).exp() * advantages * rollout.response_mask).sum() / \
            rollout.response_mask.sum()
        optimizer.zero_grad(set_to_none=True)
        scaler = getattr(policy, "loss_scaler", None)
        (loss if scaler is None else scaler.scale(loss)).backward()
        if scaler is not None:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), 1.0)
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()
        times.append(time.process_time() - start)
    return times[1:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--v7-preset", default="seed_scale_v7")
    parser.add_argument("--fp16", action="store_true", help="also v7 in fp16 (no fast fp16 kernels on this CPU)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        preset, world_params, params = json.loads(args.child)
        print(json.dumps(child(preset, world_params, params, args.updates, args.threads)))
        return 0
    medians = {}
    for isa in ("default", NO_BF16_ISA):
        env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=str(args.threads))
        if isa != "default":
            env["ONEDNN_MAX_CPU_ISA"] = isa
        configs = dict(CONFIGS, **dict([FP16])) if args.fp16 and isa == "default" else CONFIGS
        for name, (preset, world_params, params) in configs.items():
            spec = json.dumps([preset or args.v7_preset, world_params, params])
            out = subprocess.run([sys.executable, __file__, "--child", spec, "--updates", str(args.updates),
                                  "--threads", str(args.threads)], env=env, capture_output=True, text=True,
                                 check=True)
            medians[name, isa] = statistics.median(json.loads(out.stdout.strip().splitlines()[-1]))
    base = medians["v6 fp32", "default"]
    print(f"per-update process time, median of {args.updates} updates, {args.threads} thread(s); "
          f"command: python benchmarks/precision_update.py --updates {args.updates} --threads {args.threads}"
          f"{' --fp16' if args.fp16 else ''}")
    for (name, isa), seconds in medians.items():
        print(f"{name:14s} ISA {isa:12s} {seconds * 1000:8.1f} ms  {seconds / base:5.2f}x v6 fp32")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
