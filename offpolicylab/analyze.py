"""``offpolicylab analyze LOG --out DIR``: our collapse detector and figures on a verl, TRL or TensorBoard log or one
of our run directories (docs/diagnosing.md).

The log is read under our metric names (:mod:`offpolicylab.logs`); the steps are fed, in order, to
:class:`~offpolicylab.diagnostics.collapse.CollapseDetector` with

    reward = reward_mean,   KL = the first of kl_k3, |kl_k1|, kl_ref the log holds,   gradient norm = grad_norm

(k1 can be negative, so its magnitude is used; a missing KL or gradient norm cannot spike); a logged loss that is
not finite is a collapse by itself, as in our trainer.  The status is
``collapsed`` when the detector fires — the smoothed reward gives back at least half of what it gained (and at least
``margin``) within ``window`` steps of a KL or gradient-norm spike, the collapse signature of "Prosperity before
Collapse" (Zheng, Zhao, Chen 2025, arXiv:2510.01161, appendix G) — or when the reward falls to a fifth of its peak
and stays there, whatever came before (:class:`~offpolicylab.diagnostics.collapse.SustainedFall`: the median of
the last 9 rewards), else ``completed``.  Any other value that is missing or
not finite at a step (``null`` in JSON, NaN, inf: an fp16 loss-scaling overflow logs an infinite gradient norm and
skips the step) counts as not logged there; the summary counts them.  Steps are the log's own (verl: training
steps; TRL: optimizer steps; ours: updates), so ``window`` and the smoothing count logged steps.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from offpolicylab.diagnostics.collapse import CollapseDetector, SustainedFall
from offpolicylab.diagnostics.warning import (
    CHOSEN_PARAMS,
    DEFAULT_DETECTOR,
    DETECTORS,
    alarms,
    make_detector,
)
from offpolicylab.logs import VALUE_LIMIT, Log, LogError, canonical, engine_of, read_log, unmapped
from offpolicylab.output import OutputWriter

REWARD = "reward_mean"
DETECTOR_KL = ("kl_k3", "kl_k1", "kl_ref")
#: figure name → the metrics it shows, one panel each (a figure is drawn when the log holds any of them)
FIGURES: dict[str, tuple[str, ...]] = {
    "reward": (REWARD, "eval_reward"),
    "spikes": ("kl_k3", "kl_k1", "kl_ref", "grad_norm"),
    "clipping": ("clip_frac", "clip_frac_low", "clip_frac_high", "dual_clip_frac", "mask_frac"),
    "ratios": ("ratio_max", "ratio_p999", "ratio_mean", "log_ratio_abs_mean", "m2", "ess"),
    "entropy": ("entropy", "response_len", "staleness_mean"),
    "mismatch": ("sampler_kl_k1", "sampler_kl_k3", "sampler_log_ratio_abs_mean", "sampler_log_ratio_abs_max",
                 "sampler_ratio_mean", "sampler_ratio_max", "sampler_ess", "sampler_chi2"),
}


@dataclass
class Trace:
    """What the detector saw and thought at each step."""

    steps: list[int] = field(default_factory=list)
    smoothed: list[float] = field(default_factory=list)
    peak: list[float] = field(default_factory=list)
    spikes: list[int] = field(default_factory=list)
    collapse_step: int | None = None
    reason: str | None = None


@dataclass
class Analysis:
    log: Log
    metrics: dict[str, dict[int, float]]
    sources: dict[str, str]
    trace: Trace
    summary: dict[str, Any]


def analyze(path: str | Path, margin: float = 0.1, window: int = 20, warning: str | None = None) -> Analysis:
    """Read the log at ``path`` and run the collapse detector and the collapse warning ``warning`` (a name of
    :data:`~offpolicylab.diagnostics.warning.DETECTORS`; None: the default) on it; nothing is written."""
    log = read_log(path)
    metrics, sources = canonical(log)
    if not log.steps:
        raise LogError(f"{log.path} holds no logged step; valid: the log of a run that trained at least one step")
    if REWARD in metrics and not any(math.isfinite(v) for v in metrics[REWARD].values()):
        raise LogError(f"{log.path} ({log.format}): {sources[REWARD]} holds no finite value within "
                       f"±{VALUE_LIMIT:g} ({len(metrics[REWARD])} logged); valid: the log of an RL run with finite "
                       "rewards")
    if REWARD not in metrics:
        names = ", ".join(sorted(plain for plain in log.series)[:6]) or "none"
        raise LogError(f"{log.path} ({log.format}) logs no reward (looked for critic/score/mean, reward, "
                       f"train/reward, reward_current, reward_mean; it has {names}, ...); valid: the log of an RL "
                       "run")
    detector = CollapseDetector(margin=margin, window=window)
    kl_name = next((name for name in DETECTOR_KL if name in metrics), None)
    trace = detect(metrics, kl_name, detector)
    summary = summarize(log, metrics, sources, trace, kl_name, detector)
    summary["warning"] = warn(metrics, kl_name, warning)
    return Analysis(log, metrics, sources, trace, summary)


def detect(metrics: dict[str, dict[int, float]], kl_name: str | None, detector: CollapseDetector) -> Trace:
    """Feed every step that logs the reward, the KL or the gradient norm to ``detector``, in step order."""
    reward, kl = metrics[REWARD], metrics.get(kl_name, {}) if kl_name else {}
    grad, loss = metrics.get("grad_norm", {}), metrics.get("loss", {})
    trace, fall = Trace(), SustainedFall(margin=detector.margin)
    for step in sorted(set(reward) | set(kl) | set(grad) | set(loss)):
        r, k, g = _finite(reward.get(step)), _finite(kl.get(step)), _finite(grad.get(step))
        broken = step in loss and not math.isfinite(loss[step])
        if r is None and k is None and g is None and not broken:
            continue
        if k is not None and kl_name == "kl_k1":
            k = abs(k)
        reason = (detector.non_finite(step) if broken else
                  detector.observe(step, r, k, detector.grad_mean if g is None else g))
        trace.steps.append(step)
        trace.smoothed.append(detector.reward_ema)
        trace.peak.append(detector.peak)
        if detector.last_spike == step:
            trace.spikes.append(step)
        if reason is None and r is not None and trace.collapse_step is None:
            reason = fall.observe(step, r)
        if reason is not None and trace.collapse_step is None:
            trace.collapse_step, trace.reason = step, reason
    return trace


def warn(metrics: dict[str, dict[int, float]], kl_name: str | None, name: str | None) -> dict[str, Any]:
    """The collapse warning ``name`` fed each logged step's metrics in order (the KL the detector reads, as
    |k1| for a k1 log, under ``kl_k3``): its onsets, the first step and reason, and the parameters used."""
    name = name or DEFAULT_DETECTOR
    params = CHOSEN_PARAMS[name]
    rows: dict[int, dict[str, float]] = {}
    for metric, series in metrics.items():
        for step, number in series.items():
            rows.setdefault(step, {})[metric] = number
    if kl_name is not None:
        for step, number in metrics[kl_name].items():
            rows[step]["kl_k3"] = abs(number) if kl_name == "kl_k1" else number
    found = alarms(make_detector(name, **params), sorted(rows.items()))
    return {"detector": name, "params": params, "steps": [step for step, _ in found],
            "first_step": found[0][0] if found else None, "reason": found[0][1] if found else None}


def summarize(log: Log, metrics: dict[str, dict[int, float]], sources: dict[str, str], trace: Trace,
              kl_name: str | None, detector: CollapseDetector) -> dict[str, Any]:
    """summary.json: status, peak / final reward and their steps, the detector's step and inputs, the mapping used."""
    rewards = [(step, value) for step, value in sorted(metrics[REWARD].items()) if math.isfinite(value)]
    peak_step, peak = max(rewards, key=lambda sv: sv[1])
    steps = log.steps
    return {
        "status": "collapsed" if trace.collapse_step is not None else "completed",
        "log": str(log.path), "format": log.format, "names": engine_of(log),
        "steps": len(steps), "first_step": steps[0], "last_step": steps[-1],
        "peak_reward": peak, "peak_reward_step": peak_step,
        "final_reward": rewards[-1][1], "final_reward_step": rewards[-1][0],
        **_evaluation(metrics),
        "collapse_step": trace.collapse_step, "collapse_reason": trace.reason,
        "detector": {
            "reward": sources[REWARD], "kl": sources.get(kl_name) if kl_name else None,
            "kl_as": kl_name, "grad_norm": sources.get("grad_norm"), "loss": sources.get("loss"), "spike_steps": trace.spikes,
            **{key: getattr(detector, key) for key in ("margin", "gain_fraction", "spike", "window", "alpha",
                                                       "warmup")},
            "sustained_fall": {"fraction": SustainedFall.fraction, "span": SustainedFall.span},
        },
        "metrics": dict(sorted(sources.items())),
        "not_finite": {name: n for name in sorted(metrics)
                       if (n := sum(not math.isfinite(v) for v in metrics[name].values()))},
        "other_metrics": unmapped(log, sources.values()),
        "notes": list(log.notes),
    }


