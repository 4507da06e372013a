"""The collapse-warning benchmark (design: experiments/collapse_benchmark.md): build it from run directories, score
every detector of :mod:`offpolicylab.diagnostics.warning` on it.

    python experiments/collapse_benchmark.py build --out experiments/collapse_benchmark \\
        --source gppo_v5=runs/slm_v5 --source smollm2=runs/collapse_benchmark --source toy=runs/staleness_grid
    python experiments/collapse_benchmark.py score experiments/collapse_benchmark [--markdown]
    python experiments/collapse_benchmark.py synthetic experiments/collapse_benchmark   # relabel the generated runs


``build`` writes ``labels.csv`` (one row per run: id, source, split, updates, falls, fall_update, J₀, peak, final)
and ``series.csv.gz`` (the detector-visible columns of every real run, per update); the generated histories are
regenerated from their seeds (:data:`SYNTHETIC`: ``warning.synthetic_history`` and the KL-led
``warning.synthetic_kl_history``), so only their labels are stored.  ``synthetic`` rewrites their labels in an
existing benchmark folder, keeping the real runs' rows.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from offpolicylab.diagnostics.warning import (  # noqa: E402
    DETECTORS,
    PARAMETER_GRIDS,
    Score,
    alarms,
    fall_update,
    make_detector,
    score_run,
    synthetic_history,
    synthetic_kl_history,
)

VISIBLE = ("reward_mean", "kl_k3", "grad_norm", "ess", "ratio_mean", "ratio_max", "clip_frac", "entropy",
           "response_len")
SYNTHETIC_RUNS = 200
#: the generated families: source name → history generator (each SYNTHETIC_RUNS seeds)
SYNTHETIC = {"synthetic": synthetic_history, "synthetic_kl": synthetic_kl_history}
FALSE_ALARM_CAP = 0.5  # per 1000 updates


def split_of(run_id: str) -> str:
    """``held_out`` when int(sha256(id), 16) % 3 == 0, else ``train``."""
    return "held_out" if int(hashlib.sha256(run_id.encode()).hexdigest(), 16) % 3 == 0 else "train"


def read_run(directory: Path) -> tuple[list[tuple[int, dict[str, float]]], list[tuple[int, float]]]:
    """(detector-visible rows, evaluations (u, J)) of one run directory; J = exact_return, else eval_reward_sampled."""
    with open(directory / "metrics.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    judge = "exact_return" if table and "exact_return" in table[0] else "eval_reward_sampled"
    rows, evaluations = [], []
    for raw in table:
        update = int(raw["update"])
        rows.append((update, {k: float(raw[k]) for k in VISIBLE if raw.get(k) not in (None, "")}))
        if raw.get(judge) not in (None, ""):
            evaluations.append((update, float(raw[judge])))
    return rows, evaluations


def build(out: Path, sources: dict[str, Path]) -> None:
    """labels.csv and series.csv.gz under ``out`` from every finished run directory of ``sources``, plus the
    synthetic histories' labels."""
    out.mkdir(parents=True, exist_ok=True)
    labels = []
    with gzip.open(out / "series.csv.gz", "wt", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "update", *VISIBLE])
        for source, folder in sources.items():
            for metrics in sorted(folder.glob("*/metrics.csv")):
                run_id = f"{source}/{metrics.parent.name}"
                if not (metrics.parent / "summary.json").exists():  # unfinished: its label is not known yet
                    print(f"skipped (unfinished): {run_id}", file=sys.stderr)
                    continue
                rows, evaluations = read_run(metrics.parent)
                for update, row in rows:
                    writer.writerow([run_id, update, *(f"{row[k]:.6g}" if k in row else "" for k in VISIBLE)])
                labels.append(label_row(run_id, source, rows, evaluations))
    write_labels(out, labels + synthetic_labels())


def synthetic_labels() -> list[dict[str, Any]]:
    """The label rows of every generated history (:data:`SYNTHETIC`)."""
    labels = []
    for source, generate in SYNTHETIC.items():
        for seed in range(SYNTHETIC_RUNS):
            history = generate(seed)
            labels.append(label_row(f"{source}/seed={seed}", source, history["rows"], history["evaluations"]))
    return labels


