"""Where one update of the synthetic-LM collapse grid spends its time, and how far the 45-minute grid is from it.

    python benchmarks/synthetic_lm_floor.py [--updates 100] [--objective grpo] [--schedule stale_k:64] [--threads 1]
    python benchmarks/synthetic_lm_floor.py --world-param preset=seed_scale_v6 --lr 1.5e-5 --schedule stale_k:256 \
        --grid-cells 27 --grid-updates 2000 --budget-min 120        # recipe v6 and its grid's 120-minute budget

Measures, on recipe v5 (the grid file's preset: π₀, 8 prompts × 8 responses × 32 tokens, V = 256) or the
``--world-param`` recipe, medians over ``--repeats`` calls after a warm-up:

- the three pieces of work every update does — **sampling** one batch (32 key/value-cached decoding steps),
  the **reward** of its 64 responses (the teacher network's pass) and **scoring + backward** (one teacher-forced pass
  over the batch with gradient, log-softmax over the vocabulary, ``backward``);
- the FLOPs of the matrix products in sampling and in scoring + backward (``torch.utils.flop_counter``), and the time
  they would take at the GFLOP/s of one large float32 matrix product on this thread (what the core can do at best);
- the same matrix products alone, at their own shapes (recorded with a ``TorchDispatchMode`` and replayed on random
  operands, interleaved with the pieces): what eager PyTorch needs for the arithmetic at these small shapes;
- a plain run of one grid cell (its base settings from ``experiments/synthetic_lm_grid.json``, ``--updates``
  updates, evaluation and checkpoints as in the grid): the median and mean wall time per update from its
  ``metrics.csv`` (world building excluded);

and what these give for the whole grid (``--grid-cells`` cells × ``--grid-updates`` updates on ``--workers`` cores,
one cell per core; v5's grid: 81 × 1000), next to the per-update budget of a ``--budget-min`` grid.  Run on an otherwise idle machine; quote the thread count and command.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from offpolicylab import trainer
from offpolicylab.config import TrainConfig
from offpolicylab.worlds import make_world

GRID = Path(__file__).resolve().parent.parent / "experiments" / "synthetic_lm_grid.json"


def cell_config(objective: str, schedule: str, updates: int, world_params: dict[str, str] | None = None,
                lr: float | None = None) -> TrainConfig:
    """The grid's base settings for one cell with ``updates`` updates (and the given world recipe and rate)."""
    base = dict(json.loads(GRID.read_text())["base"])
    base.update(objective=objective, schedule=schedule, updates=updates)
    if world_params:
        base["world_params"] = world_params
    if lr is not None:
        base["lr"] = lr
    return TrainConfig.from_dict(base)


def key_values(pairs: list[str]) -> dict[str, str]:
    """``["k=v", ...]`` as a dict; a pair without ``=`` is an error."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--world-param needs key=value, got {pair!r}")
        out[key] = value
    return out


def median_ms(call: Callable[[], object], repeats: int) -> float:
    """Median milliseconds of ``call`` over ``repeats`` calls after two warm-up calls."""
    return interleaved_ms({"call": call}, repeats)["call"]


def interleaved_ms(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median milliseconds of each call over ``repeats`` rounds, each round calling all of them once in a rotated
    order (so a machine that gets busier or quieter moves them alike), after two warm-up rounds."""
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(repeats + 2):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            start = time.perf_counter()
            calls[name]()
            if round_ >= 2:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


def gflop(call: Callable[[], object]) -> float:
    """GFLOP of the matrix products (and other counted ops) of one ``call``."""
    with FlopCounterMode(display=False) as counter:
        call()
    return counter.get_total_flops() / 1e9


