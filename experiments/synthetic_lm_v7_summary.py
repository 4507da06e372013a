"""Target (b) and (p) of recipe v7 (docs/synthetic_lm_v7.md) read from finished or cut run directories: the mean
``clip_frac`` over the updates run, by lag (the consumed minibatch's staleness) and by quarter, and ``sampler_kl``
over the first 20 updates, over all, over the last 100 and — (p)'s growth — the largest mean over consecutive
windows of 250 updates (updates 0–249, 250–499, …; a shorter last window counts too); and the mean |log π_sampler −
log π_trainer| per token (``sampler_log_ratio_abs_mean``) over the first 20 updates, which, unlike the k1 estimate,
cannot average to zero.

    python experiments/synthetic_lm_v7_summary.py runs/v7/bf16_s0 runs/v7/bf16_s256 runs/v7/fp16_s0 \\
        --json experiments/results/synthetic_lm_v7_b.json
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path
from typing import Any

from offpolicylab.run_dir import write_json

WINDOW = 250  # updates per window of (p)'s growth


def summary(run: Path) -> dict[str, Any]:
    with open(run / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    clip = [float(row["clip_frac"]) for row in rows]
    by_lag: dict[int, list[float]] = {}
    for row, value in zip(rows, clip, strict=True):
        by_lag.setdefault(round(float(row["staleness_mean"])), []).append(value)
    quarter = max(1, len(rows) // 4)
    kl = [float(row["sampler_kl"]) for row in rows if row.get("sampler_kl")]
    gap = [float(row["sampler_log_ratio_abs_mean"]) for row in rows if row.get("sampler_log_ratio_abs_mean")]
    config = json.loads((run / "config.json").read_text()) if (run / "config.json").exists() else {}
    return {"updates": len(rows), "schedule": config.get("schedule"), "policy_params": config.get("policy_params"),
            "clip_frac_mean": statistics.mean(clip), "clip_frac_max": max(clip),
            "clip_frac_by_quarter": [statistics.mean(clip[i * quarter:(i + 1) * quarter]) for i in range(4)
                                     if clip[i * quarter:(i + 1) * quarter]],
            "clip_frac_by_lag": {str(k): statistics.mean(v) for k, v in sorted(by_lag.items())}
            if len(by_lag) <= 8 else None,
            "sampler_kl_first20": statistics.mean(kl[:20]) if kl else None,
            "sampler_kl_mean": statistics.mean(kl) if kl else None,
            "sampler_kl_last100": statistics.mean(kl[-100:]) if kl else None,
            "sampler_abs_log_ratio_first20": statistics.mean(gap[:20]) if gap else None,
            "sampler_kl_window_max": max(statistics.mean(kl[i:i + WINDOW]) for i in range(0, len(kl), WINDOW))
            if kl else None,
            "time_update_s_median": statistics.median(float(row["time_update_s"]) for row in rows)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    out = {run.name: summary(run) for run in args.runs}
    for name, one in out.items():
        print(f"{name}: {one['updates']} updates, clip {one['clip_frac_mean']:.4%} (by lag {one['clip_frac_by_lag']}), "
              f"sampler_kl first 20 {one['sampler_kl_first20']:.3g}")
    if args.json:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
