"""Throughput of the training loop on a token MDP, and the share of its time spent outside the policy.

    python benchmarks/trainer_loop.py [--updates 100] [--repeats 3] [--policy tabular|sequence_model]

For each repeat it builds a fresh run, times ``trainer.run_updates`` (the loop only: no process start, no build)
and splits the wall clock with the trainer's :class:`~offpolicylab.trainer.Stopwatch`:

    policy      = policy_forward (sample + score) + policy_backward (backward, clipping, optimizer step)
    objective   = objective.update + objective(batch) (the loss under study, with its standard metrics)
    outside     = total − policy: objective + bookkeeping
    bookkeeping = total − policy − objective: schedule, rewards, advantages, TokenBatch, diagnostics,
                  evaluation, metrics / samples / checkpoint writing

and prints medians over the repeats of updates/second and the shares (target: outside ≤ 20 %).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from offpolicylab import trainer
from offpolicylab.config import TrainConfig
from offpolicylab.runs import RunDir


def one_run(config: TrainConfig, root: Path, index: int) -> dict[str, float]:
    parts = trainer.build(config)
    run = RunDir(root / f"run{index}", fsync=config.fsync)
    trainer.open_run(run, parts, resume=False)
    watch = trainer.Stopwatch()
    start = time.perf_counter()
    trainer.run_updates(parts, run, 0, watch, progress=False)
    total = time.perf_counter() - start
    policy = watch.seconds.get("policy_forward", 0.0) + watch.seconds.get("policy_backward", 0.0)
    objective = watch.seconds.get("objective", 0.0)
    return {"updates_per_s": config.updates / total, "outside_share": (total - policy) / total,
            "bookkeeping_share": (total - policy - objective) / total,
            **{f"s_{k}": v for k, v in watch.seconds.items()}, "total_s": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--updates", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--policy", default="tabular", choices=("tabular", "sequence_model"))
    parser.add_argument("--objective", default="m2po")
    parser.add_argument("--schedule", default="stale_k:16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--checkpoint-every", type=int, default=1)
    parser.add_argument("--fsync", action="store_true", help="fsync metrics + checkpoint at every checkpoint")
    parser.add_argument("--group-size", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = TrainConfig(world="token_mdp", world_params={"vocab_size": 4, "length": 5, "num_prompts": 8},
                         objective=args.objective, schedule=args.schedule, policy=args.policy,
                         updates=args.updates, prompts_per_update=8, group_size=args.group_size,
                         eval_every=args.eval_every, sample_every=25, checkpoint_every=args.checkpoint_every,
                         fsync=args.fsync)
    with tempfile.TemporaryDirectory() as tmp:
        results = [one_run(config, Path(tmp), i) for i in range(args.repeats)]
    keys = sorted({k for r in results for k in r})
    print(f"token_mdp V=4 T=5, {args.policy}, {args.objective}, {args.schedule}, B={8 * args.group_size} sequences/update, "
          f"{args.updates} updates x {args.repeats} repeats, eval_every={args.eval_every}, "
          f"checkpoint_every={args.checkpoint_every}, fsync={args.fsync}, threads={args.threads}")
    for key in keys:
        print(f"  median {key:>20s}: {statistics.median(r.get(key, 0.0) for r in results):.4g}")


if __name__ == "__main__":
    main()
