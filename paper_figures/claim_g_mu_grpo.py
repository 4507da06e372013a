"""Claim (g), Mu-GRPO (Tian, Xie, Wei 2026, arXiv:2605.17570): with a few large generation–optimization stages (µ updates per stage), the
standard clip [0.8, 1.2] learns slowly, the relaxed clip [0, 5] learns faster, and the negative-advantage veto keeps
the relaxed clip safe; the veto scopes (trigger tokens, the non-trigger suffix H_κ, post-trigger suffix, whole
response) are compared.

Toy analogue: world ``token_mdp`` (family ``forking``), tabular policy, Adam lr 0.05, 8 prompts × 8 responses per
update, schedules ``stages:16`` and ``stages:64`` (staleness 0 … µ − 1 inside a stage).  Objectives: GRPO with
[0.8, 1.2]; ``mu_grpo`` with the relaxed range [0, 5] and no veto (``nav_scope = none``); ``mu_grpo`` with the veto
(κ = 2, our choice: the paper's κ is not public) at scopes ``trigger``, ``nontrigger_suffix`` (the paper's H_κ),
``suffix`` and ``response``.  Measured: exact
return J(π) at the middle and end of training, updates until J ≥ 0.9, mean clipped fraction and mean vetoed-token
fraction ``nav_frac``.

    python paper_figures/claim_g_mu_grpo.py [--small]
"""

from __future__ import annotations

import common

SCOPES = ("trigger", "nontrigger_suffix", "suffix", "response")


def objectives(small: bool) -> list[dict]:
    scopes = SCOPES[2:3] if small else SCOPES
    return [
        {"label": "grpo_0.8_1.2", "objective": "grpo", "objective_params": {"eps_low": 0.2, "eps_high": 0.2}},
        {"label": "mu_grpo_0_5_noveto", "objective": "mu_grpo", "objective_params": {"nav_scope": "none"}},
        *[{"label": f"mu_grpo_0_5_veto_{scope}", "objective": "mu_grpo", "objective_params": {"nav_scope": scope}}
          for scope in scopes],
    ]


def grid(small: bool) -> dict:
    return {
        "base": {"world": "token_mdp", "world_params": {"family": "forking"}, "updates": 12 if small else 256,
                 "lr": 0.05, "eval_every": 4 if small else 8, "sample_every": 0, "checkpoint_every": 1000},
        "axes": {"objective": objectives(small),
                 "schedule": ["stages:4"] if small else ["stages:16", "stages:64"],
                 "seed": [0] if small else [0, 1]},
    }


def main(argv: list[str] | None = None) -> None:
    args = common.parse_args(__doc__.split("\n")[0], argv)
    out = common.claim_dir(args, "g_mu_grpo")
    runs = common.sweep(grid(args.small), out / "runs", args.workers)
    table = common.run_table(runs, ("clip_frac", "nav_frac", "nav_response_frac"))
    mean = common.seed_mean(table)
    keys = ("return_at_half", "final", "updates_to_threshold", "clip_frac", "nav_frac", "nav_response_frac")
    result: dict = common.rounded_by_cell(mean, keys)
    result["threshold"] = 0.9
    order = [o["label"] for o in objectives(args.small)]
    common.save_figure(common.point_figure(table, "label", {"return_at_half": "exact return at mid-training",
                                                            "final": "final exact return",
                                                            "nav_frac": "vetoed tokens (fraction)"},
                                           "staleness", "Mu-GRPO: clip range and veto scope (dots = seeds)",
                                           order=order, x_label="objective (clip range, veto scope)"), out / "claim_g.png")
    vetoed = [r for r in runs if r.objective == "mu_grpo"]
    try:
        common.save_figure(common.plots.veto_fraction(vetoed), out / "claim_g_veto.png")
    except common.plots.FigureSkipped as reason:
        print(f"veto figure skipped: {reason}")
    common.save_curves_and_tables(out, "g", runs, "clip_frac", table, result, mean)


if __name__ == "__main__":
    main()
