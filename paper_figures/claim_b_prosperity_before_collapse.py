"""Claim (b), M2PO "Prosperity before Collapse": at staleness 256, GRPO without a trust region first beats
ε-clipped GRPO, then collapses, while M2PO stays stable.

Toy analogue: world ``token_mdp`` (family ``forking``: a near-deterministic prior on filler tokens, uniform on two
decision tokens; V = 4, T = 5, 8 prompts), tabular policy, Adam lr 0.05, 8 prompts × 8 responses per update,
schedules ``on_policy``, ``stale_k:64`` (at this scale the policy reaches the optimum in ~100 on-policy
updates) and the paper's ``stale_k:256`` (here the first 256 of the 300 updates all consume data of the initial
policy).  Measured: exact return J(π) by enumeration, its peak and final
value, and collapse events from the trainer's detector.

    python paper_figures/claim_b_prosperity_before_collapse.py [--small]
"""

from __future__ import annotations

import common
from common import NO_TRUST_REGION

from offpolicylab import plots

STALE = "stale_k:64"
PAPER_STALE = "stale_k:256"
OBJECTIVES = [
    {"label": "grpo_eps0.2", "objective": "grpo"},
    {"label": "grpo_no_tr", "objective": "grpo", "objective_params": NO_TRUST_REGION},
    {"label": "m2po", "objective": "m2po"},
]


def grid(small: bool) -> dict:
    return {
        "base": {"world": "token_mdp", "world_params": {"family": "forking"}, "updates": 12 if small else 300,
                 "lr": 0.05, "eval_every": 4 if small else 10, "sample_every": 4 if small else 25,
                 "checkpoint_every": 1000},
        "axes": {"objective": OBJECTIVES,
                 "schedule": ["on_policy", "stale_k:4"] if small else ["on_policy", STALE, PAPER_STALE],
                 "seed": [0] if small else [0, 1]},
    }


def runs_for(args) -> tuple[list[plots.RunRecord], object]:
    """The shared (b)/(c) runs (a completed cell is not re-run)."""
    out = common.claim_dir(args, "b_prosperity_before_collapse")
    return common.sweep(grid(args.small), out / "runs", args.workers), out


def main(argv: list[str] | None = None) -> None:
    args = common.parse_args(__doc__.split("\n")[0], argv)
    runs, out = runs_for(args)
    rows = []
    for run in runs:
        curve = run.metrics[["update", "exact_return"]].dropna()
        peak = curve.loc[curve["exact_return"].idxmax()]
        half = curve[curve["update"] <= curve["update"].max() / 2]["exact_return"].iloc[-1]
        rows.append({"label": run.label, "staleness": run.schedule, "seed": run.seed,
                     "return_at_half": float(half), "peak": float(peak["exact_return"]),
                     "peak_update": int(peak["update"]), "final": float(curve["exact_return"].iloc[-1]),
                     "collapses": len(run.collapse_updates())})
    table = common.pd.DataFrame(rows)
    mean = table.groupby(["label", "staleness"], as_index=False).mean(numeric_only=True).drop(columns="seed")
    common.save_figure(plots.training_curves(runs), out / "claim_b.png")
    common.save_figure(plots.return_heatmap(runs), out / "claim_b_heatmap.png")
    table.to_csv(out / "claim_b_runs.csv", index=False)
    common.write_result(out, {f"{r['label']} @ {r['staleness']}": {k: round(float(r[k]), 4) for k in
                                                             ("return_at_half", "peak", "final", "collapses")}
                              for _, r in mean.iterrows()}, mean)


if __name__ == "__main__":
    main()
