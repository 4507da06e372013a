"""Claim (f), P3O ("Trust the Batch", Fakoor et al. 2026, arXiv:2605.12380): ε-clipped GRPO is sensitive to its clip range ε ∈ {0.2, 0.4, 0.6},
while P3O, which has no ε (its ratio cap is the batch's own ESS), needs no such tuning.

Toy analogue: world ``token_mdp`` (family ``forking``), tabular policy, Adam lr 0.05, 8 prompts × 8 responses per
update, two settings in which clipping binds: ``stale_k:64`` (stale data, one pass per batch) and ``epochs:8``
(PPO-style: each batch is consumed by 8 consecutive updates).  GRPO with symmetric ε ∈ {0.2, 0.4, 0.6} against P3O.
Measured: exact return J(π) at the middle and end of training, mean clipped-token fraction and ESS, and for GRPO
the spread (max − min over ε) of the seed-mean returns, to set against P3O's value.

    python paper_figures/claim_f_p3o_vs_grpo_eps.py [--small]
"""

from __future__ import annotations

import common

EPSILONS = (0.2, 0.4, 0.6)


def objectives(small: bool) -> list[dict]:
    epsilons = EPSILONS[:2] if small else EPSILONS
    grpo = [{"label": f"grpo_eps{eps:g}", "objective": "grpo", "objective_params": {"eps_low": eps, "eps_high": eps}}
            for eps in epsilons]
    return [*grpo, {"label": "p3o", "objective": "p3o"}]


def grid(small: bool) -> dict:
    return {
        "base": {"world": "token_mdp", "world_params": {"family": "forking"}, "updates": 12 if small else 250,
                 "lr": 0.05, "eval_every": 4 if small else 10, "sample_every": 0, "checkpoint_every": 1000},
        "axes": {"objective": objectives(small),
                 "schedule": ["stale_k:4", "epochs:2"] if small else ["stale_k:64", "epochs:8"],
                 "seed": [0] if small else [0, 1]},
    }


def main(argv: list[str] | None = None) -> None:
    args = common.parse_args(__doc__.split("\n")[0], argv)
    out = common.claim_dir(args, "f_p3o_vs_grpo_eps")
    runs = common.sweep(grid(args.small), out / "runs", args.workers)
    table = common.run_table(runs, ("clip_frac", "ess"))
    mean = common.seed_mean(table)
    keys = ("return_at_half", "final", "clip_frac", "ess")
    result: dict = common.rounded_by_cell(mean, keys)
    for schedule, group in mean.groupby("staleness"):
        grpo = group[group["label"].str.startswith("grpo")]
        p3o = group[group["label"] == "p3o"].iloc[0]
        result[f"spread @ {schedule}"] = {
            **{f"grpo_{k}_max_minus_min": round(float(grpo[k].max() - grpo[k].min()), 4)
               for k in ("return_at_half", "final")},
            **{f"p3o_minus_best_grpo_{k}": round(float(p3o[k] - grpo[k].max()), 4)
               for k in ("return_at_half", "final")},
        }
    order = [o["label"] for o in objectives(args.small)]
    common.save_figure(common.point_figure(table, "label", {"return_at_half": "exact return at mid-training",
                                                            "final": "final exact return",
                                                            "clip_frac": "clipped tokens (fraction)"},
                                           "staleness", "GRPO across ε vs P3O (dots = seeds)", order=order,
                                           x_label="objective"),
                       out / "claim_f.png")
    common.save_curves_and_tables(out, "f", runs, "clip_frac", table, result, mean)


if __name__ == "__main__":
    main()
