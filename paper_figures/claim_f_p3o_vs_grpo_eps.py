"""Claim (f), P3O ("Trust the Batch", Fakoor et al. 2026, arXiv:2605.12380): ε-clipped GRPO is sensitive to its clip range ε ∈ {0.2, 0.4, 0.6},
while P3O, which has no ε (its ratio cap is the batch's own ESS), needs no such tuning.

Toy analogue: world ``token_mdp`` (family ``forking``), tabular policy, Adam lr 0.05, 8 prompts × 8 responses per
update, GRPO-style std-normalised advantages for both.  Settings: ``stale_k:64`` (stale data, one pass per batch),
``epochs:8`` (PPO-style: each batch is consumed by 8 consecutive updates), and the P3O paper's own kinds of
off-policy data: ``mixture:0.5`` (half of each batch's prompts answered by another policy, the frozen π_0) and two
engine mismatches at staleness 0 (on-policy schedule, temperature 1.2), whose ratios are taken against the engine's
own log-probs (``behavior_logp = sampler``, so the mismatch enters every ratio — the paper's setting):
``mismatch_T1.2_noise1`` (the engine draws from softmax(z/1.2 + ε), ε ~ N(0, 1): the FP8-rollout / high-temperature
mismatch of the paper, exaggerated so that it is visible at T = 5; fixed before any run) and ``mismatch_T1.2_fp8``
(the engine stores the table in FP8 E4M3 and computes its softmax in bf16, ``sampler_precision = fp8_e4m3``: the
rounding an FP8 engine does).  The first case was earlier run with the trainer's log-probs as behaviour, which
hid the engine from both objectives.
GRPO with symmetric ε ∈ {0.2, 0.4, 0.6} against P3O.  Measured: exact return J(π) at the middle, peak and end of
training (P3O's rise-then-fall is peak − final), mean clipped-token fraction and ESS, and for GRPO the spread
(max − min over ε) of the seed-mean returns, to set against P3O's value.

    python paper_figures/claim_f_p3o_vs_grpo_eps.py [--small]
"""

from __future__ import annotations

import common
import pandas as pd

EPSILONS = (0.2, 0.4, 0.6)
#: the engine-mismatch settings (label, config overrides)
MISMATCHES = (
    ("mismatch_T1.2_noise1", {"schedule": "on_policy", "temperature": 1.2, "behavior_logp": "sampler",
                              "policy_params": {"sampler_noise_std": 1.0}}),
    ("mismatch_T1.2_fp8", {"schedule": "on_policy", "temperature": 1.2, "behavior_logp": "sampler",
                           "policy_params": {"sampler_precision": "fp8_e4m3"}}),
)


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
                 "schedule": ["stale_k:4", "epochs:2"] if small else ["stale_k:64", "epochs:8", "mixture:0.5"],
                 "seed": [0] if small else [0, 1]},
    }


def mismatch_grid(small: bool, overrides: dict) -> dict:
    settings = grid(small)
    return {"base": {**settings["base"], **overrides},
            "axes": {"objective": settings["axes"]["objective"], "seed": settings["axes"]["seed"]}}


def main(argv: list[str] | None = None) -> None:
    args = common.parse_args(__doc__.split("\n")[0], argv)
    out = common.claim_dir(args, "f_p3o_vs_grpo_eps")
    runs = common.sweep(grid(args.small), out / "runs", args.workers)
    tables = [common.run_table(runs, ("clip_frac", "ess"))]
    for label, overrides in MISMATCHES:
        mismatch_runs = common.sweep(mismatch_grid(args.small, overrides), out / f"runs_{label}", args.workers)
        tables.append(common.run_table(mismatch_runs, ("clip_frac", "ess", "log_ratio_abs_mean")).assign(
            staleness=label))
        runs = runs + mismatch_runs
    table = pd.concat(tables, ignore_index=True)
    mean = common.seed_mean(table)
    keys = ("return_at_half", "peak", "final", "clip_frac", "ess", "log_ratio_abs_mean")
    result: dict = common.rounded_by_cell(mean, keys)
    for schedule, group in mean.groupby("staleness"):
        grpo = group[group["label"].str.startswith("grpo")]
        p3o = group[group["label"] == "p3o"].iloc[0]
        result[f"spread @ {schedule}"] = {
            **{f"grpo_{k}_max_minus_min": round(float(grpo[k].max() - grpo[k].min()), 4)
               for k in ("return_at_half", "final")},
            "p3o_peak_minus_final": round(float(p3o["peak"] - p3o["final"]), 4),
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