def _evaluation(metrics: dict[str, dict[int, float]]) -> dict[str, Any]:
    """Peak and final evaluation reward (``eval_reward``: our ``eval_reward_sampled``, verl's ``val-core``, TRL's
    ``eval_reward``) and their steps, where the log holds a finite one."""
    values = [(step, value) for step, value in sorted(metrics.get("eval_reward", {}).items()) if math.isfinite(value)]
    if not values:
        return {}
    peak_step, peak = max(values, key=lambda sv: sv[1])
    return {"peak_eval_reward": peak, "peak_eval_reward_step": peak_step,
            "final_eval_reward": values[-1][1], "final_eval_reward_step": values[-1][0]}


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


# ------------------------------------------------------------------------------------------------ output
SWEEP_TABLE_FILE = "sweep_analysis.csv"
#: The columns of analyze's table over a sweep's runs (summary.json keys; a column no run has is left out).
SWEEP_COLUMNS = ("run", "status", "steps", "collapse_step", "peak_reward", "final_reward", "final_eval_reward",
                 "warning_step")


def owns(name: str) -> bool:
    """Whether ``name`` is a file analyze writes into its output folder."""
    return (name in ("summary.json", SWEEP_TABLE_FILE)
            or name.removesuffix(".png") in FIGURES and name.endswith(".png"))


