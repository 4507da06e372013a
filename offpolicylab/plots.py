"""Seaborn figures drawn from run directories; plots never re-run training.

Runs are read by :mod:`offpolicylab.run_records` (the only reader of run directories) as
:class:`~offpolicylab.run_records.RunRecord` records; this module gives each a legend label.  Every figure function takes loaded runs and returns a matplotlib ``Figure``; when the runs lack the data a figure
needs it raises :class:`FigureSkipped` with the reason, and :func:`plot_runs` prints that reason and goes on.

Colours: one fixed colour per *objective* (registry name) in every figure, from the Okabe–Ito and Paul Tol
colour-blind-safe palettes; variants of one objective (different parameters) share the colour and differ by line
style.  Command line: ``offpolicylab plot DIR [DIR ...] --out FIG_DIR`` (see :func:`main`).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from offpolicylab import run_records  # noqa: E402
from offpolicylab.diagnostics import correlation  # noqa: E402
from offpolicylab.diagnostics.ratios import entropy_by_ratio_deviation  # noqa: E402
from offpolicylab.objectives import objective_params  # noqa: E402
from offpolicylab.output import OutputWriter  # noqa: E402
from offpolicylab.run_dir import REWARD_COLUMNS  # noqa: E402
from offpolicylab.run_records import RunRecord, load_samples, sample_update  # noqa: E402

# ----------------------------------------------------------------------------------------------- colours
#: Okabe & Ito (2008) then Paul Tol's "muted" scheme: both designed to stay distinct under colour-vision deficiency.
COLORBLIND_COLORS: tuple[str, ...] = (
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#332288",
    "#882255", "#44AA99", "#AA4499", "#999933", "#117733", "#CC6677", "#DDCC77", "#F0E442",
)
#: A fixed order of the objectives; position i gets COLORBLIND_COLORS[i] so colours never depend on which runs are shown.
OBJECTIVE_ORDER: tuple[str, ...] = (
    "grpo", "m2po", "reinforce", "rec", "opmd", "asymre", "red_weight", "ac_mispo", "p3o", "mu_grpo", "mispo",
    "gspo", "rec_gspo", "red_drop", "cispo", "topr",
)
LINESTYLES: tuple[Any, ...] = ("-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 1)))
SIGN_COLORS = {"A > 0": "#0072B2", "A < 0": "#D55E00", "A = 0": "#999999"}
KEPT_COLORS = {"kept": "#BBBBBB", "clipped / masked": "#444444"}


def objective_color(objective: str) -> str:
    """The fixed colour of an objective; unknown names get a stable colour from a hash of the name."""
    if objective in OBJECTIVE_ORDER:
        return COLORBLIND_COLORS[OBJECTIVE_ORDER.index(objective)]
    return COLORBLIND_COLORS[sum(map(ord, objective)) % len(COLORBLIND_COLORS)]


# ----------------------------------------------------------------------------------------------- loading
class FigureSkipped(Exception):
    """Raised by a figure function when the given runs do not hold the data it needs (message says what)."""


def objective_params_of(config: dict[str, Any]) -> dict[str, Any]:
    """The objective parameters recorded in a run's config."""
    return dict(config.get("objective_params") or {})


def run_label(config: dict[str, Any]) -> str:
    """A legend label: ``objective(k=v, ...)`` with the recorded parameters that differ from the defaults."""
    objective = str(config.get("objective", "unknown"))
    params = _non_default(objective, objective_params_of(config))
    shown = ", ".join(f"{k}={_short(v)}" for k, v in sorted(params.items()) if v is not None)
    return f"{objective}({shown})" if shown else objective


def _non_default(objective: str, params: dict[str, Any]) -> dict[str, Any]:
    """Drop parameters equal to the registered objective's defaults (configs record every resolved value)."""
    try:
        specs = objective_params(objective)
    except ValueError:
        return params
    def same(key: str, value: Any) -> bool:
        default = specs[key].default
        if isinstance(value, (list, tuple)) and isinstance(default, (list, tuple)):
            return len(value) == len(default) and all(math.isclose(a, b) for a, b in zip(value, default, strict=True))
        return value == default
    return {k: v for k, v in params.items() if k not in specs or not same(k, v)}


def _short(value: Any) -> str:
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_short(v) for v in value) + "]"
    return str(value)


def staleness_sort_key(label: str) -> tuple[int, float, str]:
    """on_policy first, then schedules ordered by their first number (stale_k:4 before stale_k:256)."""
    if label == "on_policy":
        return (0, 0.0, label)
    numbers = re.findall(r"[-+]?\d*\.?\d+", label)
    return (1, float(numbers[0]) if numbers else math.inf, label)


#: Axes and config fields a legend label leaves out: a figure's columns (schedule), the seeds a line averages over,
#: and the fields that change where numbers go, not the numbers.
UNLABELLED = ("seed", "schedule", "objective", "objective_params", "report_to", "imports", "fsync",
              "checkpoint_every", "sample_every", "metrics_every")


