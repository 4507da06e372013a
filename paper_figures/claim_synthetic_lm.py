"""Claims (b), (d) and (g) rerun in the calibrated synthetic-LM world (``synthetic_lm``: a small causal transformer
distilled from a random teacher, V = 256, T = 32, sparse 1 / 0.1 / 0 reward), where the toy worlds could not
collapse.

- (b) M2PO "Prosperity before Collapse": at staleness 256, GRPO without a trust region first beats ε-clipped GRPO,
  then collapses, while M2PO stays stable.  Runs: grpo ε = 0.2, grpo with ε = inf and m2po (τ = 0.04) at
  ``stale_k:256`` and grpo at the grid's staleness 0 (``stages:4``, the papers' s = 0), 3 seeds — the same cells as
  ``experiments/synthetic_lm_grid.json``.
- (d) M2PO is insensitive to τ: m2po τ ∈ {0.01, 0.04, 0.16} at ``stale_k:256``.
- (g) Mu-GRPO: in few large generation–optimisation stages (``stages:256``) the standard clip [0.8, 1.2] learns
  slowly, the relaxed clip [0, 5] faster, and the negative-advantage veto (κ = 2, suffix scope) keeps it stable.

Every run uses the world's training defaults and the experiment grid's base settings (read from the grid file, so
the claim and the experiment share one definition).  J is the Monte-Carlo evaluation mean ``eval_reward_sampled``
on the world's fixed evaluation prompts.  ``--reuse DIR`` copies finished cells of an experiment output folder with
the same names (identical configurations, so identical results) instead of re-running them.

    python paper_figures/claim_synthetic_lm.py [--small] [--reuse runs/synthetic_lm] [--claims b,d,g] [--updates N]

``--updates N`` runs every cell for N updates instead of the grid's (as ``collapse_experiment.py --updates``).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import common

from offpolicylab import plots
from offpolicylab.config import TrainConfig
from offpolicylab.grid import expand_grid, load_grid
from offpolicylab.lifecycle import resolve_config
from offpolicylab.run_dir import RunDir

EXPERIMENTS = common.ROOT.parent / "experiments"
J = "eval_reward_sampled"
CURVE_METRICS = (J, "grad_norm", "eval_kl_init_k3", "entropy")
TAUS = (0.01, 0.04, 0.16)
MU_GRPO = [
    {"label": "grpo_0.8_1.2", "objective": "grpo", "objective_params": {"eps_low": 0.2, "eps_high": 0.2}},
    {"label": "mu_grpo_0_5_noveto", "objective": "mu_grpo", "objective_params": {"nav_scope": "none"}},
    {"label": "mu_grpo_0_5_veto_suffix", "objective": "mu_grpo", "objective_params": {"nav_scope": "suffix"}},
]


def experiment_grid(small: bool) -> dict[str, Any]:
    return load_grid(EXPERIMENTS / ("synthetic_lm_grid_small.json" if small else "synthetic_lm_grid.json"))


def stale_schedule(grid: dict[str, Any]) -> str:
    """The grid's most stale ``stale_k:K`` schedule."""
    return max((s for s in grid["axes"]["schedule"] if s.startswith("stale_k:")), key=lambda s: int(s[8:]))


def fresh_schedule(grid: dict[str, Any]) -> str:
    """The grid's staleness-0 schedule (``on_policy``, or ``stages:M``: the papers' s = 0, M minibatch updates per
    rollout batch)."""
    return next(s for s in grid["axes"]["schedule"] if s == "on_policy" or s.startswith("stages:"))


def objective(grid: dict[str, Any], label: str) -> dict[str, Any]:
    return next(o for o in grid["axes"]["objective"] if isinstance(o, dict) and o.get("label") == label)


def grid_b(grid: dict[str, Any]) -> list[dict[str, Any]]:
    """ε-clipped grpo at staleness 0 and stale; grpo without trust region and m2po stale."""
    def sub(labels: tuple[str, ...], schedules: list[str]) -> dict[str, Any]:
        return {"base": grid["base"], "axes": {"objective": [objective(grid, label) for label in labels],
                                               "schedule": schedules, "seed": grid["axes"]["seed"]}}
    stale = stale_schedule(grid)
    return [sub(("grpo",), [fresh_schedule(grid), stale]), sub(("grpo_no_tr", "m2po"), [stale])]


def grid_d(grid: dict[str, Any]) -> dict[str, Any]:
    taus = [{"label": "m2po" if tau == 0.04 else f"m2po_tau{tau:g}", "objective": "m2po",
             "objective_params": {"tau": tau}} for tau in TAUS]
    return {"base": grid["base"], "axes": {"objective": taus, "schedule": [stale_schedule(grid)],
                                           "seed": grid["axes"]["seed"]}}