def write_labels(out: Path, labels: list[dict[str, Any]]) -> None:
    with open(out / "labels.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(labels[0]))
        writer.writeheader()
        writer.writerows(labels)
    print(f"{len(labels)} runs ({sum(int(r['falls']) for r in labels)} fall) -> {out}", file=sys.stderr)


def relabel_synthetic(out: Path) -> None:
    """labels.csv with the real runs' rows kept and the generated histories' rows made again."""
    with open(out / "labels.csv", newline="") as fh:
        real = [row for row in csv.DictReader(fh) if row["source"] not in SYNTHETIC]
    write_labels(out, real + synthetic_labels())


def label_row(run_id: str, source: str, rows: list, evaluations: list[tuple[int, float]]) -> dict[str, Any]:
    fall = fall_update(evaluations)
    values = [j for _, j in evaluations]
    return {"id": run_id, "source": source, "split": split_of(run_id), "updates": len(rows),
            "falls": int(fall is not None), "fall_update": "" if fall is None else fall,
            "j0": f"{values[0]:.4g}" if values else "", "peak": f"{max(values):.4g}" if values else "",
            "final": f"{values[-1]:.4g}" if values else ""}


def load(folder: Path) -> list[dict[str, Any]]:
    """Every run of the benchmark: its label fields plus ``rows`` [(u, row)]."""
    with open(folder / "labels.csv", newline="") as fh:
        labels = list(csv.DictReader(fh))
    series: dict[str, list] = defaultdict(list)
    with gzip.open(folder / "series.csv.gz", "rt", newline="") as fh:
        for raw in csv.DictReader(fh):
            series[raw["id"]].append((int(raw["update"]), {k: float(raw[k]) for k in VISIBLE if raw[k] != ""}))
    runs = []
    for label in labels:
        if label["source"] in SYNTHETIC:
            rows = SYNTHETIC[label["source"]](int(label["id"].split("=")[1]))["rows"]
        else:
            rows = series[label["id"]]
        fall = int(label["fall_update"]) if label["fall_update"] else None
        runs.append({**label, "rows": rows, "fall": fall})
    return runs


def evaluate(name: str, params: dict[str, Any], runs: list[dict[str, Any]]) -> Score:
    score = Score()
    for run in runs:
        onsets = [u for u, _ in alarms(make_detector(name, **params), run["rows"])]
        score_run(onsets, [u for u, _ in run["rows"]], run["fall"], score)
    return score


def better(a: Score, b: Score | None) -> bool:
    """The choice rule: recall under the false-alarm cap, then longer median lead, then fewer false alarms."""
    if b is None:
        return True
    a_ok, b_ok = a.false_per_1000 <= FALSE_ALARM_CAP, b.false_per_1000 <= FALSE_ALARM_CAP
    if a_ok != b_ok:
        return a_ok
    if not a_ok:
        return a.false_per_1000 < b.false_per_1000
    return rank(a) > rank(b)


def rank(s: Score) -> tuple[float, float, float]:
    """(recall, median lead, − false alarms): larger is better."""
    return s.recall, -math.inf if math.isnan(s.median_lead) else s.median_lead, -s.false_per_1000


def score(folder: Path) -> list[dict[str, Any]]:
    """Tune each detector on the training split, then score it on both splits; the table rows."""
    runs = load(folder)
    train = [r for r in runs if r["split"] == "train"]
    held = [r for r in runs if r["split"] == "held_out"]
    table = []
    for name in DETECTORS:
        best, best_params = None, None
        for params in PARAMETER_GRIDS[name]:
            result = evaluate(name, params, train)
            if better(result, best):
                best, best_params = result, params
        held_score = evaluate(name, best_params, held)
        per_source = {}
        for source in sorted({r["source"] for r in held}):
            s = evaluate(name, best_params, [r for r in held if r["source"] == source])
            per_source[source] = f"{s.detected}/{s.falls}, {s.false_per_1000:.2f}"
        real = evaluate(name, best_params, [r for r in runs if r["source"] not in SYNTHETIC])
        table.append({"detector": name, "params": best_params, "train": summary(best), "held_out": summary(held_score),
                      "held_out_by_source": per_source, "real": summary(real), "real_leads": real.leads})
    return table


def summary(s: Score) -> dict[str, Any]:
    return {"falls": s.falls, "detected": s.detected, "recall": round(s.recall, 3) if s.falls else None,
            "false_alarms_per_1000": round(s.false_per_1000, 3), "median_lead": s.median_lead,
            "scored_updates": s.scored_updates}


def markdown(table: list[dict[str, Any]]) -> str:
    lines = ["| detector | parameters (chosen on train) | held-out recall | false alarms / 1000 updates | median lead "
             "(updates) | train recall / false alarms | real falls (both splits): recall / false alarms |",
             "|---|---|---|---|---|---|---|"]
    for row in table:
        h, t = row["held_out"], row["train"]
        params = ", ".join(f"{k}={v}" for k, v in row["params"].items()) or "defaults"
        lines.append(f"| `{row['detector']}` | {params} | {h['detected']}/{h['falls']} | "
                     f"{h['false_alarms_per_1000']:.2f} | {h['median_lead']:.0f} | "
                     f"{t['detected']}/{t['falls']} / {t['false_alarms_per_1000']:.2f} | "
                     f"{row['real']['detected']}/{row['real']['falls']} / {row['real']['false_alarms_per_1000']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", required=True, type=Path)
    b.add_argument("--source", action="append", default=[], help="NAME=DIR of run directories")
    g = sub.add_parser("synthetic")
    g.add_argument("folder", type=Path)
    s = sub.add_parser("score")
    s.add_argument("folder", type=Path)
    s.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "build":
        build(args.out, {k: Path(v) for k, v in (item.split("=", 1) for item in args.source)})
    elif args.command == "synthetic":
        relabel_synthetic(args.folder)
    else:
        table = score(args.folder)
        print(markdown(table) if args.markdown else json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
