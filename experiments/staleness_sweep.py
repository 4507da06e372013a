"""Staleness sweep: objectives × staleness × seeds on one token MDP, then the table of exact returns.

    python experiments/staleness_sweep.py experiments/staleness_grid.json --out runs/staleness --workers 2
    python experiments/staleness_sweep.py experiments/staleness_grid.json --out runs/staleness --table-only

Runs the grid with :func:`offpolicylab.sweep.run_sweep` (what ``offpolicylab sweep GRID --out DIR --workers N``
does), measures the wall time, and prints one Markdown row per (objective, schedule) cell, aggregated over seeds:

    peak J   = mean_seeds max_u J(π_u)           (exact return, evaluated every ``eval_every`` updates)
    final J  = mean_seeds J(π_last)
    drop     = mean_seeds (peak − final)
    rise     = mean_seeds first evaluated update with J ≥ J_0 + ½ (J* − J_0)   (— if a seed never got there)
    collapse = seeds flagged by the trainer's collapse detector / seeds, and the mean collapse update of those seeds
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from offpolicylab.grid import load_grid
from offpolicylab.run_records import is_run_dir, load_run, read_sweep_results
from offpolicylab.sweep import run_sweep


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grid", help="grid JSON file (experiments/*.json)")
    parser.add_argument("--out", required=True, help="output folder, one run directory per cell")
    parser.add_argument("--workers", type=int, default=2, help="parallel processes (default 2)")
    parser.add_argument("--table-only", action="store_true", help="only print the table of an existing --out")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if not args.table_only:
        start = time.perf_counter()
        rows = run_sweep(load_grid(args.grid), out, workers=args.workers)
        wall = time.perf_counter() - start
        failed = sum(row["status"] == "failed" for row in rows)
        print(f"sweep: {len(rows)} cells, {failed} failed, wall {wall:.0f} s with {args.workers} workers")
    print(markdown_table(cell_stats(out)))
    print(f"sum over cells of the in-run training time (time_elapsed_s): {total_run_seconds(out):.0f} s")
    return 0


# ============================================================================================ reading runs
def exact_curve(run_dir: Path) -> list[tuple[int, float]]:
    """(update, J(π)) at every evaluated update of one run."""
    curve = load_run(run_dir, labels={}).metrics[["update", "exact_return"]].dropna()
    return [(int(u), float(j)) for u, j in zip(curve["update"], curve["exact_return"], strict=True)]


def rise_update(curve: list[tuple[int, float]], optimum: float) -> float:
    """First evaluated update with J ≥ J_0 + ½ (J* − J_0); nan when never reached."""
    if not curve:
        return math.nan
    threshold = curve[0][1] + 0.5 * (optimum - curve[0][1])
    return next((float(u) for u, j in curve if j >= threshold), math.nan)


def total_run_seconds(out: Path) -> float:
    total = 0.0
    for row in read_sweep_results(out):
        if not is_run_dir(out / row["cell"]):  # a cell that failed before its first update
            continue
        elapsed = load_run(out / row["cell"], labels={}).metrics["time_elapsed_s"]
        total += float(elapsed.iloc[-1]) if len(elapsed) else 0.0
    return total


def axis_columns(rows: list[dict[str, str]]) -> list[str]:
    """The grid's axis columns of sweep_results.csv (between ``cell`` and ``status``), seeds excluded."""
    columns = list(rows[0])
    return [c for c in columns[columns.index("cell") + 1: columns.index("status")] if c != "seed"]


def cell_stats(out: Path) -> list[dict[str, Any]]:
    """One entry per combination of the non-seed axes, seeds aggregated (module docstring)."""
    results = read_sweep_results(out)
    axes = axis_columns(results)
    groups: dict[tuple[str, ...], list[dict[str, str]]] = defaultdict(list)
    for row in results:
        groups[tuple(row[a] for a in axes)].append(row)
    stats = []
    for key, rows in groups.items():
        peaks = [_float(r["peak_exact_return"]) for r in rows]
        finals = [_float(r["final_exact_return"]) for r in rows]
        rises = [rise_update(exact_curve(out / r["cell"]), _float(r["optimal_return"], 1.0)) for r in rows]
        collapses = [int(float(r["collapse_update"])) for r in rows if r["collapse_update"] not in ("", None)]
        stats.append({
            **dict(zip(axes, key, strict=True)), "seeds": len(rows),
            "failed": sum(r["status"] == "failed" for r in rows),
            "peak": _mean(peaks), "final": _mean(finals),
            "drop": _mean([p - f for p, f in zip(peaks, finals, strict=True)]),
            "rise": math.nan if any(math.isnan(x) for x in rises) else _mean(rises),
            "collapsed": len(collapses), "collapse_update": _mean([float(c) for c in collapses]),
        })
    return stats


def markdown_table(stats: list[dict[str, Any]]) -> str:
    axes = [k for k in stats[0] if k not in _STAT_KEYS] if stats else []
    header = " | ".join(("staleness" if a == "schedule" else a) for a in axes)
    lines = [f"| {header} | peak J | final J | drop | rise (upd) | collapsed seeds | collapse upd |",
             "|" + "---|" * (len(axes) + 6)]
    for s in stats:
        labels = [_staleness(s[a]) if a == "schedule" else s[a] for a in axes]
        failed = f" ({s['failed']} failed)" if s["failed"] else ""
        lines.append(f"| {' | '.join(labels)} | {_fmt(s['peak'])} | {_fmt(s['final'])} | {_fmt(s['drop'])} "
                     f"| {_fmt(s['rise'], 0)} | {s['collapsed']}/{s['seeds']}{failed} "
                     f"| {_fmt(s['collapse_update'], 0)} |")
    return "\n".join(lines)


_STAT_KEYS = ("seeds", "failed", "peak", "final", "drop", "rise", "collapsed", "collapse_update")


def _staleness(schedule: str) -> str:
    return "0" if schedule == "on_policy" else schedule.removeprefix("stale_k-")


def _float(text: str, default: float = math.nan) -> float:
    return float(text) if text not in ("", None) else default


def _mean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.fmean(finite) if finite else math.nan


def _fmt(value: float, digits: int = 3) -> str:
    return "—" if math.isnan(value) else f"{value:.{digits}f}"


if __name__ == "__main__":
    sys.exit(main())
