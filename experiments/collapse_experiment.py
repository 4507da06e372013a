"""The staleness-collapse experiment: objectives × staleness × seeds, a Markdown table and the source papers' three
criteria evaluated mechanically.

    python experiments/collapse_experiment.py experiments/synthetic_lm_grid.json --out runs/synthetic_lm --workers 2
    python experiments/collapse_experiment.py experiments/synthetic_lm_grid_small.json --out runs/sl_small --workers 1
    python experiments/collapse_experiment.py GRID --out DIR --table-only     # the table of an existing --out

Runs the grid on the sweep's local engine (completed cells are skipped, interrupted ones resumed; the cells the
criteria read run first, so that a time-boxed run yields the verdict), measures the wall time, then writes ``DIR/table.md`` (the tables and the verdict), ``DIR/runs.csv`` (one row per
run) and ``DIR/criteria.json``.  J is the exact return where the world can enumerate its responses, else the
Monte-Carlo evaluation mean ``eval_reward_sampled`` (with its standard error ``eval_reward_se``).

Per run: J₀ = the first evaluated J, peak = max J, final = the last evaluated J, gain = peak − J₀; the collapse
detector's verdict (:mod:`offpolicylab.diagnostics.collapse`); and the mechanism: the largest per-update token
ratio max and 99.9th percentile, the median and largest pre-clip gradient norm, the token entropy over the first and
last 10 % of updates, the final and largest sampled KL(π‖π₀) (k3, nats per token).

The criteria (M2PO: Zheng et al. 2025, "Prosperity before Collapse"), with s_high the grid's largest staleness and
n seeds (a majority = ⌈2n/3⌉, i.e. 2 of 3), fixed before any grid ran:

(a1) ``grpo_no_tr`` at s_high prospers and collapses.  Prospers in a seed: at the update u* of its peak its J
     exceeds ε-clipped ``grpo``'s J at u* (same seed, same stale data) by more than 2·√(SE₁² + SE₂²).  Collapses in
     a seed: gain > 2·SE(peak), final ≤ peak − ½·gain, and the detector flagged the run (a reward drop within
     ``collapse_window`` updates of a KL or gradient-norm spike).  Both in a majority of seeds.
(a2) ``m2po`` at s_high ends within 5 % of on-policy ``grpo``: mean final ≥ 0.95 × on-policy mean final.
(a3) ``grpo`` (ε-clipped) at s_high ends below ``m2po`` at s_high: mean final lower.
(a) holds when (a1), (a2) and (a3) all hold.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python experiments/collapse_experiment.py` from a checkout
    sys.path.insert(0, str(ROOT))

from offpolicylab import plots  # noqa: E402
from offpolicylab.grid import Cell, expand_grid, load_grid  # noqa: E402
from offpolicylab.run_dir import write_grid, write_sweep_results  # noqa: E402
from offpolicylab.run_records import read_grid  # noqa: E402
from offpolicylab.sweep import get_engine, result_row  # noqa: E402

CLIPPED, NO_TRUST_REGION, M2PO = "grpo", "grpo_no_tr", "m2po"
ON_POLICY_LABELS = (CLIPPED, f"{CLIPPED}_on_policy")  # the on-policy reference; a grid whose base schedule is stale
# gives its on-policy grpo cell the second label (the two would otherwise share a cell name)
MAJORITY = 2 / 3
M2PO_TOLERANCE = 0.05
EDGE_SHARE = 0.1  # first / last share of updates whose entropy is averaged
FINISHED = ("completed", "collapsed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grid", help="grid JSON file (experiments/*.json)")
    parser.add_argument("--out", required=True, type=Path, help="output folder, one run directory per cell")
    parser.add_argument("--workers", type=int, default=2, help="parallel processes (default 2)")
    parser.add_argument("--table-only", action="store_true", help="only build the tables of an existing --out")
    parser.add_argument("--small", action="store_true", help="run the grid shrunk to CI size (small_grid: a tiny "
                                                                 "world, 12 updates, 2 seeds, staleness 6)")
    parser.add_argument("--updates", type=int, default=None, help="run every cell for this many updates instead "
                                                                   "of the grid's")
    parser.add_argument("--only", action="append", default=[], metavar="AXIS=LABEL[,LABEL][;AXIS=...]",
                        help="run only the cells matching this filter (repeatable: a cell matching any runs)")
    parser.add_argument("--csv", type=Path, default=None, help="also write one row per run here (objective, "
                                                              "staleness, seed, J0, peak_J, ..., mask_frac_mean)")
    args = parser.parse_args(argv)
    if not args.table_only:
        start = time.perf_counter()
        grid = small_grid(load_grid(args.grid)) if args.small else load_grid(args.grid)
        if args.updates is not None:
            grid["base"]["updates"] = args.updates
        prepare_worlds(grid, args.out)
        rows = run_in_priority_order(grid, args.out, args.workers, [parse_filter(f) for f in args.only])
        wall = time.perf_counter() - start
        failed = sum(row["status"] == "failed" for row in rows)
        line = f"sweep: {len(rows)} cells, {failed} failed, wall {wall:.0f} s with {args.workers} workers"
        print(line)
        with open(args.out / "wall_times.txt", "a") as fh:
            fh.write(line + "\n")
    report = build_report(args.out, args.csv)
    print(report)
    return 0


SMALL_BASE = {
    "world_params": {"preset": "seed_scale", "vocab_size": 32, "response_len": 8, "num_keys": 8,
                     "num_train_prompts": 32, "d_model": 16, "num_layers": 1, "num_heads": 2, "distill_steps": 30,
                     "distill_batch": 16},
    "updates": 12, "prompts_per_update": 4, "group_size": 4, "eval_every": 4, "eval_samples": 2, "sample_every": 0,
    "checkpoint_every": 100, "lr": 0.003,
}
SMALL_STALENESS = 6
SMALL_SEEDS = 2


def small_grid(grid: dict[str, Any]) -> dict[str, Any]:
    """The same objectives and schedule forms at CI size: the base takes :data:`SMALL_BASE` (a tiny recipe-v5
    synthetic LM, 12 updates of 4 prompts × 4), every ``stale_k:K`` becomes ``stale_k:6`` (labels kept), and the first two
    seeds run."""
    small = json.loads(json.dumps(grid))
    small["base"] = {**small.get("base", {}), **json.loads(json.dumps(SMALL_BASE))}
    axes = small.setdefault("axes", {})

    def shrink(value: Any) -> Any:
        if isinstance(value, dict) and str(value.get("schedule", "")).startswith("stale_k:"):
            return {**value, "schedule": f"stale_k:{SMALL_STALENESS}"}
        if isinstance(value, str) and value.startswith("stale_k:"):
            return f"stale_k:{SMALL_STALENESS}"
        return value

    if "schedule" in axes:
        axes["schedule"] = [shrink(v) for v in axes["schedule"]]
    if "seed" in axes:
        axes["seed"] = axes["seed"][:SMALL_SEEDS]
    return small


def priority(cell: Cell, high: int) -> int:
    """0 for the cells the criteria read (on-policy grpo; grpo, grpo_no_tr and m2po at s_high), 1 for the other
    objectives at s_high, 2 for the other stale cells, 3 for the on-policy cells of the other objectives (with one
    update per batch their gradients equal grpo's): a time-boxed run yields the verdict first."""
    label, staleness = cell.labels.get("objective"), _schedule_staleness(cell.config.get("schedule", "on_policy"))
    if ((label in ON_POLICY_LABELS and staleness == 0) or (label in (CLIPPED, NO_TRUST_REGION, M2PO)
                                                         and staleness == high)):
        return 0
    if staleness == high:
        return 1
    return 2 if staleness > 0 else 3


def parse_filter(text: str) -> dict[str, set[str]]:
    """``"schedule=stale_k:256;objective=grpo,m2po"`` → {axis: allowed labels} (a cell matches when each named
    axis's label is one of the allowed ones; labels as in the cell directory names' unescaped form)."""
    out: dict[str, set[str]] = {}
    for part in filter(None, text.split(";")):
        axis, sep, labels = part.partition("=")
        if not sep or not labels:
            raise ValueError(f"--only {text!r} is invalid; valid: AXIS=LABEL[,LABEL][;AXIS=LABEL...]")
        out[axis.strip()] = {label.strip() for label in labels.split(",")}
    return out


def matches(cell: Cell, filters: list[dict[str, set[str]]]) -> bool:
    """Whether ``cell`` matches one of ``filters`` (every cell when there is none).  A schedule filter reads the
    cell's schedule string, other axes their label."""
    def value(axis: str) -> str:
        return str(cell.config.get("schedule")) if axis == "schedule" else cell.labels.get(axis, "")

    return not filters or any(all(value(axis) in allowed for axis, allowed in f.items()) for f in filters)


def run_in_priority_order(grid: dict[str, Any], out: Path, workers: int,
                          filters: list[dict[str, set[str]]] | None = None) -> list[dict[str, Any]]:
    """:func:`offpolicylab.sweep.run_sweep` with the cells ordered by :func:`priority` (stable within a class), only
    the cells matching ``filters`` (:func:`matches`); writes ``grid.json`` and ``sweep_results.csv`` in the grid's
    own cell order."""
    cells = [cell for cell in expand_grid(grid, out) if matches(cell, filters or [])]
    high = max(_schedule_staleness(c.config.get("schedule", "on_policy")) for c in cells)
    order = sorted(range(len(cells)), key=lambda i: priority(cells[i], high))
    write_grid(out, grid)
    summaries = get_engine("local")([cells[i] for i in order], workers, False)
    by_cell = dict(zip(order, summaries, strict=True))
    rows = [result_row(cell, by_cell[i]) for i, cell in enumerate(cells)]
    write_sweep_results(out, rows)
    return rows


def _schedule_staleness(schedule: str) -> int:
    """The nominal staleness s of a schedule as the papers name it: 0 for ``on_policy`` and for ``stages:M`` /
    ``sync:M,0`` (M minibatch updates per rollout batch: the M2PO paper's s = 0 takes 4, staleness 0–3), K for
    ``stale_k:K``."""
    name, _, arg = schedule.partition(":")
    if name == "on_policy" or name == "stages" or (name == "sync" and arg.split(",")[-1] == "0"):
        return 0
    if name == "stale_k":
        return int(arg)
    raise ValueError(f"schedule {schedule!r} has no nominal staleness; valid: on_policy, stages:M, sync:M,0, "
                     f"stale_k:K")


def prepare_worlds(grid: dict[str, Any], out: Path) -> None:
    """Build each distinct world of the grid once before the workers start, so that a world that caches what it
    builds (``synthetic_lm`` distils π₀ on first use) is built by one process, not by every worker at once."""
    from offpolicylab import worlds

    seen = set()
    for cell in expand_grid(grid, out):
        key = json.dumps([cell.config.get("world"), cell.config.get("world_params", {})], sort_keys=True)
        if key not in seen:
            seen.add(key)
            worlds.make_world(cell.config.get("world", "token_mdp"), **cell.config.get("world_params", {}))


# ============================================================================================ per run
def j_column(run: plots.RunRecord) -> str:
    """``exact_return`` when the run recorded it, else the Monte-Carlo ``eval_reward_sampled``."""
    if "exact_return" in run.metrics and run.metrics["exact_return"].notna().any():
        return "exact_return"
    return "eval_reward_sampled"


def j_curve(run: plots.RunRecord) -> pd.DataFrame:
    """Evaluated updates with columns update, J and se (0 for an exact return)."""
    column = j_column(run)
    curve = run.metrics[["update", column]].dropna().rename(columns={column: "J"})
    se = run.metrics.loc[curve.index, "eval_reward_se"] if column != "exact_return" and \
        "eval_reward_se" in run.metrics else 0.0
    return curve.assign(se=se).reset_index(drop=True)


def staleness_of(run: plots.RunRecord) -> int:
    """The run's nominal staleness (:func:`_schedule_staleness`)."""
    return _schedule_staleness(run.schedule)


def run_stats(run: plots.RunRecord) -> dict[str, Any]:
    """J₀, peak (and its update and SE), final (and SE), gain, collapse verdict and the mechanism numbers."""
    curve = j_curve(run)
    if curve.empty:
        raise ValueError(f"run {run.path} has no evaluated J")
    top = int(curve["J"].to_numpy().argmax())
    metrics = run.metrics
    edge = max(1, math.ceil(EDGE_SHARE * len(metrics)))
    collapse = (run.summary or {}).get("collapse_update", -1)
    kl_column = "eval_kl_init_k3" if "eval_kl_init_k3" in metrics else "exact_kl_init"
    kl = metrics[kl_column].dropna() if kl_column in metrics else pd.Series(dtype=float)
    return {
        "label": run.label, "staleness": staleness_of(run), "seed": run.seed,
        "status": (run.summary or {}).get("status", "unfinished"), "updates": int(metrics["update"].max()) + 1,
        "J0": float(curve["J"].iloc[0]), "peak": float(curve["J"].iloc[top]), "peak_update": int(curve["update"].iloc[top]),
        "peak_se": float(curve["se"].iloc[top]), "final": float(curve["J"].iloc[-1]),
        "final_se": float(curve["se"].iloc[-1]), "gain": float(curve["J"].iloc[top] - curve["J"].iloc[0]),
        "collapse_update": int(collapse) if collapse not in (None, "", -1) else -1,
        "ratio_max": _max(metrics, "ratio_max"), "ratio_p999": _max(metrics, "ratio_p999"),
        "grad_norm_median": float(metrics["grad_norm"].median()), "grad_norm_max": _max(metrics, "grad_norm"),
        "entropy_start": _mean(metrics["entropy"].head(edge)) if "entropy" in metrics else math.nan,
        "entropy_end": _mean(metrics["entropy"].tail(edge)) if "entropy" in metrics else math.nan,
        "kl_init_final": float(kl.iloc[-1]) if len(kl) else math.nan,
        "kl_init_max": float(kl.max()) if len(kl) else math.nan,
        "clip_frac_mean": _mean(metrics["clip_frac"]) if "clip_frac" in metrics else math.nan,
        "mask_frac_mean": _mean(metrics["mask_frac"]) if "mask_frac" in metrics else math.nan,
    }


def load_stats(out: Path) -> tuple[pd.DataFrame, dict[tuple[str, int, int], pd.DataFrame]]:
    """Per-run statistics of every run under ``out`` and the J curves keyed by (label, staleness, seed)."""
    runs = plots.load_runs([out])
    table = pd.DataFrame([run_stats(run) for run in runs])
    curves = {(run.label, staleness_of(run), run.seed): j_curve(run) for run in runs}
    order = {label: i for i, label in enumerate(dict.fromkeys(_grid_labels(out) or table["label"]))}
    table["order"] = table["label"].map(order).fillna(len(order))
    table = table.sort_values(["order", "staleness", "seed"]).drop(columns="order").reset_index(drop=True)
    return table, curves


# ============================================================================================ per cell
def cell_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (label, staleness): mean and sd over the finished seeds of peak and final J, the mean final SE,
    collapsed seeds, the median over seeds of each mechanism number, and how many runs are unfinished (left out of
    every aggregate)."""
    finished = runs["status"].isin(FINISHED)
    keys = list(dict.fromkeys(zip(runs["label"], runs["staleness"], strict=True)))
    grouped = runs[finished].groupby(["label", "staleness"], sort=False)
    table = grouped.agg(
        seeds=("seed", "size"), peak_mean=("peak", "mean"), peak_sd=("peak", "std"), final_mean=("final", "mean"),
        final_sd=("final", "std"), final_se=("final_se", "mean"), J0=("J0", "mean"),
        collapsed=("collapse_update", lambda c: int((c >= 0).sum())),
        ratio_max=("ratio_max", "median"), ratio_p999=("ratio_p999", "median"),
        grad_norm_median=("grad_norm_median", "median"), grad_norm_max=("grad_norm_max", "median"),
        entropy_start=("entropy_start", "median"), entropy_end=("entropy_end", "median"),
        kl_init_final=("kl_init_final", "median"), kl_init_max=("kl_init_max", "median"),
    ).reindex(pd.MultiIndex.from_tuples(keys, names=["label", "staleness"]))
    table["seeds"] = table["seeds"].fillna(0).astype(int)
    table["collapsed"] = table["collapsed"].fillna(0).astype(int)
    table["unfinished"] = runs[~finished].groupby(["label", "staleness"]).size().reindex(table.index).fillna(0) \
        .astype(int)
    return table.reset_index()


# ============================================================================================ criteria
def criteria(runs: pd.DataFrame, curves: dict[tuple[str, int, int], pd.DataFrame]) -> dict[str, Any]:
    """(a1), (a2), (a3) and (a) of the module docstring, each with the numbers it was decided on; a criterion whose
    runs are missing from the grid is ``None``."""
    high = int(runs["staleness"].max())
    final = runs.groupby(["label", "staleness"])["final"].mean().to_dict()
    out: dict[str, Any] = {"s_high": high}
    out["a1"] = _prosperity_then_collapse(runs, curves, high)
    on_policy = next((final[(label, 0)] for label in ON_POLICY_LABELS if (label, 0) in final), None)
    m2po, clipped = final.get((M2PO, high)), final.get((CLIPPED, high))
    out["a2"] = None if on_policy is None or m2po is None else {
        "m2po_final": m2po, "on_policy_grpo_final": on_policy, "ratio": m2po / on_policy if on_policy else math.nan,
        "holds": bool(m2po >= (1 - M2PO_TOLERANCE) * on_policy)}
    out["a3"] = None if m2po is None or clipped is None else {
        "grpo_final": clipped, "m2po_final": m2po, "holds": bool(clipped < m2po)}
    parts = [out[k] for k in ("a1", "a2", "a3")]
    out["a"] = None if any(p is None for p in parts) else all(p["holds"] for p in parts)
    return out


def _prosperity_then_collapse(runs: pd.DataFrame, curves: dict[tuple[str, int, int], pd.DataFrame],
                              high: int) -> dict[str, Any] | None:
    free = runs[(runs["label"] == NO_TRUST_REGION) & (runs["staleness"] == high)]
    if free.empty or not ((runs["label"] == CLIPPED) & (runs["staleness"] == high)).any():
        return None
    seeds = []
    for _, row in free.iterrows():
        clipped = curves.get((CLIPPED, high, int(row["seed"])))
        at_peak = clipped[clipped["update"] <= row["peak_update"]].iloc[-1] if clipped is not None else None
        margin = 2 * math.hypot(row["peak_se"], at_peak["se"]) if at_peak is not None else math.nan
        lead = row["peak"] - at_peak["J"] if at_peak is not None else math.nan
        real_gain = row["gain"] > 2 * row["peak_se"]
        fell = row["final"] <= row["peak"] - 0.5 * row["gain"]
        seeds.append({"seed": int(row["seed"]), "peak_update": int(row["peak_update"]), "lead_over_clipped": lead,
                      "lead_margin": margin, "prospers": bool(lead > margin), "gain": row["gain"],
                      "fell_half_gain": bool(real_gain and fell), "detector_flag": int(row["collapse_update"]),
                      "collapses": bool(real_gain and fell and row["collapse_update"] >= 0)})
    need = math.ceil(MAJORITY * len(seeds) - 1e-9)
    prospered = sum(s["prospers"] for s in seeds)
    collapsed = sum(s["collapses"] for s in seeds)
    return {"seeds": seeds, "needed": need, "prospered": prospered, "collapsed": collapsed,
            "holds": bool(prospered >= need and collapsed >= need)}


# ============================================================================================ Markdown
GRID_CSV_COLUMNS = ("objective", "staleness", "seed", "J0", "peak_J", "peak_update", "final_J", "final_se",
                    "collapsed", "clip_frac_mean", "mask_frac_mean")


def grid_csv(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run with :data:`GRID_CSV_COLUMNS`: the grid label, nominal staleness, seed, first / peak (and its
    update) / final evaluated J, the final J's standard error, whether the collapse detector flagged the run, and the
    mean over updates of the objective's clip and mask fractions (empty where the objective reports none)."""
    table = runs.rename(columns={"label": "objective", "peak": "peak_J", "final": "final_J"})
    table["collapsed"] = table["collapse_update"] >= 0
    return table[list(GRID_CSV_COLUMNS)]


def build_report(out: Path, csv_path: Path | None = None) -> str:
    """Write table.md, runs.csv and criteria.json under ``out`` (and the per-run :func:`grid_csv` at ``csv_path``);
    returns the Markdown."""
    runs, curves = load_stats(out)
    if csv_path is not None:
        csv_path.parent.mkdir(parents=True, exist_ok=True)
        grid_csv(runs).to_csv(csv_path, index=False)
    cells = cell_table(runs)
    verdict = criteria(runs[runs["status"].isin(FINISHED)], curves)
    runs.to_csv(out / "runs.csv", index=False)
    (out / "criteria.json").write_text(json.dumps(_jsonable(verdict), indent=2) + "\n")
    text = "\n\n".join([results_markdown(cells), mechanism_markdown(cells), criteria_markdown(verdict)]) + "\n"
    (out / "table.md").write_text(text)
    return text


def results_markdown(cells: pd.DataFrame) -> str:
    lines = ["| objective | staleness | seeds | J₀ | peak J | final J | final SE | collapsed |", "|" + "---|" * 8]
    for _, c in cells.iterrows():
        unfinished = f" (+{c['unfinished']} unfinished)" if c["unfinished"] else ""
        lines.append(f"| {c['label']} | {c['staleness']} | {c['seeds']}{unfinished} | {_fmt(c['J0'])} "
                     f"| {_pm(c['peak_mean'], c['peak_sd'])} | {_pm(c['final_mean'], c['final_sd'])} "
                     f"| {_fmt(c['final_se'])} | {c['collapsed']}/{c['seeds']} |")
    return "\n".join(lines)


def mechanism_markdown(cells: pd.DataFrame) -> str:
    lines = ["| objective | staleness | ratio max | ratio p99.9 | grad norm median / max | entropy first → last 10 % "
             "| KL(π‖π₀) final / max |", "|" + "---|" * 7]
    for _, c in cells.iterrows():
        lines.append(f"| {c['label']} | {c['staleness']} | {_sci(c['ratio_max'])} | {_sci(c['ratio_p999'])} "
                     f"| {_sci(c['grad_norm_median'])} / {_sci(c['grad_norm_max'])} "
                     f"| {_fmt(c['entropy_start'])} → {_fmt(c['entropy_end'])} "
                     f"| {_fmt(c['kl_init_final'])} / {_fmt(c['kl_init_max'])} |")
    return "\n".join(lines)


def criteria_markdown(verdict: dict[str, Any]) -> str:
    high = verdict["s_high"]
    lines = [f"Criteria at s_high = {high}:"]
    a1 = verdict["a1"]
    if a1 is None:
        lines.append(f"- (a1) n/a: the grid lacks {NO_TRUST_REGION} or {CLIPPED} at s = {high}")
    else:
        per_seed = "; ".join(
            f"seed {s['seed']}: peak at u={s['peak_update']}, lead over ε-clip {_fmt(s['lead_over_clipped'])} "
            f"(needs > {_fmt(s['lead_margin'])}), fell ≥ ½ gain {'yes' if s['fell_half_gain'] else 'no'}, "
            f"detector {'u=' + str(s['detector_flag']) if s['detector_flag'] >= 0 else 'no flag'}"
            for s in a1["seeds"])
        lines.append(f"- (a1) {_yes(a1['holds'])}: {NO_TRUST_REGION} prospered in {a1['prospered']} and collapsed "
                     f"in {a1['collapsed']} of {len(a1['seeds'])} seeds (needs {a1['needed']} each). {per_seed}")
    a2, a3 = verdict["a2"], verdict["a3"]
    lines.append("- (a2) n/a" if a2 is None else
                 f"- (a2) {_yes(a2['holds'])}: m2po final {_fmt(a2['m2po_final'])} vs on-policy grpo "
                 f"{_fmt(a2['on_policy_grpo_final'])} (ratio {_fmt(a2['ratio'])}, needs ≥ {1 - M2PO_TOLERANCE:.2f})")
    lines.append("- (a3) n/a" if a3 is None else
                 f"- (a3) {_yes(a3['holds'])}: grpo ε = 0.2 final {_fmt(a3['grpo_final'])} vs m2po "
                 f"{_fmt(a3['m2po_final'])}")
    lines.append("- (a) " + ("n/a" if verdict["a"] is None else _yes(verdict["a"])))
    return "\n".join(lines)


# ============================================================================================ helpers
def _grid_labels(out: Path) -> list[str]:
    """Objective labels in the order of the grid file the sweep saved (empty when there is none)."""
    grid = read_grid(out)
    values = [] if grid is None else grid.get("axes", {}).get("objective", [])
    return [v.get("label", v.get("objective")) if isinstance(v, dict) else str(v) for v in values]


def _max(metrics: pd.DataFrame, column: str) -> float:
    return float(metrics[column].max()) if column in metrics and metrics[column].notna().any() else math.nan


def _mean(values: pd.Series) -> float:
    return float(values.mean()) if values.notna().any() else math.nan


def _fmt(value: float, digits: int = 3) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _pm(mean: float, sd: float) -> str:
    return f"{_fmt(mean)} ± {_fmt(sd)}" if not math.isnan(sd) else _fmt(mean)


def _sci(value: float) -> str:
    if math.isnan(value):
        return "—"
    return f"{value:.3g}" if 1e-2 <= abs(value) < 1e4 else f"{value:.1e}"


def _yes(holds: bool) -> str:
    return "**holds**" if holds else "**does not hold**"


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(value) else str(float(value))
    if isinstance(value, np.integer):
        return int(value)
    return value


if __name__ == "__main__":
    sys.exit(main())