def labelled(runs: list[RunRecord]) -> list[RunRecord]:
    """Give each run without a legend label one that tells apart every configuration shown: its sweep cell's
    objective label (else :func:`run_label`), then its other sweep axes' labels, or for runs from outside a sweep
    the config fields in which the runs differ (``lr=0.01``) — seeds and schedules aside (:data:`UNLABELLED`), which
    the figures show as bands and columns.  Runs of one label are averaged as seeds, so no two configurations may
    share one."""
    differing = _differing_fields([run.config for run in runs if not run.labels])
    for run in runs:
        if run.label:
            continue
        base = run.labels.get("objective") or run_label(run.config)
        if run.labels:
            extra = [f"{axis}={value}" for axis, value in run.labels.items() if axis not in UNLABELLED]
        else:
            flat = _flat(run.config)
            extra = [f"{key}={_short(flat[key]) if key in flat else 'default'}" for key in sorted(differing)]
        run.label = ", ".join([base, *extra])
    return runs


def _flat(config: dict[str, Any]) -> dict[str, Any]:
    """A config's fields, mapping-valued ones as ``field.key`` (``world_params.family``), without
    :data:`UNLABELLED` and anything that is no config field (``environment``)."""
    from offpolicylab.config import config_params

    out: dict[str, Any] = {}
    for key, param in config_params().items():
        if key in UNLABELLED:
            continue
        value = config.get(key, param.default)  # a field a config lacks (an earlier version's) has its default
        if isinstance(value, dict):
            out.update({f"{key}.{sub}": item for sub, item in sorted(value.items())})
        else:
            out[key] = value
    return out


def _differing_fields(configs: list[dict[str, Any]]) -> set[str]:
    """The :func:`_flat` fields whose values are not the same in every config (missing counts as a value)."""
    flats = [_flat(config) for config in configs]
    keys = {key for flat in flats for key in flat}
    return {key for key in keys if len({repr(flat.get(key)) for flat in flats}) > 1}


def run_order(run: RunRecord) -> tuple[Any, ...]:
    """Rows and lines in a stable, numeric order: label, then schedule (:func:`staleness_sort_key`), then seed."""
    return (run.label, staleness_sort_key(run.schedule), run.seed, str(run.path))


def load_run(run_dir: str | Path) -> RunRecord:
    """One run directory (:func:`offpolicylab.run_records.load_run`) with its legend label."""
    return labelled([run_records.load_run(run_dir)])[0]


def load_runs(paths: Iterable[str | Path]) -> list[RunRecord]:
    """Every run directory under ``paths`` (:func:`offpolicylab.run_records.load_runs`) with legend labels."""
    return labelled(run_records.load_runs(paths))


# ----------------------------------------------------------------------------------------------- frames
def metrics_frame(runs: Sequence[RunRecord], columns: Sequence[str]) -> pd.DataFrame:
    """Long frame of the given metric columns (only runs that have at least one), with run identity columns."""
    frames = []
    for run in runs:
        present = [c for c in columns if c in run.metrics.columns]
        if not present:
            continue
        frame = run.metrics[["update", *present]].copy()
        frame["objective"], frame["label"] = run.objective, run.label
        frame["staleness"], frame["seed"], frame["run"] = run.schedule, run.seed, str(run.path)
        frames.append(frame)
    if not frames:
        raise FigureSkipped(f"no run has any of the columns {list(columns)}")
    return pd.concat(frames, ignore_index=True)


def reward_column(runs: Sequence[RunRecord]) -> str:
    """The column of the runs' one reward (docs/metrics.md, "One reward"): the first of
    :data:`offpolicylab.run_dir.REWARD_COLUMNS` that every run records a value of, else ``reward_mean``."""
    for column in REWARD_COLUMNS:
        if runs and all(column in r.metrics.columns and r.metrics[column].notna().any() for r in runs):
            return column
    return "reward_mean"


def return_column(runs: Sequence[RunRecord]) -> str:
    """``exact_return`` when every run records it, else ``eval_reward_greedy``, else ``reward_mean``."""
    for column in ("exact_return", "eval_reward_greedy", "reward_mean"):
        if all(column in r.metrics.columns and r.metrics[column].notna().any() for r in runs):
            return column
    raise FigureSkipped("runs share no return column (exact_return, eval_reward_greedy or reward_mean)")


def return_table(runs: Sequence[RunRecord], column: str | None = None) -> pd.DataFrame:
    """Peak (max over updates) and final (last recorded value) of the return per run, then the mean over seeds
    for each (label, staleness) cell.  Columns: label, objective, staleness, peak, final, seeds."""
    column = column or return_column(runs)
    rows = []
    for run in runs:
        values = run.metrics[column].dropna() if column in run.metrics.columns else pd.Series(dtype=float)
        if values.empty:
            continue
        rows.append({"label": run.label, "objective": run.objective, "staleness": run.schedule,
                     "peak": float(values.max()), "final": float(values.iloc[-1])})
    if not rows:
        raise FigureSkipped(f"no run records {column}")
    table = pd.DataFrame(rows).groupby(["label", "objective", "staleness"], as_index=False)
    return table.agg(peak=("peak", "mean"), final=("final", "mean"), seeds=("peak", "size"))


