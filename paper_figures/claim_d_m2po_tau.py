"""Claim (d), M2PO ("Prosperity before Collapse"): M2PO is insensitive to its second-moment budget τ — over a wide
range of τ around the default 0.04 training at high staleness reaches the same return.

Toy analogue: world ``token_mdp`` (family ``forking``), tabular policy, Adam lr 0.05, 8 prompts × 8 responses per
update, schedule ``stale_k:64`` (the high-staleness setting of claim (b)), M2PO (paper ``mask`` variant) with
τ ∈ {0.01, 0.02, 0.04, 0.08, 0.16}; ε-clipped GRPO and GRPO without a trust region on the same schedule are the
references that show how much the objective matters at all.  Measured: exact return J(π) at the middle and the end
of training, mean masked-token fraction, and the spread (max − min over τ) of the seed-mean returns.

    python paper_figures/claim_d_m2po_tau.py [--small]
"""

from __future__ import annotations

import common
from common import NO_TRUST_REGION

TAUS = (0.01, 0.02, 0.04, 0.08, 0.16)
REFERENCES = [
    {"label": "grpo_eps0.2", "objective": "grpo"},
    {"label": "grpo_no_tr", "objective": "grpo", "objective_params": NO_TRUST_REGION},
]


def objectives(small: bool) -> list[dict]:
    taus = (TAUS[0], TAUS[-1]) if small else TAUS
    return [{"label": f"m2po_tau{tau:g}", "objective": "m2po", "objective_params": {"tau": tau}} for tau in taus]


def grid(small: bool) -> dict:
    return {
        "base": {"world": "token_mdp", "world_params": {"family": "forking"}, "updates": 12 if small else 300,
                 "lr": 0.05, "eval_every": 4 if small else 10, "sample_every": 0, "checkpoint_every": 1000,
                 "schedule": "stale_k:4" if small else "stale_k:64"},
        "axes": {"objective": objectives(small) + ([] if small else REFERENCES), "seed": [0] if small else [0, 1]},
    }


def main(argv: list[str] | None = None) -> None:
    args = common.parse_args(__doc__.split("\n")[0], argv)
    out = common.claim_dir(args, "d_m2po_tau")
    runs = common.sweep(grid(args.small), out / "runs", args.workers)
    table = common.run_table(runs, ("mask_frac", "clip_frac"))
    table["tau"] = [run.config["objective_params"].get("tau") if run.objective == "m2po" else None for run in runs]
    mean = common.seed_mean(table.drop(columns="tau"))
    keys = ("return_at_half", "final", "mask_frac", "clip_frac")
    result: dict = {r["label"]: common.rounded(r, keys) for _, r in mean.iterrows()}
    m2po = mean[mean["label"].str.startswith("m2po")]
    result["m2po_spread_over_tau"] = {k: round(float(m2po[k].max() - m2po[k].min()), 4)
                                      for k in ("return_at_half", "final")}
    result["schedule"] = runs[0].schedule
    m2po_runs = table[table["tau"].notna()].astype({"tau": float})
    common.save_figure(common.point_figure(m2po_runs, "tau", {"return_at_half": "exact return at mid-training",
                                                              "final": "final exact return",
                                                              "mask_frac": "masked tokens (fraction)"},
                                           None, f"M2PO across τ at {runs[0].schedule} (dots = seeds)",
                                           log_x=True, x_label="τ (second-moment budget, nats²)"), out / "claim_d.png")
    common.save_curves_and_tables(out, "d", runs, "mask_frac", table, result, mean)


if __name__ == "__main__":
    main()
