"""Which mismatch correction survives (experiments/corrections_survival.md, RESULTS.md §5.3): the table.

    python experiments/corrections_survival.py table runs/corrections_survival runs/corrections_survival_ref \
        runs/corrections_survival_id --csv experiments/results/corrections_survival.csv

One row per run directory in the CSV (setting, arm, seed, J at update 0 / peak / final, whether it fell, and the
run means of the correction's and the objective's per-update metrics); printed, one row per (setting, arm): seed
mean ± standard error (sd/√n) of final and peak J, Δ final against ``none_trainer`` of the same setting (mean ± SE
of the per-seed differences), the runs that fell, and the seed means of

    corr_ess             Kish ESS (Σf)² / (n Σf²) of the correction's factor f = w · keep (Kong 1992; verl's
                         health floor 0.3)
    corr_drop_frac       share of tokens the correction dropped (f = 0); corr_seq_drop_frac: of responses
    corr_trunc_frac      share of kept tokens a cap or clamp changed (offpolicylab.objectives.base.correction_metrics)
    clip_frac            share of tokens the ε-clip of π_θ/π_b silenced (PPO's clip, Schulman et al. 2017,
                         arXiv:1707.06347)
    sampler_log_ratio_abs_mean   mean |log π_b − log π_sampler| (0 when π_b is the sampler's)

``identity`` prints, for the pairs the design predicts to train alike (OpenRLHF / AReaL vs slime, TRL vs verl, SkyRL
vs none at bf16), whether their metrics.csv agree bit for bit (timings aside) and, if not, the first update where
they differ.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd

#: "Fell": the final evaluation return is below the run's peak by more than this (prediction p9).
FALL = 0.05
METRICS = ("corr_ess", "corr_drop_frac", "corr_seq_drop_frac", "corr_trunc_frac", "corr_weight_mean", "clip_frac",
           "sampler_log_ratio_abs_mean", "grad_norm", "entropy")
#: Each engine's arm is its correction as recommended when enabled (docs/corrections.md, "Default run vs recommended
#: setting"): only TRL's default run applies it too; a default run of the others corrects nothing.
ENGINES = ("verl", "trl", "openrlhf", "slime", "skyrl", "areal")
ARMS = ("none_trainer", "none_sampler", *(f"{engine}_recommended" for engine in ENGINES), "skyrl_kept_denominator")
#: The arms' labels in run directories written before the rename (plain engine names) → their labels now.  The old
#: ``skyrl`` runs divided the loss by the kept tokens only (verl's denominator, not SkyRL's): ``skyrl_kept_denominator``.
RENAMED = {engine: f"{engine}_recommended" for engine in ENGINES} | {"skyrl": "skyrl_kept_denominator"}
SETTINGS = ("fp32-s0", "bf16-s0", "fp8_e4m3-s0", "fp8_e4m3-s16")


def cells(folders: list[str]) -> pd.DataFrame:
    """One row per finished run directory under ``folders`` (grid cell names seed=S__setting=X__correction=Y)."""
    rows = []
    for folder in folders:
        for run in sorted(Path(folder).iterdir()) if Path(folder).is_dir() else []:
            summary = run / "summary.json"
            if not (run / "metrics.csv").exists() or not summary.exists():
                continue
            labels = dict(part.split("=", 1) for part in run.name.split("__"))
            metrics = pd.read_csv(run / "metrics.csv")
            evals = metrics[["update", "eval_reward_sampled"]].dropna()
            status = json.loads(summary.read_text()).get("status", "?")
            arm = RENAMED.get(labels["correction"], labels["correction"])
            row = {"setting": labels["setting"], "arm": arm, "seed": int(labels["seed"]),
                   "status": status, "updates": int(metrics["update"].max()) + 1,
                   "J0": float(evals["eval_reward_sampled"].iloc[0]),
                   "peak": float(evals["eval_reward_sampled"].max()),
                   "final": float(evals["eval_reward_sampled"].iloc[-1]),
                   "final_se": float(metrics["eval_reward_se"].dropna().iloc[-1]),
                   "run": str(run)}
            row["fell"] = bool(row["peak"] - row["final"] > FALL)
            for name in METRICS:
                row[name] = float(metrics[name].mean()) if name in metrics else math.nan
            rows.append(row)
    return pd.DataFrame(rows)


def _mean_se(values: pd.Series) -> tuple[float, float]:
    values = values.dropna()
    if len(values) == 0:
        return math.nan, math.nan
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else math.nan


def table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (setting, arm): seed mean ± SE of final / peak J, Δ final vs none_trainer (paired by seed), runs
    that fell, the metrics' seed means."""
    out = []
    for setting in [s for s in SETTINGS if s in set(frame["setting"])]:
        here = frame[frame["setting"] == setting]
        base = here[here["arm"] == "none_trainer"].set_index("seed")["final"]
        for arm in [a for a in ARMS if a in set(here["arm"])]:
            group = here[here["arm"] == arm].sort_values("seed")
            final, final_se = _mean_se(group["final"])
            peak, peak_se = _mean_se(group["peak"])
            paired = group.set_index("seed")["final"] - base.reindex(group["seed"]).to_numpy()
            delta, delta_se = _mean_se(paired)
            row = {"setting": setting, "arm": arm, "seeds": len(group), "J0": group["J0"].mean(),
                   "final": final, "final_se": final_se, "peak": peak, "peak_se": peak_se,
                   "delta_final": delta if arm != "none_trainer" else math.nan, "delta_se": delta_se,
                   "fell": int(group["fell"].sum()), "finals": " / ".join(f"{v:.3f}" for v in group["final"])}
            for name in METRICS:
                row[name] = group[name].mean()
            out.append(row)
    return pd.DataFrame(out)