def acceptance_m2_correlation(runs: Sequence[RunRecord]) -> dict[str, float]:
    """Pearson r, p and Spearman ρ, p between per-update ``accept_rate`` and ``m2`` pooled over the runs."""
    frame = metrics_frame(runs, ["accept_rate", "m2"])
    if "accept_rate" not in frame or "m2" not in frame:
        raise FigureSkipped("acceptance-vs-M2 needs both accept_rate and m2 columns")
    frame = frame[["accept_rate", "m2"]].dropna()
    if len(frame) < 3 or frame["accept_rate"].nunique() < 2 or frame["m2"].nunique() < 2:
        raise FigureSkipped("acceptance-vs-M2 needs at least 3 updates with varying accept_rate and m2")
    pearson = correlation.pearson(frame["accept_rate"].to_numpy(), frame["m2"].to_numpy())
    spearman = correlation.spearman(frame["accept_rate"].to_numpy(), frame["m2"].to_numpy())
    return {"pearson_r": pearson.statistic, "pearson_p": pearson.pvalue,
            "spearman_r": spearman.statistic, "spearman_p": spearman.pvalue, "n": float(pearson.n)}


def sample_frame(runs: Sequence[RunRecord], max_files: int | None = None) -> pd.DataFrame:
    """Token-level frame from the runs' sample files: update, log_ratio, advantage, entropy (when present),
    kept (when present), plus run identity.  ``max_files`` keeps that many files per run, evenly spaced."""
    frames = []
    for run in runs:
        files = run.sample_files
        if max_files is not None and len(files) > max_files:
            files = [files[i] for i in np.linspace(0, len(files) - 1, max_files).round().astype(int)]
        for path in files:
            data = load_samples(path)
            if "log_ratio" not in data or "advantage" not in data:
                continue
            frame = pd.DataFrame({"log_ratio": data["log_ratio"].astype(float).ravel(),
                                  "advantage": data["advantage"].astype(float).ravel()})
            for key in ("entropy", "kept"):
                if key in data and data[key].size == frame.shape[0]:
                    frame[key] = data[key].ravel()
            frame["update"] = sample_update(path)
            frame["label"], frame["objective"], frame["staleness"] = run.label, run.objective, run.schedule
            frame["run"] = str(run.path)
            frames.append(frame)
    if not frames:
        raise FigureSkipped("no run has samples/*.npz with log_ratio and advantage arrays")
    return pd.concat(frames, ignore_index=True)


#: |r − 1| bin edges for entropy-by-ratio (same edges for every run so the curves compare); deviations above the
#: last edge land in the last bin.
RATIO_DEVIATION_BINS: tuple[float, ...] = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 10.0)


def entropy_by_ratio_bin(frame: pd.DataFrame, edges: Sequence[float] = RATIO_DEVIATION_BINS) -> pd.DataFrame:
    """Mean token entropy in each |r − 1| bin (left-closed), per label
    (:func:`~offpolicylab.diagnostics.ratios.entropy_by_ratio_deviation`): columns label, bin, bin_low, entropy,
    tokens; bins without tokens are left out."""
    if "entropy" not in frame:
        raise FigureSkipped("sample files hold no entropy array")
    rows = []
    for label, group in frame.groupby("label", sort=True):
        log_ratio = torch.tensor(group["log_ratio"].to_numpy(dtype=np.float64))
        table = entropy_by_ratio_deviation(log_ratio, torch.tensor(group["entropy"].to_numpy(dtype=np.float64)),
                                           torch.ones_like(log_ratio), edges)
        rows += [{"label": label, "bin": k, "bin_low": edges[k], "entropy": float(table.mean_entropy[k]),
                  "tokens": int(table.counts[k])} for k in range(len(edges) - 1) if table.counts[k] > 0]
    return pd.DataFrame(rows, columns=["label", "bin", "bin_low", "entropy", "tokens"])


# ----------------------------------------------------------------------------------------------- drawing
def _style_map(labels: Iterable[str], objective_of: dict[str, str]) -> dict[str, dict[str, Any]]:
    """label -> {color, linestyle}: colour by objective, line style by variant index within the objective."""
    styles: dict[str, dict[str, Any]] = {}
    seen: dict[str, int] = {}
    for label in sorted(set(labels)):
        objective = objective_of[label]
        index = seen.get(objective, 0)
        seen[objective] = index + 1
        styles[label] = {"color": objective_color(objective), "linestyle": LINESTYLES[index % len(LINESTYLES)]}
    return styles


def _styles_for(frame: pd.DataFrame) -> dict[str, dict[str, Any]]:
    return _style_map(frame["label"], dict(zip(frame["label"], frame["objective"], strict=False)))


def _setup() -> None:
    sns.set_theme(style="whitegrid", context="notebook", font_scale=0.9)