def grid_g(grid: dict[str, Any]) -> dict[str, Any]:
    stage = stale_schedule(grid).replace("stale_k:", "stages:")
    return {"base": grid["base"], "axes": {"objective": MU_GRPO, "schedule": [stage],
                                           "seed": grid["axes"]["seed"][:2]}}


def reuse_cells(grid: dict[str, Any], runs: Path, source: Path | None) -> list[str]:
    """Copy each finished cell of ``source`` whose name and resolved configuration match a cell of ``grid``;
    returns the names copied."""
    copied = []
    for cell in expand_grid(grid, runs) if source is not None else []:
        done, target = RunDir(source / cell.name), Path(cell.out_dir)
        summary = done.read_summary() if done.holds_run() else None
        finished = summary is not None and summary.get("status") in ("completed", "collapsed")
        if finished and not target.exists() and done.read_config() == resolve_config(TrainConfig.from_dict(cell.config)):
            shutil.copytree(done.path, target)
            copied.append(cell.name)
    return copied




def table(runs: list[plots.RunRecord]) -> common.pd.DataFrame:
    rows = []
    for run in runs:
        curve = common.curve_stats(run, threshold=1.0, column=J)
        rows.append({"label": run.label, "staleness": run.schedule, "seed": run.seed,
                     **{k: curve[k] for k in ("return_at_half", "peak", "final")},
                     "collapses": len(run.collapse_updates()),
                     "grad_norm_max": float(run.metrics["grad_norm"].max()),
                     "ratio_max": float(run.metrics["ratio_max"].max()),
                     **{m: common.metric_mean(run, m) for m in ("mask_frac", "clip_frac", "nav_frac")}})
    return common.pd.DataFrame(rows)


def claim(name: str, grids: dict[str, Any] | list[dict[str, Any]], args: Any, reuse: Path | None,
          keys: tuple[str, ...]) -> dict[str, Any]:
    out = common.claim_dir(args, f"synthetic_lm_{name}")
    grids = grids if isinstance(grids, list) else [grids]
    copied = [cell for grid in grids for cell in reuse_cells(grid, out / "runs", reuse)]
    if copied:
        print(f"reused {len(copied)} finished cells of {reuse}")
    for grid in grids:
        common.sweep(grid, out / "runs", args.workers)
    runs = common.plots.load_runs([out / "runs"])
    per_run = table(runs)
    mean = common.seed_mean(per_run)
    figure = plots.training_curves(runs, metrics=CURVE_METRICS)
    common.save_figure(figure, out / f"claim_{name}_synthetic_lm.png")
    per_run.to_csv(out / f"claim_{name}_runs.csv", index=False)
    result = common.rounded_by_cell(mean, keys)
    common.write_result(out, result, mean)
    return result


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    reuse = Path(_pop_option(argv, "--reuse")) if "--reuse" in argv else None
    chosen = _pop_option(argv, "--claims").split(",") if "--claims" in argv else ["b", "d", "g"]
    updates = int(_pop_option(argv, "--updates")) if "--updates" in argv else None
    if not chosen or set(chosen) - {"b", "d", "g"}:
        raise ValueError(f"--claims {','.join(chosen)} is invalid; valid: a comma-separated subset of b,d,g")
    args = common.parse_args(__doc__.split("\n")[0], argv)
    grid = experiment_grid(args.small)
    if updates is not None:
        grid["base"]["updates"] = updates
    if "b" in chosen:
        claim("b", grid_b(grid), args, reuse, ("return_at_half", "peak", "final", "collapses", "grad_norm_max",
                                                 "ratio_max"))
    if "d" in chosen:
        result_d = claim("d", grid_d(grid), args, reuse, ("return_at_half", "final", "mask_frac"))
        finals = [v["final"] for v in result_d.values() if "final" in v]
        print(f"(d) spread of the seed-mean final J over τ: {max(finals) - min(finals):.4f}")
    if "g" in chosen:
        claim("g", grid_g(grid), args, reuse, ("return_at_half", "peak", "final", "clip_frac", "nav_frac",
                                                 "collapses"))


def _pop_option(argv: list[str], name: str) -> str:
    """Remove ``name VALUE`` from ``argv`` and return VALUE (the shared parser does not know the option)."""
    at = argv.index(name)
    if at + 1 >= len(argv):
        raise ValueError(f"{name} needs a value")
    value = argv[at + 1]
    del argv[at:at + 2]
    return value


if __name__ == "__main__":
    main()