def markdown(summary: pd.DataFrame) -> str:
    def pm(mean: float, se: float) -> str:
        if math.isnan(mean):
            return "—"
        return f"{mean:.3f}" + ("" if math.isnan(se) else f" ± {se:.3f}")

    def num(value: float, digits: int = 3) -> str:
        return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}g}"

    lines = ["| setting | arm | seeds | final J | peak J | Δ final vs none_trainer | fell | corr ESS | tokens "
             "dropped | responses dropped | capped | PPO clip | \\|log r\\| | seeds' final J |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row in summary.to_dict("records"):
        lines.append(f"| {row['setting']} | {row['arm']} | {row['seeds']} | {pm(row['final'], row['final_se'])} | "
                     f"{pm(row['peak'], row['peak_se'])} | {pm(row['delta_final'], row['delta_se'])} | {row['fell']} | "
                     f"{num(row['corr_ess'])} | {num(row['corr_drop_frac'])} | {num(row['corr_seq_drop_frac'])} | "
                     f"{num(row['corr_trunc_frac'])} | {num(row['clip_frac'])} | "
                     f"{num(row['sampler_log_ratio_abs_mean'])} | {row['finals']} |")
    return "\n".join(lines)


#: (setting, arm, arm it is predicted to train like) — prediction p1: the token TIS defaults everywhere, the
#: sequence weights and SkyRL's mask at bf16 (where no response ratio reaches a bound).
PAIRS = ([(s, f"{a}_recommended", "slime_recommended") for s in SETTINGS for a in ("openrlhf", "areal")]
         + [("bf16-s0", "trl_recommended", "verl_recommended"), ("bf16-s0", "skyrl_recommended", "none_trainer")])


def identity(frame: pd.DataFrame) -> list[str]:
    """For each predicted pair present at seed 0 (and every seed both ran): identical metrics.csv (timings aside),
    or the first update that differs and the final J of each."""
    lines = []
    for setting, arm, other in PAIRS:
        for seed in sorted(set(frame["seed"])):
            pick = frame[(frame["setting"] == setting) & (frame["seed"] == seed)].set_index("arm")
            if arm not in pick.index or other not in pick.index:
                continue
            a = pd.read_csv(Path(pick.loc[arm, "run"]) / "metrics.csv")
            b = pd.read_csv(Path(pick.loc[other, "run"]) / "metrics.csv")
            columns = [c for c in a.columns if c in b.columns and not c.startswith("time") and not c.startswith("corr")]
            same = (a[columns].fillna(-999.0) == b[columns].fillna(-999.0)).all(axis=1)
            verdict = ("identical" if bool(same.all()) else
                       f"differ from update {int(a['update'][~same].iloc[0])}")
            lines.append(f"{setting} seed {seed}: {arm} vs {other}: {verdict} (final J {pick.loc[arm, 'final']:.3f} "
                         f"vs {pick.loc[other, 'final']:.3f})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("table", help="the table from run folders")
    t.add_argument("folders", nargs="+")
    t.add_argument("--csv", help="write one row per run here")
    args = parser.parse_args()
    frame = cells(args.folders)
    if args.csv:
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
        frame.drop(columns=["run"]).sort_values(["setting", "arm", "seed"]).to_csv(args.csv, index=False,
                                                                                  float_format="%.6g")
    print(markdown(table(frame)))
    print()
    print("\n".join(identity(frame)))


if __name__ == "__main__":
    main()