def _line_by_label(ax: Any, frame: pd.DataFrame, y: str, styles: dict[str, dict[str, Any]]) -> None:
    """Mean over seeds per update (band = min..max over seeds when several)."""
    for label, group in frame.dropna(subset=[y]).groupby("label"):
        stats = group.groupby("update")[y].agg(["mean", "min", "max"]).reset_index()
        style = styles[label]
        ax.plot(stats["update"], stats["mean"], label=label, lw=1.6, **style)
        if group["seed"].nunique() > 1:
            ax.fill_between(stats["update"], stats["min"], stats["max"], color=style["color"], alpha=0.15, lw=0)


def _legend(fig: Figure, axes: np.ndarray) -> None:
    handles, labels = [], []
    for ax in np.ravel(axes):
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    if handles:
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False, fontsize="small")


_AXIS_LABELS = {
    "reward_mean": "mean reward (per response)",
    "reward_current": "reward (current policy)",
    "exact_return": "exact expected return",
    "eval_reward_greedy": "greedy eval reward",
    "clip_frac": "clipped tokens (fraction)",
    "mask_frac": "masked tokens (fraction)",
    "ess": "ESS (fraction of n)",
    "kl_k1": "KL k1 estimate (nats/token)",
    "kl_k3": "KL k3 estimate (nats/token)",
    "nav_frac": "vetoed tokens (fraction)",
    "accept_rate": "trajectory acceptance (fraction)",
    "m2": "M2 = mean (log r)^2 (nats^2)",
    "traj_bound": "trajectory bound",
}


COLLAPSE_LABEL = "collapse detected"


def training_curves(runs: Sequence[RunRecord], metrics: Sequence[str] | None = None) -> Figure:
    """Reward (and exact return where known) against update, one column per staleness schedule, colour per
    objective; a collapse event is marked with an × at the update it was detected.  The reward is the run's one
    reward (docs/metrics.md): ``reward_current`` where every run records it, else ``reward_mean``."""
    if metrics is None:
        metrics = (reward_column(runs), "exact_return")

    def mark_collapses(ax: plt.Axes, metric: str, staleness: str) -> None:
        for run in runs:
            if run.schedule != staleness or metric not in run.metrics.columns:
                continue
            series = run.metrics.set_index("update")[metric].dropna()
            for update in run.collapse_updates():
                before = series[series.index <= update]
                if not before.empty:
                    ax.scatter([update], [before.iloc[-1]], marker="X", s=70, zorder=5, color="black",
                               label=COLLAPSE_LABEL)

    collapsed = any(run.collapse_updates() for run in runs)
    title = "Training curves by staleness schedule" + (" (× = collapse detected)" if collapsed else "")
    return _metric_panels(runs, metrics, title, row_height=2.8, decorate=mark_collapses)


def shown_runs(runs: Sequence[RunRecord], max_runs: int | None, figure: str) -> tuple[list[RunRecord], list[str]]:
    """(the runs a one-row-per-run figure draws, the notes naming those it leaves out): every run in
    :func:`run_order` unless ``max_runs`` (then the first ``max_runs``, and a note saying which were left out and
    how to include them)."""
    ordered = sorted(runs, key=run_order)
    if max_runs is None or len(ordered) <= max_runs:
        return ordered, []
    left = ordered[max_runs:]
    names = ", ".join(run.path.name for run in left)
    return ordered[:max_runs], [f"{figure}: showing {max_runs} of {len(ordered)} runs (--max-runs {max_runs}); "
                                f"left out: {names} (omit --max-runs to show every run)"]


def ratio_histograms(runs: Sequence[RunRecord], snapshots: int = 4, max_runs: int | None = None) -> Figure:
    """Histograms of log r = log π_θ − log π_b at a few updates across training, split by advantage sign
    (one row per run, in :func:`run_order`; one column per snapshot); counts on a log scale.  Every run that has
    sample files is drawn, or the first ``max_runs`` with a note naming the others (``fig.offpolicylab_notes``)."""
    chosen, notes = shown_runs([run for run in runs if run.sample_files], max_runs, "ratio_histograms")
    frame = sample_frame(chosen, max_files=snapshots)
    frame = frame.assign(row=frame["run"])
    labels = list(dict.fromkeys(frame["row"]))
    titles = {str(run.path): f"{run.label} | {run.schedule} | seed {run.seed}" for run in chosen}
    width = max(frame.groupby("row")["update"].nunique())
    frame = frame.assign(sign=np.where(frame["advantage"] > 0, "A > 0", np.where(frame["advantage"] < 0,
                                                                                  "A < 0", "A = 0")))
    finite = frame["log_ratio"][np.isfinite(frame["log_ratio"])]
    span = max(float(np.quantile(np.abs(finite), 0.999)) if len(finite) else 1.0, 1e-3)
    bins = np.linspace(-span, span, 41)
    _setup()
    fig, axes = plt.subplots(len(labels), width, figsize=(3.0 * width + 1.5, 2.4 * len(labels)), squeeze=False,
                             sharex=True)
    for i, row in enumerate(labels):
        sub = frame[frame["row"] == row]
        for j, update in enumerate(sorted(sub["update"].unique())):
            ax = axes[i, j]
            for sign, group in sub[sub["update"] == update].groupby("sign"):
                ax.hist(np.clip(group["log_ratio"], -span, span), bins=bins, color=SIGN_COLORS[sign], alpha=0.55,
                        label=sign, log=True)
            ax.set_title(f"{titles[row]}\nupdate {update}", fontsize="small")
            ax.axvline(0.0, color="grey", lw=0.8)
            if i == len(labels) - 1:
                ax.set_xlabel("log r (nats)")
            if j == 0:
                ax.set_ylabel("tokens (count, log)")
        for j in range(sub["update"].nunique(), width):
            axes[i, j].set_visible(False)
    fig.suptitle("Importance-ratio histograms by advantage sign over training", y=1.01)
    _legend(fig, axes)
    fig.tight_layout()
    fig.offpolicylab_notes = notes
    return fig


