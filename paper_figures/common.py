"""Shared plumbing of the paper-figure scripts: argument parsing, running a grid of runs through
:func:`offpolicylab.sweep.run_sweep` (cells that already completed are skipped), loading the run directories and
writing PNG + CSV + a ``result.json`` of the measured numbers the README table quotes."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
if str(ROOT.parent) not in sys.path:  # run as `python paper_figures/claim_x.py` from a checkout
    sys.path.insert(0, str(ROOT.parent))

import pandas as pd  # noqa: E402

from offpolicylab import plots  # noqa: E402
from offpolicylab.sweep import expand_grid, run_cell, run_sweep  # noqa: E402

DEFAULT_OUT = ROOT / "out"
#: GRPO without a trust region, ℓ = −A·r: eps_low = 1 never binds (r > 0) and eps_high = 1e9 never binds in
#: practice.  (eps = inf on both sides currently makes ppo_clip_loss call clamp(None, None).)
NO_TRUST_REGION = {"eps_low": 1.0, "eps_high": 1e9}


def parse_args(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--small", action="store_true", help="seconds-long smoke settings (CI)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default paper_figures/out)")
    parser.add_argument("--workers", type=int, default=None, help="parallel runs (default 2; 1 with --small)")
    args = parser.parse_args(argv)
    if args.workers is None:
        args.workers = 1 if args.small else 2
    return args


def claim_dir(args: argparse.Namespace, claim: str) -> Path:
    out = Path(args.out) / (claim + ("_small" if args.small else ""))
    out.mkdir(parents=True, exist_ok=True)
    return out


def sweep(grid: dict[str, Any], out: Path, workers: int) -> list[plots.Run]:
    """Run ``grid`` under ``out`` and load every cell as a :class:`plots.Run` labelled by its grid labels."""
    if workers <= 1:  # in-process: no worker start-up cost (the --small CI path)
        rows = [{"cell": c.name, **run_cell(c.config, c.out_dir)} for c in expand_grid(grid, out)]
    else:
        rows = run_sweep(grid, out, workers=workers)
    failed = [r["cell"] for r in rows if r["status"] == "failed"]
    if failed:
        raise RuntimeError(f"cells failed: {failed}; see their summary.json")
    return plots.load_runs([out])


def save_figure(fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plots.plt.close(fig)
    print(f"wrote {path}")
    return path


def write_result(out: Path, result: dict[str, Any], table: pd.DataFrame | None = None) -> None:
    """``result.json`` (the numbers the README quotes) and optionally ``result.csv``."""
    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        return value
    (out / "result.json").write_text(json.dumps(clean(result), indent=2) + "\n")
    if table is not None:
        table.to_csv(out / "result.csv", index=False)
    print(json.dumps(clean(result), indent=2))


def last_values(runs: list[plots.Run], column: str, tail: int = 1) -> pd.DataFrame:
    """Per run: label, staleness, seed and the mean of the last ``tail`` recorded values of ``column``."""
    rows = []
    for run in runs:
        values = run.metrics[column].dropna() if column in run.metrics else pd.Series(dtype=float)
        rows.append({"label": run.label, "staleness": run.staleness, "seed": run.seed,
                     column: float(values.tail(tail).mean()) if len(values) else math.nan})
    return pd.DataFrame(rows)
