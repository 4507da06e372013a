"""The toy sweep, this tree against a baseline commit, side by side: is the trainer as fast as it was?

    python benchmarks/toy_sweep.py [--baseline 64fe9d0] [--grid examples/grid_small.json] [--rounds 5]
                                   [--threads 1] [--workers 1]

The baseline's package (``git archive BASELINE offpolicylab``) is unpacked into a temporary folder.  Each round runs
``python -m offpolicylab sweep GRID --out OUT --workers W`` once with each tree on ``PYTHONPATH`` (a fresh process
each: import, build, every cell's runs, the sweep's files), the order alternating between rounds so that a drifting
load spreads over both, with ``OMP_NUM_THREADS`` = ``--threads``.  It prints, per tree, the median wall clock and the
median CPU time of the sweep's processes (user + system of the children: on a shared machine the steadier measure),
the medians over rounds of the paired ratios this / baseline, the threads and the command.  (The numbers of the
runs are the goldens' business, ``tests/trainer/test_golden.py``: the baseline may predate a change that moved
them on purpose.)
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def baseline_tree(commit: str, folder: Path) -> Path:
    """The package of ``commit`` unpacked into ``folder`` (what ``PYTHONPATH`` points at)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "offpolicylab"], check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder


def one_sweep(tree: Path, grid: Path, out: Path, threads: int, workers: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child processes) of one sweep of ``grid`` by ``tree``'s package."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads)}
    command = [sys.executable, "-m", "offpolicylab", "sweep", str(grid), "--out", str(out), "--workers",
               str(workers)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="64fe9d0", help="the commit to compare with (default: before the "
                                                               "trainer was split)")
    parser.add_argument("--grid", default=str(ROOT / "examples" / "grid_small.json"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each sweep")
    parser.add_argument("--workers", type=int, default=1, help="the sweep's worker processes")
    args = parser.parse_args()
    grid = Path(args.grid).resolve()
    times: dict[str, list[tuple[float, float]]] = {"this": [], "baseline": []}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this": ROOT, "baseline": baseline_tree(args.baseline, Path(tmp) / "baseline")}
        for round_ in range(args.rounds):
            for name in (list(trees) if round_ % 2 == 0 else list(trees)[::-1]):
                out = Path(tmp) / f"{name}-{round_}"
                times[name].append(one_sweep(trees[name], grid, out, args.threads, args.workers))
    print(f"toy sweep {grid.name}: this tree vs {args.baseline}, {args.rounds} paired rounds, "
          f"threads={args.threads}, workers={args.workers}")
    print(f"command: PYTHONPATH=TREE OMP_NUM_THREADS={args.threads} {Path(sys.executable).name} -m offpolicylab "
          f"sweep {grid.name} --out OUT --workers {args.workers}")
    for index, clock in enumerate(("wall s", "CPU s")):
        this, base = (statistics.median(t[index] for t in times[name]) for name in ("this", "baseline"))
        ratio = statistics.median(a[index] / b[index] for a, b in zip(times["this"], times["baseline"], strict=True))
        print(f"  {clock:>6s}: this {this:7.2f}  baseline {base:7.2f}  paired ratio this/baseline {ratio:.3f}")


if __name__ == "__main__":
    main()