def entropy_vs_clipping(runs: Sequence[RunRecord]) -> Figure:
    """Left: mean entropy of tokens the objective clipped/masked vs tokens it kept (per run label).
    Right: mean token entropy by |r − 1| bin (does entropy rise with ratio deviation?)."""
    frame = sample_frame(runs)
    if "entropy" not in frame:
        raise FigureSkipped("sample files hold no entropy array")
    styles = _styles_for(frame)
    _setup()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    if "kept" in frame and frame["kept"].notna().any():
        kept = frame.dropna(subset=["kept"]).assign(
            group=lambda f: np.where(f["kept"].astype(bool), "kept", "clipped / masked"))
        means = kept.groupby(["label", "group"], as_index=False)["entropy"].mean()
        sns.barplot(data=means, y="label", x="entropy", hue="group", palette=KEPT_COLORS, ax=axes[0],
                    hue_order=list(KEPT_COLORS))
        axes[0].set_xlabel("mean token entropy (nats)")
        axes[0].set_ylabel("")
        axes[0].set_title("Entropy of kept vs clipped/masked tokens")
        # below the panel, outside the bars (inside, it covered the longest ones)
        axes[0].legend(fontsize="small", frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    else:
        axes[0].text(0.5, 0.5, "no 'kept' flags in samples", ha="center", va="center", transform=axes[0].transAxes)
        axes[0].set_axis_off()
    table = entropy_by_ratio_bin(frame)
    edges = RATIO_DEVIATION_BINS
    names = [f"[{edges[i]:g},{edges[i + 1]:g})" for i in range(len(edges) - 1)]
    for label, group in table.groupby("label"):
        axes[1].plot(group["bin"], group["entropy"], marker="o", label=label, **styles[label])
    axes[1].set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize="small")
    axes[1].set_xlabel("|r − 1| bin")
    axes[1].set_ylabel("mean token entropy (nats)")
    axes[1].set_title("Entropy by ratio deviation")
    axes[1].legend(fontsize="small", frameon=False)
    fig.tight_layout()
    return fig


def acceptance_vs_m2(runs: Sequence[RunRecord]) -> Figure:
    """Per-update trajectory acceptance rate against M2 = mean (log r)², with Pearson and Spearman r and p."""
    stats = acceptance_m2_correlation(runs)
    frame = metrics_frame(runs, ["accept_rate", "m2"]).dropna(subset=["accept_rate", "m2"])
    styles = _styles_for(frame)
    _setup()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for label, group in frame.groupby("label"):
        ax.scatter(group["m2"], group["accept_rate"], s=12, alpha=0.7, color=styles[label]["color"], label=label)
    ax.set_xlabel(_AXIS_LABELS["m2"])
    ax.set_ylabel(_AXIS_LABELS["accept_rate"])
    ax.set_title(f"Acceptance vs M2 (n = {int(stats['n'])} updates)\n"
                 f"Pearson r = {stats['pearson_r']:.2f} (p = {stats['pearson_p']:.2g}), "
                 f"Spearman ρ = {stats['spearman_r']:.2f} (p = {stats['spearman_p']:.2g})", fontsize="medium")
    ax.legend(fontsize="small", frameon=False)
    fig.tight_layout()
    return fig


def acceptance_target(update: np.ndarray, a_start: float, a_end: float, warmup: int) -> np.ndarray:
    """AC-MIS-PO target acceptance A*_k at each 0-based ``update`` (k = update + 1 controller steps taken):
    a_start + (a_end − a_start)·min(k/warmup, 1), the paper's eq. 8."""
    progress = np.clip((np.asarray(update, dtype=float) + 1.0) / max(warmup, 1), 0.0, 1.0)
    return a_start + (a_end - a_start) * progress


