"""Claim (a), REC (Yao et al. 2025, arXiv:2509.24203): on the 3-arm pitfall (r = [0, 0.8, 1], fixed data from π_b = [0.3, 0.6, 0.1]) plain
REINFORCE without importance sampling converges to the 0.8 arm; which of REC, OPMD, AsymRE, RED-Weight (and GRPO
without a trust region) reach the optimal arm?

Toy analogue: world ``three_arm_pitfall``, schedule ``offline`` (every batch freshly sampled from the frozen π_b),
tabular softmax policy started at π_b, one group of G responses per update, Adam.  Measured: the exact return
J(π) = Σ_a π(a) r_a at the end (0.8 = the pitfall arm, 1.0 = the optimum).

    python paper_figures/claim_a_three_arm_pitfall.py [--small]
"""

from __future__ import annotations

import common
import numpy as np
from common import NO_TRUST_REGION

from offpolicylab import plots

OBJECTIVES = [
    {"label": "reinforce", "objective": "reinforce"},
    {"label": "grpo_eps0.2", "objective": "grpo"},
    {"label": "grpo_eps_inf", "objective": "grpo", "objective_params": NO_TRUST_REGION},
    {"label": "rec_oneside_nois", "objective": "rec", "objective_params": {"mask": "one_side"}},
    {"label": "rec_oneside_is", "objective": "rec",
     "objective_params": {"mask": "one_side", "importance_sampling": True}},
    {"label": "rec_twoside_is", "objective": "rec",
     "objective_params": {"mask": "two_side", "importance_sampling": True}},
    {"label": "rec_ring_nois", "objective": "rec", "objective_params": {"mask": "ring"}},
    {"label": "opmd", "objective": "opmd"},
    {"label": "asymre", "objective": "asymre"},
    {"label": "red_weight", "objective": "red_weight"},
    {"label": "red_drop", "objective": "red_drop"},
]


def grid(small: bool) -> dict:
    objectives = OBJECTIVES[:3] if small else OBJECTIVES
    return {
        "base": {"world": "three_arm_pitfall", "schedule": "offline", "updates": 20 if small else 300,
                 "prompts_per_update": 1, "group_size": 64, "lr": 0.1, "eval_every": 5 if small else 10,
                 "sample_every": 10 if small else 50, "checkpoint_every": 1000},
        "axes": {"objective": objectives, "seed": [0] if small else [0, 1]},
    }


def main(argv: list[str] | None = None) -> None:
    args = common.parse_args(__doc__.split("\n")[0], argv)
    out = common.claim_dir(args, "a_three_arm_pitfall")
    runs = common.sweep(grid(args.small), out / "runs", args.workers)
    table = common.last_values(runs, "exact_return")
    summary = table.groupby("label", as_index=False)["exact_return"].agg(["mean", "min", "max"]).reset_index()
    summary = summary.rename(columns={"mean": "final_exact_return", "min": "seed_min", "max": "seed_max"})
    summary["converged_to"] = np.where(summary["final_exact_return"] > 0.95, "optimal arm (1.0)",
                                       np.where(summary["final_exact_return"].between(0.75, 0.85),
                                                "pitfall arm (0.8)", "elsewhere"))
    summary.to_csv(out / "claim_a.csv", index=False)
    common.save_figure(plots.training_curves(runs, metrics=("exact_return",)), out / "claim_a_curves.png")
    common.save_figure(bar_figure(runs, summary), out / "claim_a.png")
    common.write_result(out, {row["label"]: round(row["final_exact_return"], 4) for _, row in summary.iterrows()})


def bar_figure(runs: list[plots.Run], summary) -> plots.Figure:
    objective_of = {r.label: r.objective for r in runs}
    plots._setup()
    fig, ax = plots.plt.subplots(figsize=(7.5, 0.35 * len(summary) + 1.5))
    ordered = summary.sort_values("final_exact_return")
    colors = [plots.objective_color(objective_of[label]) for label in ordered["label"]]
    ax.barh(ordered["label"], ordered["final_exact_return"], color=colors,
            xerr=[ordered["final_exact_return"] - ordered["seed_min"], ordered["seed_max"] - ordered["final_exact_return"]])
    for x, text in ((0.8, "pitfall arm"), (1.0, "optimum")):
        ax.axvline(x, color="grey", ls="--", lw=1)
        ax.text(x, len(ordered) - 0.4, text, ha="center", fontsize="small")
    ax.set_xlim(0.0, 1.05)
    ax.set_xlabel("final exact return J(π) (expected reward)")
    ax.set_title("3-arm pitfall: fixed π_b = [0.3, 0.6, 0.1] data, r = [0, 0.8, 1]")
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    main()
