"""The recipe v6 pilot and grid read from their runs (``experiments/synthetic_lm_v6_pilot.md``,
``experiments/synthetic_lm_grid_v6.md``): one row per run with the v5 grid CSV's columns plus ``fell`` and
``fell_update``, the mechanism by quarter of the updates, and one row per cell over its seeds.

    python experiments/synthetic_lm_v6_pilot.py LABEL=RUN_DIR [LABEL=RUN_DIR ...] [--csv OUT.csv] [--json OUT.json]
        [--cells OUT.csv]

A label names the cell (the same label for each seed of a cell).

J is the evaluation reward ``eval_reward_sampled`` (64 prompts × 4 samples) with its standard error.  Per run:
J₀ the first evaluation, peak the largest, final the last.  **Fell** (the grid's definition, fixed before the pilot):
final ≤ peak − ½ (peak − J₀).  ``fell_update``: the first evaluated update after the peak from which every later
evaluation stays at or below peak − ½ (peak − J₀) — where the final fall began (−1 when the run did not fall).
Mechanism per quarter of the updates (mean, or the maximum where named): ``clip_frac``, ``mask_frac`` and
``accept_rate`` (the trajectory filters' share accepted, where the objective logs it), ``ratio_p999`` (and its
maximum), ``ratio_max`` (maximum), ``m2``, ``ess``, ``log_ratio_abs_mean``, ``grad_norm`` (median and maximum),
``entropy``, ``response_len``; and the evaluated KL(π‖π₀) per token (``eval_kl_init_k1``) at each quarter's end
(``--json``: {label: {seed: quarters}}).  Per cell (:func:`cells`): the seeds, the mean final J with its standard
error over the seeds (sd / √n), the mean final as a multiple of on-policy GRPO's mean final (label
``grpo_on_policy``), and how many seeds fell and how many the collapse detector flagged.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "experiments") not in sys.path:
    sys.path.insert(0, str(ROOT / "experiments"))

from collapse_experiment import GRID_CSV_COLUMNS, grid_csv, j_curve, run_stats  # noqa: E402

from offpolicylab import plots  # noqa: E402
from offpolicylab.run_dir import write_json  # noqa: E402

CSV_COLUMNS = (*GRID_CSV_COLUMNS, "fell", "fell_update")
MEANS = ("clip_frac", "mask_frac", "accept_rate", "ratio_p999", "m2", "ess", "log_ratio_abs_mean", "entropy",
         "response_len")
MAXIMA = ("ratio_p999", "ratio_max", "grad_norm")
ON_POLICY = "grpo_on_policy"
CELL_COLUMNS = ("objective", "staleness", "seeds", "final_mean", "final_se", "x_on_policy", "fell", "flagged",
                "fell_updates")


def fell(updates: np.ndarray, rewards: np.ndarray) -> tuple[bool, int]:
    """(final ≤ peak − ½ (peak − J₀), the first evaluated update after the peak from which every evaluation stays at
    or below that level; −1 when it did not fall)."""
    top = int(rewards.argmax())
    level = rewards[top] - 0.5 * (rewards[top] - rewards[0])
    if rewards[-1] > level:
        return False, -1
    below = rewards <= level
    start = len(rewards) - 1
    while start - 1 > top and below[start - 1]:
        start -= 1
    return True, int(updates[start])


def quarters(metrics: pd.DataFrame) -> list[dict[str, Any]]:
    """The mechanism columns of ``metrics.csv`` over each quarter of the updates (module docstring)."""
    last = int(metrics["update"].max()) + 1
    rows = []
    for q in range(4):
        low, high = q * last // 4, (q + 1) * last // 4
        part = metrics[(metrics["update"] >= low) & (metrics["update"] < high)]
        row: dict[str, Any] = {"updates": [low, high - 1]}
        row.update({f"{name}_mean": float(part[name].mean()) for name in MEANS if name in part})
        row.update({f"{name}_max": float(part[name].max()) for name in MAXIMA if name in part})
        if "grad_norm" in part:
            row["grad_norm_median"] = float(part["grad_norm"].median())
        kl = part["eval_kl_init_k1"].dropna() if "eval_kl_init_k1" in part else pd.Series(dtype=float)
        row["kl_init_k1_end"] = float(kl.iloc[-1]) if len(kl) else math.nan
        rows.append(row)
    return rows


def read(label: str, run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The CSV row and the quarters of one run."""
    (run,) = plots.load_runs([run_dir])
    curve = j_curve(run)
    has_fallen, fell_at = fell(curve["update"].to_numpy(), curve["J"].to_numpy())
    (row,) = grid_csv(pd.DataFrame([{**run_stats(run), "label": label}])).to_dict("records")
    return {**row, "fell": has_fallen, "fell_update": fell_at}, quarters(run.metrics)


def cells(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (objective, staleness) of the per-run table (:data:`CELL_COLUMNS`), in the runs' order:
    ``final_se`` = sd over the seeds / √seeds (NaN for one seed), ``x_on_policy`` = final_mean / the mean final of
    :data:`ON_POLICY` (NaN without it), ``fell_updates`` the seeds' fall updates joined by ``;``."""
    rows = []
    for (objective, staleness), part in runs.groupby(["objective", "staleness"], sort=False):
        finals = part["final_J"].to_numpy(dtype=float)
        rows.append({"objective": objective, "staleness": staleness, "seeds": len(part),
                     "final_mean": finals.mean(),
                     "final_se": finals.std(ddof=1) / math.sqrt(len(finals)) if len(finals) > 1 else math.nan,
                     "fell": int(part["fell"].sum()), "flagged": int(part["collapsed"].sum()),
                     "fell_updates": ";".join(str(u) for u in part["fell_update"] if u >= 0)})
    table = pd.DataFrame(rows).reindex(columns=list(CELL_COLUMNS))
    on_policy = table.loc[table["objective"] == ON_POLICY, "final_mean"]
    table["x_on_policy"] = table["final_mean"] / on_policy.iloc[0] if len(on_policy) else math.nan
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="LABEL=RUN_DIR")
    parser.add_argument("--csv", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--cells", type=Path, default=None, help="write the per-cell table here")
    args = parser.parse_args(argv)
    rows, mechanisms = [], {}
    for item in args.runs:
        label, sep, path = item.partition("=")
        if not sep:
            parser.error(f"a run is LABEL=RUN_DIR, got {item!r}")
        row, by_quarter = read(label, Path(path))
        rows.append(row)
        mechanisms.setdefault(label, {})[str(row["seed"])] = by_quarter
    table = pd.DataFrame(rows, columns=list(CSV_COLUMNS))
    per_cell = cells(table)
    for frame, path in ((table, args.csv), (per_cell, args.cells)):
        print(frame.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
            frame.to_csv(path, index=False)
    if args.json:
        write_json(args.json, mechanisms)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