def controller_dynamics(runs: Sequence[RunRecord]) -> Figure:
    """AC-MIS-PO: the trajectory bound b_k over training, and trajectory acceptance against the target A*_k."""
    chosen = [r for r in runs if r.objective == "ac_mispo" and {"traj_bound", "accept_rate"} <= set(r.metrics)]
    if not chosen:
        raise FigureSkipped("no ac_mispo run with traj_bound and accept_rate columns")
    frame = metrics_frame(chosen, ["traj_bound", "accept_rate"])
    styles = _styles_for(frame)
    _setup()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    _line_by_label(axes[0], frame, "traj_bound", styles)
    axes[0].set_title("Controller bound b_k")
    axes[0].set_ylabel("trajectory bound b_k (|log ρ|, nats)")
    _line_by_label(axes[1], frame, "accept_rate", styles)
    for run in chosen:
        params = objective_params_of(run.config)
        updates = run.metrics["update"].to_numpy()
        target = acceptance_target(updates, float(params.get("a_start", 0.4)), float(params.get("a_end", 0.2)),
                                   int(params.get("warmup", 200)))
        axes[1].plot(updates, target, color="black", ls="--", lw=1.0, label="target A*_k")
    axes[1].set_title("Trajectory acceptance vs target")
    axes[1].set_ylabel(_AXIS_LABELS["accept_rate"])
    for ax in axes:
        ax.set_xlabel("update (optimizer steps)")
    _legend(fig, axes)
    fig.tight_layout()
    return fig


def _metric_panels(runs: Sequence[RunRecord], metrics: Sequence[str], title: str, row_height: float = 2.6,
                   decorate: Callable[[plt.Axes, str, str], None] | None = None) -> Figure:
    """One row per metric the runs report, one column per staleness schedule, a line per label;
    ``decorate(ax, metric, staleness)`` may add to each panel after its lines are drawn."""
    frame = metrics_frame(runs, metrics)
    present = [m for m in metrics if m in frame.columns and frame[m].notna().any()]
    cols = sorted(frame["staleness"].unique(), key=staleness_sort_key)
    styles = _styles_for(frame)
    _setup()
    fig, axes = plt.subplots(len(present), len(cols), figsize=(3.6 * len(cols) + 1.5, row_height * len(present)),
                             squeeze=False, sharex="col", sharey="row")
    for i, metric in enumerate(present):
        for j, staleness in enumerate(cols):
            ax = axes[i, j]
            _line_by_label(ax, frame[frame["staleness"] == staleness], metric, styles)
            if decorate is not None:
                decorate(ax, metric, staleness)
            if i == 0:
                ax.set_title(f"staleness: {staleness}")
            if i == len(present) - 1:
                ax.set_xlabel("update (optimizer steps)")
            ax.set_ylabel(_AXIS_LABELS.get(metric, metric) if j == 0 else "")
    fig.suptitle(title, y=1.02)
    _legend(fig, axes)
    fig.tight_layout()
    return fig


def ess_and_kl(runs: Sequence[RunRecord]) -> Figure:
    """Effective sample size and the k1 / k3 KL(π_b ‖ π_θ) estimates over training, by staleness."""
    return _metric_panels(runs, ["ess", "kl_k1", "kl_k3"], "ESS and KL to the behaviour policy over training")


def clip_fraction(runs: Sequence[RunRecord]) -> Figure:
    """Share of tokens clipped (PPO-style) or masked by the objective over training, by staleness."""
    return _metric_panels(runs, ["clip_frac", "mask_frac"], "Clipped / masked token fraction over training")


def veto_fraction(runs: Sequence[RunRecord]) -> Figure:
    """Mu-GRPO negative-advantage veto: share of tokens vetoed per update."""
    chosen = [r for r in runs if "nav_frac" in r.metrics.columns and r.metrics["nav_frac"].notna().any()]
    if not chosen:
        raise FigureSkipped("no run records nav_frac (the negative-advantage veto fraction)")
    return _metric_panels(chosen, ["nav_frac"], "Negative-advantage veto fraction over training")


def return_heatmap(runs: Sequence[RunRecord]) -> Figure:
    """Objective × staleness heatmaps of peak and final return (mean over seeds), from :func:`return_table`."""
    column = return_column(runs)
    table = return_table(runs, column)
    cols = sorted(table["staleness"].unique(), key=staleness_sort_key)
    _setup()
    # constrained layout keeps each colorbar and its label clear of the next panel (tight_layout let them overlap)
    fig, axes = plt.subplots(1, 2, figsize=(2.2 * len(cols) + 6.5, 0.45 * table["label"].nunique() + 2.2),
                             layout="constrained")
    fig.get_layout_engine().set(wspace=0.12)  # room between the first colorbar's label and the second panel
    for ax, which in zip(axes, ("peak", "final"), strict=True):
        grid = table.pivot(index="label", columns="staleness", values=which).reindex(columns=cols)
        sns.heatmap(grid, annot=True, fmt=".3g", cmap="viridis", ax=ax, cbar_kws={"label": f"{which} {column}"})
        ax.set_title(f"{which} {column}")
        ax.set_xlabel("staleness schedule")
        ax.set_ylabel("objective")
        ax.tick_params(axis="y", labelrotation=0)  # seaborn turns long labels upright, over one another
    return fig


