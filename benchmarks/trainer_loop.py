"""Throughput of the training loop on a token MDP, and the share of its time spent outside the policy.

    python benchmarks/trainer_loop.py [--policy tabular sequence_model] [--updates 200] [--repeats 5]
                                      [--set name=value ...] [--json FILE]

The configuration is the one a user gets: ``TrainConfig()`` defaults (``offpolicylab run --world token_mdp
--objective grpo``: token MDP ``target`` V=4, T=5, 8 prompts; 8 prompts x 8 responses per update; ``on_policy``;
Adam; evaluation every ``eval_every`` updates with the exact return; samples every ``sample_every``; checkpoint every
``checkpoint_every``), with only ``--policy`` and the ``--set`` overrides changed.  For each repeat it builds a fresh
run, times ``trainer.run_updates`` (the loop only: no process start, no build) and splits the wall clock with the
trainer's :class:`~offpolicylab.profiling.Stopwatch`:

    policy      = policy_forward (sample + score) + policy_backward (backward, clipping, optimizer step)
    objective   = objective.update + objective(batch) (the loss under study, with its standard metrics)
    eval        = periodic evaluation (sampled / greedy reward, exact return and KL by enumeration)
    checkpoint  = checkpoint writes
    outside     = total - policy  (target <= 20 %: objective, bookkeeping, eval, checkpoint)
    bookkeeping = total - policy - objective - eval  (schedule, rewards, advantages, TokenBatch, metrics row,
                  collapse detector, metrics / samples / checkpoint writing)

and prints, per policy, medians over the repeats of updates/second, the shares and ms/update of every section.

``--compare-with DIR`` (another checkout, e.g. ``git worktree add ../base main``) measures both trees side by side:
each round runs one repeat of each tree in its own process (``PYTHONPATH`` = that tree, its own copy of this
script), the order alternating between rounds, and prints per tree the medians and the median over rounds of the
paired ratio this / DIR of ms per update.  ``--seeds N`` times one seed and N seeds batched together
(:mod:`offpolicylab.batched`) in alternating order in this process and prints the paired ratio of their times per
update (the cost of N seeds in units of one).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from offpolicylab import trainer
from offpolicylab.batched import build_runs
from offpolicylab.build import build
from offpolicylab.config import TrainConfig, parse_assignments
from offpolicylab.lifecycle import open_run
from offpolicylab.profiling import Stopwatch, breakdown
from offpolicylab.run_dir import RunDir
from offpolicylab.stack import Stack


class TwoClockStopwatch(Stopwatch):
    """The trainer's stopwatch, also adding up this thread's CPU time per section (``cpu_seconds``): on a shared,
    busy machine CPU time is the steadier measure (it leaves out waiting for a core and for the disk)."""

    def __init__(self) -> None:
        super().__init__()
        self.cpu_seconds: dict[str, float] = {}

    def __call__(self, name: str) -> Any:
        return _TwoClockSection(self, name)


class _TwoClockSection:
    def __init__(self, watch: TwoClockStopwatch, name: str) -> None:
        self.watch, self.name = watch, name

    def __enter__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.thread_time()

    def __exit__(self, *exc: object) -> None:
        cpu, wall = time.thread_time() - self.cpu, time.perf_counter() - self.wall
        for table, value in ((self.watch.seconds, wall), (self.watch.cpu_seconds, cpu)):
            table[self.name] = table.get(self.name, 0.0) + value


def one_run(config: TrainConfig, root: Path, index: int) -> dict[str, float]:
    """Time one fresh run of ``config``; returns updates/s, shares and ms/update per section, by wall clock and (keys
    prefixed ``cpu_``) by this thread's CPU time."""
    built = build(config)
    run = RunDir(root / f"run{index}", fsync=config.fsync)
    open_run(run, built, resume=False)
    watch = TwoClockStopwatch()
    start, start_cpu = time.perf_counter(), time.thread_time()
    trainer.run_updates(Stack.one(built, run), 0, watch, progress=False)
    total, total_cpu = time.perf_counter() - start, time.thread_time() - start_cpu
    if hasattr(run, "close"):
        run.close()
    return {**breakdown(config.updates, total, watch.seconds),
            **{f"cpu_{k}": v for k, v in breakdown(config.updates, total_cpu, watch.cpu_seconds).items()}}


def seeds_run(config: TrainConfig, root: Path, index: int, seeds: int) -> dict[str, float]:
    """Time one fresh run of ``seeds`` seeds of ``config`` batched together (:mod:`offpolicylab.batched`); the
    numbers of :func:`one_run`, per update of the whole stack."""
    members, rng_states = build_runs([dataclasses.replace(config, seed=seed) for seed in range(seeds)])
    runs = [RunDir(root / f"seeds{index}-{seed}", fsync=config.fsync) for seed in range(seeds)]
    for run, member in zip(runs, members, strict=True):
        open_run(run, member, resume=False)
    stack = Stack.of(members, runs, [member.optimizer.state_dict() for member in members], rng_states)
    watch = TwoClockStopwatch()
    start, start_cpu = time.perf_counter(), time.thread_time()
    trainer.run_updates(stack, 0, watch, progress=False)
    total, total_cpu = time.perf_counter() - start, time.thread_time() - start_cpu
    for run in runs:
        run.close()
    return {**breakdown(config.updates, total, watch.seconds),
            **{f"cpu_{k}": v for k, v in breakdown(config.updates, total_cpu, watch.cpu_seconds).items()}}