class MatmulShapes(TorchDispatchMode):
    """Records the matrix products (``mm``, ``addmm``, ``bmm``, ``baddbmm``) a call runs — forward and backward —
    as (op, argument shapes), so that :func:`replay_ms` can time them alone, at the same shapes."""

    OPS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
           torch.ops.aten.baddbmm.default)

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[object, list[torch.Size]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (torch's protocol)
        if func in self.OPS:
            self.calls.append((func, [a.shape for a in args if isinstance(a, torch.Tensor)]))
        return func(*args, **(kwargs or {}))


def matmul_shapes(call: Callable[[], object]) -> list[tuple[object, list[torch.Size]]]:
    """The matrix products of one ``call`` (see :class:`MatmulShapes`)."""
    with MatmulShapes() as recorder:
        call()
    return recorder.calls


def replay(calls: list[tuple[object, list[torch.Size]]]) -> Callable[[], None]:
    """A function that runs the recorded matrix products alone on random float32 operands of the same shapes."""
    operands = [(func, [torch.randn(shape) for shape in shapes]) for func, shapes in calls]

    def run() -> None:
        for func, tensors in operands:
            func(*tensors)
    return run


def peak_gflops(size: int = 1024, repeats: int = 10) -> float:
    """GFLOP/s of one large float32 matrix product on this thread (median of ``repeats``)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    return 2 * size ** 3 / median_ms(lambda: a @ b, repeats) * 1e3 / 1e9


def cell_ms(config: TrainConfig) -> tuple[float, float, float]:
    """(median, mean, first) wall milliseconds per update of a plain run of ``config`` (from its metrics.csv); the
    mean leaves out the first update, which pays the process's one-time costs (lazy imports, first evaluation)."""
    out = Path(tempfile.mkdtemp(prefix="floor_"))
    try:
        trainer.train(config, out / "run")
        seconds = pd.read_csv(out / "run" / "metrics.csv")["time_update_s"] * 1e3
        return float(seconds.median()), float(seconds.iloc[1:].mean()), float(seconds.iloc[0])
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=100, help="updates of the plain cell run")
    parser.add_argument("--objective", default="grpo")
    parser.add_argument("--schedule", default="stale_k:64")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2, help="cores the grid runs on (one cell per core)")
    parser.add_argument("--world-param", action="append", default=[], help="a recipe field, key=value (repeatable)")
    parser.add_argument("--lr", type=float, default=None, help="the cell's learning rate (default: the grid's)")
    parser.add_argument("--grid-cells", type=int, default=81)
    parser.add_argument("--grid-updates", type=int, default=1000)
    parser.add_argument("--budget-min", type=float, default=45.0, help="the grid's wall-time budget, minutes")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    world_params = {"preset": "seed_scale", **key_values(args.world_param)}  # the grid file's recipe, v5
    world = make_world("synthetic_lm", **world_params)
    policy = world.pretrained_policy()
    prompts = world.sample_prompts(8, torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(0)
    rollout = policy.sample(prompts, 8, generator=generator)

    def sample() -> object:
        return policy.sample(prompts, 8, generator=generator)

    def reward() -> object:
        return world.reward(rollout.prompt_index, rollout.response_ids, rollout.response_mask)

    def score_backward() -> None:
        logp, entropy = policy.score(rollout)
        (logp.sum() + 0 * entropy.sum()).backward()

    pieces = {"sampling": sample, "reward": reward, "scoring + backward": score_backward}
    counted = ("sampling", "scoring + backward")
    alone = {f"{name} (matmuls alone)": replay(matmul_shapes(pieces[name])) for name in counted}
    times = interleaved_ms({**pieces, **alone}, args.repeats)
    flops = {name: gflop(pieces[name]) for name in counted}
    flops.update({f"{name} (matmuls alone)": flops[name] for name in counted})
    peak = peak_gflops()
    config = cell_config(args.objective, args.schedule, args.updates, world_params, args.lr)
    median, mean, first = cell_ms(config)
    per_grid = args.grid_cells * args.grid_updates / args.workers / 60e3  # minutes of grid per ms of update
    lengths = rollout.response_mask.sum(1).float()
    print(f"threads={args.threads}; world {world_params or 'defaults'}; responses: mean length "
          f"{lengths.mean():.1f} of {rollout.response_mask.shape[1]} positions")
    print(f"grid = {args.grid_cells} cells x {args.grid_updates} updates on {args.workers} cores; "
          f"large float32 matmul: {peak:.1f} GFLOP/s")
    print(f"{'piece':36s} {'ms':>8s} {'GFLOP':>7s} {'GFLOP/s':>8s} {'ms at peak':>10s} {'grid min':>9s}")
    for name, ms in times.items():
        g = flops.get(name)
        row = (f"{g:7.3f} {g / ms * 1e3:8.1f} {g / peak * 1e3:10.1f}" if g is not None
               else f"{'':7s} {'':8s} {'':10s}")
        print(f"{name:36s} {ms:8.1f} {row} {ms * per_grid:9.1f}")
    total = sum(times[name] for name in pieces)
    print(f"{'the three pieces':36s} {total:8.1f} {'':7s} {'':8s} {'':10s} {total * per_grid:9.1f}")
    print(f"{'a grid cell, per update':36s} {median:8.1f} (median; mean {mean:.1f} with evaluation and checkpoints, "
          f"first update {first / 1e3:.1f} s) -> grid {mean * per_grid:.1f} min  "
          f"[{args.objective} {args.schedule}, {args.updates} updates]")
    budget = f"{args.budget_min:g}-minute grid budget"
    print(f"{budget:36s} {args.budget_min / per_grid:8.1f} ms per update")


if __name__ == "__main__":
    main()