def sweep_runs(path: Path) -> list[Path]:
    """The run directories of a sweep folder (or of a ``--seeds`` run's folder) ``path``: those below it when it
    holds a grid file or run directories of its own; empty for anything else (a log, a run directory)."""
    from offpolicylab.run_dir import GRID_FILE
    from offpolicylab.run_records import find_run_dirs, is_run_dir

    if not path.is_dir() or is_run_dir(path):
        return []
    if (path / GRID_FILE).is_file() or any(is_run_dir(child) for child in path.iterdir() if child.is_dir()):
        return find_run_dirs([path])
    return []


def analyze_sweep(runs: list[Path], margin: float = 0.1, window: int = 20,
                  warning: str | None = None) -> list[dict[str, Any]]:
    """One row per run of a sweep: the run (its folder below the sweep), status, steps, collapse step, peak and
    final reward, final evaluation reward and the first collapse warning — :func:`analyze` of each run."""
    rows = []
    for run in runs:
        summary = analyze(run, margin=margin, window=window, warning=warning).summary
        rows.append({"run": run.name, **{key: summary.get(key) for key in SWEEP_COLUMNS if key != "run"},
                     "warning_step": summary["warning"]["first_step"], "summary": summary})
    return rows


def write_sweep(rows: list[dict[str, Any]], out: OutputWriter) -> None:
    """summary.json ({"runs": {run: its summary}}) and :data:`SWEEP_TABLE_FILE`, swapped in whole."""
    import csv
    import io

    from offpolicylab.run_dir import write_text_atomically

    with out.staging() as folder:
        write_text_atomically(folder / "summary.json", json.dumps(
            {"runs": {row["run"]: row["summary"] for row in rows}}, indent=2) + "\n")
        text = io.StringIO()
        table = csv.DictWriter(text, fieldnames=list(SWEEP_COLUMNS), extrasaction="ignore", lineterminator="\n")
        table.writeheader()
        table.writerows(rows)
        write_text_atomically(folder / SWEEP_TABLE_FILE, text.getvalue())


def writer(out: str | Path) -> OutputWriter:
    """The output folder of analyze, checked before any work (docs/bad_input.md)."""
    return OutputWriter(out, "analyze", owns, "summary.json and figures")


