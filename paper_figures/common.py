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
from offpolicylab.sweep import run_sweep  # noqa: E402

DEFAULT_OUT = ROOT / "out"
#: GRPO without a trust region, ℓ = −A·r (eps = inf on both sides means no trust region).
NO_TRUST_REGION = {"eps_low": float("inf"), "eps_high": float("inf")}


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


def sweep(grid: dict[str, Any], out: Path, workers: int) -> list[plots.RunRecord]:
    """Run ``grid`` under ``out`` (in this process when ``workers`` is 1) and load every cell as a run labelled by
    its grid labels."""
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


def last_values(runs: list[plots.RunRecord], column: str, tail: int = 1) -> pd.DataFrame:
    """Per run: label, staleness, seed and the mean of the last ``tail`` recorded values of ``column``."""
    rows = []
    for run in runs:
        values = run.metrics[column].dropna() if column in run.metrics else pd.Series(dtype=float)
        rows.append({"label": run.label, "staleness": run.schedule, "seed": run.seed,
                     column: float(values.tail(tail).mean()) if len(values) else math.nan})
    return pd.DataFrame(rows)


def curve_stats(run: plots.RunRecord, threshold: float = 0.9, column: str = "exact_return") -> dict[str, float]:
    """Shape of one learning curve of ``column``: value at the middle update, peak, final, and the first evaluated
    update at which it reaches ``threshold`` (NaN when it never does)."""
    curve = run.metrics[["update", column]].dropna()
    if curve.empty:
        raise ValueError(f"run {run.path} has no {column} values")
    middle = curve[curve["update"] <= curve["update"].max() / 2][column]
    reached = curve[curve[column] >= threshold]["update"]
    return {"return_at_half": float(middle.iloc[-1]) if len(middle) else math.nan,
            "peak": float(curve[column].max()), "final": float(curve[column].iloc[-1]),
            "updates_to_threshold": float(reached.iloc[0]) if len(reached) else math.nan}


def metric_mean(run: plots.RunRecord, column: str) -> float:
    """Mean of ``column`` over all recorded updates (NaN when the run does not record it)."""
    if column not in run.metrics:
        return math.nan
    values = run.metrics[column].dropna()
    return float(values.mean()) if len(values) else math.nan


def run_table(runs: list[plots.RunRecord], metrics: tuple[str, ...] = (), threshold: float = 0.9) -> pd.DataFrame:
    """One row per run: label, staleness, seed, :func:`curve_stats` and the run-mean of each of ``metrics``."""
    return pd.DataFrame([{"label": run.label, "staleness": run.schedule, "seed": run.seed,
                          **curve_stats(run, threshold), **{m: metric_mean(run, m) for m in metrics}}
                         for run in runs])


def seed_mean(table: pd.DataFrame) -> pd.DataFrame:
    """Mean over seeds per (label, staleness); ``updates_to_threshold`` is NaN if any seed never reached it."""
    grouped = table.drop(columns="seed").groupby(["label", "staleness"], sort=False)
    mean = grouped.mean(numeric_only=True)
    if "updates_to_threshold" in table:
        mean["updates_to_threshold"] = grouped["updates_to_threshold"].agg(lambda s: s.mean(skipna=False))
    return mean.reset_index()


def rounded(row: pd.Series, keys: tuple[str, ...]) -> dict[str, float]:
    """``{key: row[key]}`` rounded to 4 digits, leaving out keys the row lacks or holds NaN for."""
    return {k: round(float(row[k]), 4) for k in keys if k in row and not pd.isna(row[k])}


def rounded_by_cell(mean: pd.DataFrame, keys: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """``{"<label> @ <staleness>": rounded(row, keys)}`` for each row of a :func:`seed_mean` table."""
    return {f"{r['label']} @ {r['staleness']}": rounded(r, keys) for _, r in mean.iterrows()}


def save_curves_and_tables(out: Path, claim: str, runs: list[plots.RunRecord], curve_metric: str, table: pd.DataFrame,
                           result: dict[str, Any], mean: pd.DataFrame) -> None:
    """The common tail of a claim: training curves of exact return and ``curve_metric`` as
    ``claim_<claim>_curves.png``, the per-run ``table`` as ``claim_<claim>_runs.csv``, then :func:`write_result`
    with the seed means."""
    save_figure(plots.training_curves(runs, metrics=("exact_return", curve_metric)), out / f"claim_{claim}_curves.png")
    table.to_csv(out / f"claim_{claim}_runs.csv", index=False)
    write_result(out, result, mean)


def point_figure(table: pd.DataFrame, x: str, ys: dict[str, str], hue: str | None, title: str,
                 order: list[str] | None = None, log_x: bool = False, x_label: str | None = None) -> Any:
    """One panel per ``ys`` column (y-axis label = its value): ``table[y]`` against ``x``, the mean over seeds as a
    large marker (joined by lines only for a numeric ``x``) with each seed as a faint dot, colour by ``hue``
    (colour-blind palette)."""
    plots._setup()
    fig, axes = plots.plt.subplots(1, len(ys), figsize=(3.8 * len(ys) + 1.5, 3.2), squeeze=False)
    numeric_x = pd.api.types.is_numeric_dtype(table[x])
    dodge = 0.3 if hue and table[hue].nunique() > 1 else False  # seaborn divides by (hue levels − 1)
    for ax, (column, label) in zip(axes[0], ys.items(), strict=True):
        if numeric_x:
            plots.sns.lineplot(data=table, x=x, y=column, hue=hue, marker="o", errorbar=None, ax=ax,
                               palette="colorblind" if hue else None, legend=ax is axes[0][-1])
            plots.sns.scatterplot(data=table, x=x, y=column, hue=hue, ax=ax, alpha=0.4, legend=False,
                                  palette="colorblind" if hue else None)
            if log_x:
                ax.set_xscale("log", base=2)
                ax.set_xticks(sorted(table[x].unique()), [f"{v:g}" for v in sorted(table[x].unique())])
        else:
            plots.sns.pointplot(data=table, x=x, y=column, hue=hue, order=order, errorbar=None, dodge=dodge,
                                linestyle="none", markers="D", ax=ax, palette="colorblind" if hue else None, legend=ax is axes[0][-1])
            plots.sns.stripplot(data=table, x=x, y=column, hue=hue, order=order, dodge=bool(dodge), alpha=0.4, ax=ax,
                                palette="colorblind" if hue else None, legend=False)
            ax.tick_params(axis="x", rotation=30)
        if column in ("return_at_half", "peak", "final"):  # exact returns of rewards in [0, 1]
            ax.set_ylim(-0.02, 1.02)
        ax.set_ylabel(label)
        ax.set_xlabel(x_label or x)
    if axes[0][-1].get_legend() is not None:
        plots.sns.move_legend(axes[0][-1], "center left", bbox_to_anchor=(1.02, 0.5), frameon=False)
    fig.suptitle(title, y=1.03)
    fig.tight_layout()
    return fig
