"""Claim (a), REC (Yao et al. 2025, arXiv:2509.24203): on the 3-arm pitfall (r = [0, 0.8, 1], fixed data from π_b = [0.3, 0.6, 0.1]) plain
REINFORCE without importance sampling converges to the 0.8 arm; which of REC, OPMD, AsymRE, RED-Weight (and GRPO
without a trust region) reach the optimal arm?

The paper's dynamics are plain gradient steps on the expected (K → ∞) gradient.  Two measurements:

1. **expected-gradient dynamics** (the paper's): 300 steps θ ← θ − lr·E_{a~π_b}[∇L], the expectation enumerated
   exactly (``world.exact_gradient``, each objective with its own advantage estimator), with SGD lr 1 and, separately,
   Adam lr 0.1 — Adam's per-coordinate step normalisation is not part of the paper's analysis;
2. **sampled training**: world ``three_arm_pitfall``, schedule ``offline`` (every batch freshly sampled from the
   frozen π_b), tabular softmax policy started at π_b, one group of 64 responses per update, 300 updates, SGD lr 1
   without gradient clipping (the paper's dynamics) and Adam lr 0.1 (the previous default, for the Adam effect).

Measured: the exact return J(π) = Σ_a π(a) r_a at the end (0.8 = the pitfall arm, 1.0 = the optimum).

    python paper_figures/claim_a_three_arm_pitfall.py [--small]
"""

from __future__ import annotations

import common
import numpy as np
import pandas as pd
import torch
from common import NO_TRUST_REGION

from offpolicylab import plots
from offpolicylab.objectives import get_objective

#: label -> (optimizer, lr, grad_clip) of the sampled runs and of the expected-gradient dynamics
OPTIMIZERS = {"sgd": ("sgd", 1.0, float("inf")), "adam": ("adam", 0.1, 1.0)}

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


def grid(small: bool, optimizer: str) -> dict:
    objectives = OBJECTIVES[:3] if small else OBJECTIVES
    name, lr, grad_clip = OPTIMIZERS[optimizer]
    return {
        "base": {"world": "three_arm_pitfall", "schedule": "offline", "updates": 20 if small else 300,
                 "prompts_per_update": 1, "group_size": 64, "optimizer": name, "lr": lr, "grad_clip": grad_clip,
                 "eval_every": 5 if small else 10, "sample_every": 10 if small else 50, "checkpoint_every": 1000},
        "axes": {"objective": objectives, "seed": [0] if small else [0, 1]},
    }


def expected_gradient_return(objective: str, params: dict, optimizer: str, steps: int) -> float:
    """J(π) after ``steps`` optimizer steps on the exact expected gradient E_{a~π_b}[∇_θ L] from θ = log π_b."""
    from offpolicylab.policies.tabular import TabularSoftmaxPolicy
    from offpolicylab.worlds.bandits import three_arm_pitfall

    world = three_arm_pitfall()
    policy = TabularSoftmaxPolicy.from_probs(world.behavior_probs.double())
    loss = get_objective(objective, **params)
    theta = list(policy.trainable_parameters())
    name, lr, _ = OPTIMIZERS[optimizer]
    step = torch.optim.SGD(theta, lr=lr) if name == "sgd" else torch.optim.Adam(theta, lr=lr)
    for _ in range(steps):
        gradient = world.exact_gradient(policy, loss, normalize_std=loss.advantage == "std")
        theta[0].grad = gradient.reshape(theta[0].shape).to(theta[0].dtype)
        step.step()
    return float(world.exact_return(policy))


def summarise(runs: list[plots.RunRecord]) -> pd.DataFrame:
    table = common.last_values(runs, "exact_return")
    summary = table.groupby("label", as_index=False)["exact_return"].agg(["mean", "min", "max"]).reset_index()
    summary = summary.rename(columns={"mean": "final_exact_return", "min": "seed_min", "max": "seed_max"})
    summary["converged_to"] = np.where(summary["final_exact_return"] > 0.95, "optimal arm (1.0)",
                                       np.where(summary["final_exact_return"].between(0.75, 0.85),
                                                "pitfall arm (0.8)", "elsewhere"))
    return summary


def main(argv: list[str] | None = None) -> None:
    args = common.parse_args(__doc__.split("\n")[0], argv)
    out = common.claim_dir(args, "a_three_arm_pitfall")
    steps = 20 if args.small else 300
    objectives = OBJECTIVES[:3] if args.small else OBJECTIVES
    result: dict = {"advantage": {o["label"]: get_objective(o["objective"], **o.get("objective_params", {})).advantage
                                  for o in objectives}}
    # RED-Drop drops samples of a finite group; a single-action expectation has no such group, so it is left out
    result["expected_gradient"] = {
        optimizer: {o["label"]: round(expected_gradient_return(o["objective"], o.get("objective_params", {}),
                                                               optimizer, steps), 4)
                    for o in objectives if o["objective"] != "red_drop"}
        for optimizer in OPTIMIZERS}
    tables = []
    for optimizer in OPTIMIZERS:
        runs = common.sweep(grid(args.small, optimizer), out / f"runs_{optimizer}", args.workers)
        summary = summarise(runs)
        result[f"sampled_{optimizer}"] = {row["label"]: round(row["final_exact_return"], 4)
                                          for _, row in summary.iterrows()}
        tables.append(summary.assign(optimizer=optimizer))
        common.save_figure(plots.training_curves(runs, metrics=("exact_return",)),
                           out / f"claim_a_curves_{optimizer}.png")
        if optimizer == "sgd":
            common.save_figure(bar_figure(runs, summary), out / "claim_a.png")
    pd.concat(tables).to_csv(out / "claim_a.csv", index=False)
    common.write_result(out, result)


def bar_figure(runs: list[plots.RunRecord], summary) -> plots.Figure:
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
    ax.set_title("3-arm pitfall, SGD: fixed π_b = [0.3, 0.6, 0.1] data, r = [0, 0.8, 1]")
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    main()