def write(analysis: Analysis, out: str | Path | OutputWriter) -> dict[str, Any]:
    """The figures the log's metrics allow and summary.json, written whole into a temporary folder and swapped in
    for ``out`` (:mod:`offpolicylab.output`): no figure of an earlier analysis stays beside the new summary."""
    from offpolicylab.run_dir import write_text_atomically

    target = out if isinstance(out, OutputWriter) else writer(out)
    names = [name for name, metrics in FIGURES.items() if any(m in analysis.metrics for m in metrics)]
    with target.staging() as folder:
        figures = [draw(analysis, name, folder / f"{name}.png").name for name in names]
        summary = {**analysis.summary, "figures": figures}
        write_text_atomically(folder / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def draw(analysis: Analysis, name: str, path: Path) -> Path:
    """One figure: a panel per metric of ``FIGURES[name]`` the log holds, against the step; the detector's step
    as a red dashed line, its spikes as ticks on the KL and gradient-norm panels, the smoothed reward and its
    running peak on the reward panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [m for m in FIGURES[name] if m in analysis.metrics]
    fig, axes = plt.subplots(len(shown), 1, figsize=(7.0, 2.4 * len(shown)), sharex=True, squeeze=False)
    trace = analysis.trace
    for ax, metric in zip(axes[:, 0], shown, strict=True):
        steps = sorted(analysis.metrics[metric])
        ax.plot(steps, [analysis.metrics[metric][s] for s in steps], color="#0072B2", lw=1.2, label="logged",
                marker="." if len(steps) < 40 else None)
        ax.set_ylabel(metric)
        source = analysis.sources[metric]
        ax.set_title(metric if source == metric else f"{metric} (logged as {source})", fontsize=9, loc="left")
        if metric == REWARD:
            ax.plot(trace.steps, trace.smoothed, color="#009E73", lw=1.5, label="smoothed (detector)")
            ax.plot(trace.steps, trace.peak, color="#999999", lw=1.0, ls="--", label="running peak")
        if metric in ("grad_norm", analysis.summary["detector"]["kl_as"]):
            for index, step in enumerate(trace.spikes):
                ax.axvline(step, color="#E69F00", lw=0.8, alpha=0.7,
                           label="spike (detector)" if index == 0 else None)
        if trace.collapse_step is not None:
            ax.axvline(trace.collapse_step, color="#D55E00", lw=1.5, ls="--", label="collapse (detector)")
        for i, step in enumerate(analysis.summary["warning"]["steps"]):
            ax.axvline(step, color="#CC79A7", lw=1.2, ls=":", label="collapse warning" if i == 0 else None)
        if metric == REWARD or len(ax.get_legend_handles_labels()[0]) > 1:  # the marker lines say what they are
            ax.legend(fontsize=8, loc="best")
    axes[-1, 0].set_xlabel("update (the log's training step)")
    status = analysis.summary["status"]
    where = f" at update {trace.collapse_step}" if trace.collapse_step is not None else ""
    fig.suptitle(f"{analysis.log.path.name} ({analysis.log.format}): {status}{where}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------ command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", metavar="LOG", help="a verl FileLogger .jsonl, a TRL trainer_state.json or output "
                                                   "directory, a TensorBoard event folder, or a run directory")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for summary.json and the figures")
    parser.add_argument("--margin", type=float, default=0.1,
                        help="smallest reward drop from the peak that counts as a collapse (default 0.1)")
    parser.add_argument("--window", type=int, default=20,
                        help="steps after a KL / gradient-norm spike in which a drop counts (default 20)")
    parser.add_argument("--detector", default=DEFAULT_DETECTOR, choices=list(DETECTORS),
                        help=f"the collapse warning (docs/diagnosing.md, its measured recall and false alarms; "
                             f"default {DEFAULT_DETECTOR})")


def run_command(args: argparse.Namespace) -> int:
    if not (args.margin >= 0 and math.isfinite(args.margin)) or args.window < 0:
        raise ValueError(f"--margin {args.margin} / --window {args.window} is invalid; valid: a margin ≥ 0 and a "
                         "window ≥ 0")
    out, log_path = Path(args.out), Path(args.log)
    if str(args.out).strip() and log_path.is_dir() and out.is_dir() and out.resolve() == log_path.resolve():
        raise ValueError(f"--out {out} is the log's own folder; valid: another folder (analyze writes summary.json)")
    target = writer(out)  # checked before the log is read
    runs = sweep_runs(log_path)
    if runs:  # a sweep folder: a table over its runs
        from offpolicylab.progress import print_table

        rows = analyze_sweep(runs, margin=args.margin, window=args.window, warning=args.detector)
        write_sweep(rows, target)
        print_table(rows, SWEEP_COLUMNS)
        collapsed = sum(row["status"] == "collapsed" for row in rows)
        print(f"{len(rows)} runs, {collapsed} collapsed -> {out}/summary.json, {out}/{SWEEP_TABLE_FILE} (figures: "
              f"offpolicylab plot {args.log} --out DIR, or analyze one run)")
        return 0
    analysis = analyze(log_path, margin=args.margin, window=args.window, warning=args.detector)
    summary = write(analysis, target)
    for note in summary["notes"]:
        print(f"note: {note}")
    where = f" at step {summary['collapse_step']}" if summary["collapse_step"] is not None else ""
    evaluation = (f", final evaluation reward {summary['final_eval_reward']:.4g}" if "final_eval_reward" in summary
                  else "")
    print(f"{args.log} ({summary['format']}, {summary['steps']} steps): {summary['status']}{where}; peak reward "
          f"{summary['peak_reward']:.4g} at step {summary['peak_reward_step']}, final {summary['final_reward']:.4g}"
          f"{evaluation} -> {out}/summary.json, {', '.join(summary['figures'])}")
    warned = summary["warning"]
    if warned["first_step"] is not None:
        print(f"collapse warning ({warned['detector']}) at step {warned['first_step']}: {warned['reason']}"
              + (f" ({len(warned['steps'])} warnings in all)" if len(warned["steps"]) > 1 else ""))
    return 0