def raw_log_ratio_tables(runs: Sequence[RunRecord]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(histograms, health) of the raw, pre-truncation log-ratios in the runs' recorded batches (samples/*.npz with
    the whole batch, ``sample_every`` > 0), computed as ``replay`` computes them
    (:func:`offpolicylab.recorded.recorded_raw_log_ratios`, :func:`~offpolicylab.recorded.raw_histograms`,
    :func:`~offpolicylab.recorded.raw_health`): per run (its directory name and legend label) the counts per
    :data:`~offpolicylab.recorded.RAW_EDGES` bin by ratio — ``sampler``: log π_trainer − log π_sampler, recorded when the
    sampler computes differently from the trainer; ``staleness``: Δ = log π_θ − log π_behaviour — × version lag ×
    token-entropy tercile × advantage sign, and per run and ratio verl's health numbers of ρ = e^{log r} (IS mean,
    ESS, χ²_token; Kong 1992 for the ESS) with the ranges it documents."""
    from offpolicylab import recorded

    counts, health, refused = [], [], []
    for run in runs:
        if not run.sample_files:
            continue
        try:
            raw = recorded.recorded_raw_log_ratios(run.sample_files)
        except recorded.ReplayError as error:  # e.g. hand-written samples without the whole batch
            refused.append(str(error))
            continue
        if "delta" not in raw or raw["delta"].size == 0:
            continue
        ident = {"run": run.path.name, "label": run.label}
        counts += [{**ident, **row} for row in recorded.raw_histograms(raw)]
        for ratio, key in (("sampler", "sampler"), ("staleness", "delta")):
            if key in raw:
                row = recorded.raw_health(raw[key])
                health.append({**ident, "ratio": ratio, **row, "verl_health": recorded.health_flags(row)})
    if not counts:
        why = f" ({refused[0]})" if refused else ""
        raise FigureSkipped("no run has samples/*.npz with the whole batch (batch_log_ratio): run with sample_every "
                            f"> 0{why}")
    return pd.DataFrame(counts), pd.DataFrame(health)


def raw_log_ratios(runs: Sequence[RunRecord], max_runs: int | None = None) -> Figure:
    """The raw log-ratio distribution of each run's recorded batches before any truncation or mask (trainer vs
    sampler beside current vs behaviour, all recorded updates, lags, terciles and signs pooled), with the engines'
    default ratio bounds marked and verl's health numbers (IS mean in [0.5, 2], ESS ≥ 0.3, χ²_token ≤ 1) written
    per panel; the tables behind it (:func:`raw_log_ratio_tables`) are written beside it as CSV files.  One panel
    per run in :func:`run_order`, every run, or the first ``max_runs`` with a note naming the others (the CSV
    tables always hold every run)."""
    from offpolicylab import recorded

    counts, health = raw_log_ratio_tables(sorted(runs, key=run_order))
    by_name = {run.path.name: run for run in runs}
    chosen, notes = shown_runs([by_name[name] for name in dict.fromkeys(counts["run"])], max_runs,
                               "raw_log_ratios")
    names = [run.path.name for run in chosen]
    _setup()
    fig, axes = plt.subplots(len(names), 1, figsize=(8.0, 3.6 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        rows = counts[counts["run"] == name].to_dict("records")
        lines = [f"{row['ratio']}: IS mean {row['is_mean']:.3g}, ESS {row['ess']:.3g}, χ² {row['chi2']:.3g} "
                 f"({row['verl_health']})" for row in health[health["run"] == name].to_dict("records")]
        recorded.draw_raw_log_ratios(ax, rows, "\n".join([f"{name} ({rows[0]['label']})", *lines]))
        ax.title.set_fontsize(8)
    fig.suptitle("Raw log-ratios of the recorded batches, before any truncation or mask\n(dotted: the engines' "
                 "default ratio bounds; verl's health ranges: IS mean in [0.5, 2], ESS ≥ 0.3, χ² ≤ 1)", y=1.0)
    fig.tight_layout()
    fig.offpolicylab_tables = {RAW_COUNTS_CSV: counts, RAW_HEALTH_CSV: health}
    fig.offpolicylab_notes = notes
    return fig


RAW_COUNTS_CSV, RAW_HEALTH_CSV = "raw_log_ratios.csv", "raw_log_ratio_health.csv"
#: The CSV files a figure may write beside its PNG (a figure function sets ``fig.offpolicylab_tables``).
TABLE_FILES = (RAW_COUNTS_CSV, RAW_HEALTH_CSV)


#: name -> figure function; :func:`plot_runs` writes ``<name>.png`` for each that applies.
FIGURES: dict[str, Callable[[Sequence[RunRecord]], Figure]] = {
    "training_curves": training_curves,
    "return_heatmap": return_heatmap,
    "clip_fraction": clip_fraction,
    "ess_kl": ess_and_kl,
    "ratio_histograms": ratio_histograms,
    "entropy_vs_clipping": entropy_vs_clipping,
    "acceptance_vs_m2": acceptance_vs_m2,
    "controller_dynamics": controller_dynamics,
    "veto_fraction": veto_fraction,
    "raw_log_ratios": raw_log_ratios,
}


#: The figures with one row per run, which ``max_runs`` (``--max-runs``) may limit.
PER_RUN_FIGURES = ("ratio_histograms", "raw_log_ratios")


def plot_runs(paths: Iterable[str | Path], out_dir: str | Path | OutputWriter, figures: Sequence[str] | None = None,
              dpi: int = 110, log: Callable[[str], None] = print, max_runs: int | None = None) -> dict[str, Path]:
    """Write every applicable figure for the runs under ``paths`` into ``out_dir`` as PNG; returns name -> path.
    A figure whose data the runs lack is skipped with a one-line message through ``log``; every figure draws every
    run, except that ``max_runs`` limits the :data:`PER_RUN_FIGURES` to that many rows, and a line through
    ``log`` names the runs left out.  ``raw_log_ratios`` also writes the tables behind it (:data:`TABLE_FILES`)."""
    names = list(FIGURES) if figures is None else list(figures)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise ValueError(f"unknown figure {', '.join(unknown)}; valid: {', '.join(FIGURES)}")
    target = out_dir if isinstance(out_dir, OutputWriter) else writer(out_dir)  # checked before any run is read
    runs = load_runs(paths)
    for run in runs:  # a damaged sample file is refused before any figure is written
        for path in run.sample_files:
            load_samples(path)
    written: dict[str, Path] = {}
    tables: list[Path] = []  # the CSV files behind a figure (raw_log_ratios), beside its PNG
    with target.staging() as out:  # written whole, swapped in at the end: no torn or stale figure stays
        for name in names:
            try:
                fig = FIGURES[name](runs, max_runs=max_runs) if name in PER_RUN_FIGURES else FIGURES[name](runs)
            except FigureSkipped as reason:
                log(f"skipped {name}: {reason}")
                continue
            for note in getattr(fig, "offpolicylab_notes", []):
                log(note)
            fig.savefig(out / f"{name}.png", dpi=dpi, bbox_inches="tight")
            plt.close(fig)
            written[name] = target.final(out / f"{name}.png")
            for file_name, table in getattr(fig, "offpolicylab_tables", {}).items():
                table.to_csv(out / file_name, index=False)
                tables.append(target.final(out / file_name))
    for path in [*written.values(), *tables]:
        log(f"wrote {path}")
    return written


def writer(out_dir: str | Path) -> OutputWriter:
    """The output folder of plot, checked before any run is read (docs/bad_input.md)."""
    return OutputWriter(out_dir, "plot", lambda name: (name.endswith(".png") and name[:-4] in FIGURES)
                        or name in TABLE_FILES, "PNG figures and the CSV tables behind raw_log_ratios")


# ----------------------------------------------------------------------------------------------- command line
def add_plot_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Arguments of ``offpolicylab plot``: DIR [DIR ...] --out FIG_DIR [--figures NAME ...] [--dpi N]."""
    parser.add_argument("dirs", nargs="+", help="run directories, or folders containing run directories")
    parser.add_argument("--out", required=True, help="folder to write the PNG figures into")
    parser.add_argument("--figures", nargs="+", default=None, choices=list(FIGURES), help="only these figures")
    parser.add_argument("--max-runs", type=int, default=None, metavar="N",
                        help="draw at most N runs in the one-row-per-run figures (ratio_histograms, raw_log_ratios; "
                             "default: every run); a line names the runs left out")
    parser.add_argument("--dpi", type=int, default=110,
                        help=f"PNG resolution in dots per inch ({DPI_RANGE[0]} to {DPI_RANGE[1]}; default 110)")
    return parser


