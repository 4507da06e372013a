"""Claim (h), REC (Yao et al. 2025, arXiv:2509.24203, "Group-Relative REINFORCE Is Secretly an Off-Policy Algorithm"): importance sampling is
not essential — REC-OneSide-NoIS matches REC-OneSide-IS — and a wide clip (ε_low, ε_high) = (0.6, 2.0) learns faster
than the standard (0.2, 0.2), under off-policy sync interval / offset settings.

Toy analogue: world ``token_mdp`` (family ``forking``), tabular policy, Adam lr 0.05, 8 prompts × 8 responses per
update, group-mean advantage r − r̄ (no std, as REC), schedules ``sync:20,0`` (sync interval 20: staleness 0 … 19)
and ``sync:10,10`` (interval 10, offset 10: staleness 10 … 19).  Objectives: ``rec`` one-side mask with (0.2, 0.2)
with and without IS, and NoIS with (0.6, 2.0).  Measured: exact return J(π) at the middle and end of training,
updates until J ≥ 0.9 (speed) and mean masked-token fraction.

    python paper_figures/claim_h_rec.py [--small]
"""

from __future__ import annotations

import common

OBJECTIVES = [
    {"label": "rec_oneside_nois", "objective": "rec", "objective_params": {"mask": "one_side"}},
    {"label": "rec_oneside_is", "objective": "rec",
     "objective_params": {"mask": "one_side", "importance_sampling": True}},
    {"label": "rec_oneside_nois_wide", "objective": "rec",
     "objective_params": {"mask": "one_side", "eps_low": 0.6, "eps_high": 2.0}},
]


def grid(small: bool) -> dict:
    return {
        "base": {"world": "token_mdp", "world_params": {"family": "forking"}, "updates": 12 if small else 200,
                 "lr": 0.05, "eval_every": 4 if small else 5, "sample_every": 0, "checkpoint_every": 1000},
        "axes": {"objective": OBJECTIVES, "schedule": ["sync:4,2"] if small else ["sync:20,0", "sync:10,10"],
                 "seed": [0] if small else [0, 1]},
    }


def main(argv: list[str] | None = None) -> None:
    args = common.parse_args(__doc__.split("\n")[0], argv)
    out = common.claim_dir(args, "h_rec")
    runs = common.sweep(grid(args.small), out / "runs", args.workers)
    table = common.run_table(runs, ("mask_frac",))
    mean = common.seed_mean(table)
    keys = ("return_at_half", "final", "updates_to_threshold", "mask_frac")
    result: dict = common.rounded_by_cell(mean, keys)
    result["threshold"] = 0.9
    for schedule, group in mean.groupby("staleness"):
        row = group.set_index("label")
        result[f"contrasts @ {schedule}"] = {
            f"is_minus_nois_{k}": round(float(row.loc["rec_oneside_is", k] - row.loc["rec_oneside_nois", k]), 4)
            for k in ("return_at_half", "final")
        } | {f"wide_minus_standard_{k}": round(float(row.loc["rec_oneside_nois_wide", k]
                                                      - row.loc["rec_oneside_nois", k]), 4)
             for k in ("return_at_half", "updates_to_threshold") if not row[k].isna().any()}
    order = [o["label"] for o in OBJECTIVES]
    common.save_figure(common.point_figure(table, "label", {"return_at_half": "exact return at mid-training",
                                                            "updates_to_threshold": "updates until J ≥ 0.9",
                                                            "mask_frac": "masked tokens (fraction)"},
                                           "staleness", "REC: IS vs NoIS, clip (0.2, 0.2) vs (0.6, 2.0) (dots = seeds)",
                                           order=order, x_label="objective (REC one-side mask)"), out / "claim_h.png")
    common.save_curves_and_tables(out, "h", runs, "mask_frac", table, result, mean)


if __name__ == "__main__":
    main()