def seeds_benchmark(policy: str, args: argparse.Namespace, overrides: dict[str, Any]) -> None:
    """Paired rounds of one seed (:func:`one_run`) and ``args.seeds`` seeds batched (:func:`seeds_run`)."""
    config = TrainConfig.from_dict({"policy": policy, "updates": args.updates, **overrides})
    ones, groups = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.repeats):
            if round_ % 2 == 0:  # alternate the order, so a drifting load spreads over both
                ones.append(one_run(config, Path(tmp), round_))
                groups.append(seeds_run(config, Path(tmp), round_, args.seeds))
            else:
                groups.append(seeds_run(config, Path(tmp), round_, args.seeds))
                ones.append(one_run(config, Path(tmp), round_))
    print(f"{policy}: 1 seed vs {args.seeds} seeds batched, {args.updates} updates, {args.repeats} paired rounds, "
          f"threads={args.threads} (medians; ms per update of all seeds)")
    print(f"  {'':>32s}  {'1 seed':>9s}  {f'{args.seeds} seeds':>9s}")
    for key in COMPARED:
        print(f"  {key:>32s}  {statistics.median(r[key] for r in ones):9.4g}  "
              f"{statistics.median(r[key] for r in groups):9.4g}")
    for clock, name in (("", "wall"), ("cpu_", "CPU")):
        ratio = statistics.median(g[f"{clock}ms_per_update_total"] / o[f"{clock}ms_per_update_total"]
                                  for o, g in zip(ones, groups, strict=True))
        label = f"paired ratio {args.seeds} seeds / 1 ({name})"
        print(f"  {label:>32s}  {ratio:.3f}")


def medians(results: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in results) for key in results[0]}


def benchmark(policy: str, updates: int, repeats: int, overrides: dict[str, Any]) -> dict[str, Any]:
    config = TrainConfig.from_dict({"policy": policy, "updates": updates, **overrides})
    with tempfile.TemporaryDirectory() as tmp:
        results = [one_run(config, Path(tmp), i) for i in range(repeats)]
    return {"policy": policy, "config": {k: v for k, v in config.to_dict().items() if k in _SHOWN},
            "median": medians(results), "runs": results}


COMPARED = ("ms_per_update_total", "outside_share", "outside_share_without_eval", "ms_per_update_policy_forward",
            "ms_per_update_policy_backward", "ms_per_update_objective", "ms_per_update_other", "ms_per_update_eval",
            "ms_per_update_checkpoint", "cpu_ms_per_update_total", "cpu_outside_share_without_eval")


def run_tree(tree: Path, policy: str, args: argparse.Namespace) -> dict[str, float]:
    """One repeat of ``policy`` by ``tree``'s own copy of this script, in a fresh process."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, str(tree / "benchmarks" / "trainer_loop.py"), "--policy", policy, "--updates",
                   str(args.updates), "--repeats", "1", "--threads", str(args.threads), "--json", str(out),
                   *(["--set", *args.set] if args.set else [])]
        env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(args.threads)}
        subprocess.run(command, check=True, env=env, cwd=tree, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())[0]["runs"][0]


def compare(args: argparse.Namespace, other: Path) -> None:
    """Paired rounds of this tree and ``other`` (see the module docstring)."""
    trees = {"this": Path(__file__).resolve().parents[1], "other": other.resolve()}
    for policy in args.policy:
        results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for round_ in range(args.repeats):
            for name in (list(trees) if round_ % 2 == 0 else list(trees)[::-1]):
                results[name].append(run_tree(trees[name], policy, args))
        ratio = statistics.median(a["ms_per_update_total"] / b["ms_per_update_total"]
                                  for a, b in zip(results["this"], results["other"], strict=True))
        print(f"{policy}: this tree vs {trees['other']}, {args.updates} updates, {args.repeats} paired rounds, "
              f"threads={args.threads} (medians)")
        print(f"  {'':>32s}  {'this':>9s}  {'other':>9s}")
        for key in COMPARED:
            this, that = (statistics.median(r.get(key, float("nan")) for r in results[n]) for n in trees)
            print(f"  {key:>32s}  {this:9.4g}  {that:9.4g}")
        print(f"  {'paired ratio this/other (ms/update)':>32s}  {ratio:.3f}")


_SHOWN = ("world", "world_params", "objective", "schedule", "prompts_per_update", "group_size", "eval_every",
          "sample_every", "checkpoint_every", "fsync")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policy", nargs="+", default=["tabular", "sequence_model"],
                        choices=("tabular", "sequence_model", "transformer"))
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE",
                        help="TrainConfig overrides, e.g. --set objective=m2po schedule=stale_k:16 checkpoint_every=1")
    parser.add_argument("--json", default=None, help="also write all results to this JSON file")
    parser.add_argument("--seeds", type=int, default=1,
                        help="N > 1: paired rounds of one seed and N seeds batched together (tabular, "
                             "sequence_model, transformer)")
    parser.add_argument("--compare-with", default=None, metavar="DIR",
                        help="another checkout of the repository: paired rounds of both trees, side by side")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.compare_with:
        compare(args, Path(args.compare_with))
        return
    if args.seeds > 1:
        for policy in args.policy:
            seeds_benchmark(policy, args, parse_assignments(args.set, "--set"))
        return
    overrides = parse_assignments(args.set, "--set")
    report = []
    for policy in args.policy:
        result = benchmark(policy, args.updates, args.repeats, overrides)
        report.append(result)
        print(f"{policy}: {json.dumps(result['config'])}, {args.updates} updates x {args.repeats} repeats, "
              f"threads={args.threads} (medians)")
        for key, value in result["median"].items():
            print(f"  {key:>32s}: {value:.4g}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