DPI_RANGE = (10, 600)
"""Resolutions ``--dpi`` accepts: a figure of the widest layout at 600 dpi is about 100 megapixels."""


def run_plot_command(args: argparse.Namespace) -> int:
    """RunRecord ``offpolicylab plot`` from parsed arguments; bad input (checked before any run is read: the output
    folder, the resolution) -> one line on stderr and exit code 2; a disk error while writing -> one line, exit 1."""
    try:
        if not DPI_RANGE[0] <= args.dpi <= DPI_RANGE[1]:
            raise ValueError(f"--dpi {args.dpi} is out of range; valid: an integer in [{DPI_RANGE[0]}, "
                             f"{DPI_RANGE[1]}]")
        if args.max_runs is not None and args.max_runs < 1:
            raise ValueError(f"--max-runs {args.max_runs} is out of range; valid: an integer >= 1 (omit it for "
                             "every run)")
        target = writer(args.out)
        written = plot_runs(args.dirs, target, args.figures, dpi=args.dpi, max_runs=args.max_runs)
    except ValueError as error:
        print(f"offpolicylab plot: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"offpolicylab plot: {' '.join(str(error).split())}", file=sys.stderr)
        return 1
    return 0 if written else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m offpolicylab.plots DIR [DIR ...] --out FIG_DIR``."""
    parser = add_plot_arguments(argparse.ArgumentParser(prog="offpolicylab plot", description=__doc__.split("\n")[0]))
    return run_plot_command(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
