"""``offpolicylab demo``: the staleness demo's runs, its progress and its figure (the command line only parses and
dispatches here).

``synthetic_lm`` (the default): ε-clipped grpo (ε = 0.2) and m2po (τ = 0.04) at staleness 256, with on-policy grpo
(ε = 0.2) as the reference the README's claim is about ("m2po keeps pace with on-policy"), seeds 0–2, on three
worker processes (nine runs of one length end together on two cores), tokens drawn by inverse CDF (one uniform per
token: the transformer's faster draw), evaluated every 25 updates, no batch sampled for the collapse detector alone
once a stale queue has drained.
``token_mdp``: grpo (ε = 0.2), grpo without a trust region and m2po at staleness K, and on-policy grpo as the
reference, on a 4-prompt token MDP (tabular policy, exact return; seconds).  K is 32, or a quarter of a shorter run
(``--updates 20``: K = 5), so that every stale run also trains on stale data of its own policy, not only on π₀'s.

What a user sees: at once, what runs, how long it should take and what the stale runs train on; then the sweep's
progress with an ETA every few seconds (:class:`offpolicylab.progress.SweepProgress`); at the end a table of each
run's summary (the names of ``summary.json`` and ``sweep_results.csv``, docs/metrics.md) and ``demo.png``: one line
per configuration (objective with its parameters × schedule), the mean over seeds with a ± 1 sd band kept within the
seeds' range, the on-policy reference dashed, the collapse detector's flags as ✕ — drawn from the runs this demo
wrote, never from other runs in ``--out``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from offpolicylab.config import TrainConfig

DEMO_STALENESS = {"token_mdp": 32, "synthetic_lm": 256}
#: the synthetic-LM recipe the demo runs when ``--preset`` is not given: recipe v5, for speed (the world's default,
#: recipe v7, costs several times more per update: benchmarks/README.md)
DEMO_PRESET = "seed_scale"
DEMO_WORLDS = tuple(DEMO_STALENESS)
#: updates per run when ``--updates`` is not given
DEMO_UPDATES = {"token_mdp": 128, "synthetic_lm": 350}
#: worker processes when ``--workers`` is not given: the LM demo's nine runs as three rounds of three
DEMO_WORKERS = 3
#: the return a figure shows, in order of preference, with its axis label
RETURNS = {"exact_return": "exact return J(π)", "eval_reward_sampled": "evaluation return (Monte Carlo)"}
#: the columns of the table printed at the end (summary.json names; a column no run has is left out)
TABLE_COLUMNS = ("cell", "status", "peak_exact_return", "final_exact_return", "peak_eval_reward_sampled",
                 "final_eval_reward_sampled", "peak_reward", "final_reward", "collapse_update")
#: how the figure's legend writes an objective parameter
PARAM_SYMBOLS = {"eps": "ε", "tau": "τ"}


# ============================================================================================ the grid
def demo_grid(updates: int | None = None, world: str = "synthetic_lm",
              world_params: dict[str, Any] | None = None) -> dict[str, Any]:
    """The demo's runs.  ``synthetic_lm``: ε-clipped grpo (ε = 0.2) and m2po (τ = 0.04) at staleness 256 and
    on-policy ε-clipped grpo, seeds 0–2, 350 updates, evaluated every 25 updates (15 points), on recipe
    :data:`DEMO_PRESET` unless ``world_params`` names another preset, with its transformer π₀ and training
    defaults (the seeds' drift: grpo clips ≈ 1 % of the tokens at s = 256, as in the
    M2PO paper) and its Monte-Carlo return, tokens drawn by inverse CDF (``token_draw=inverse_cdf``: one uniform per
    token), the collapse detector watching every update (``collapse_tail`` on, as in every run) — the clip removes the tokens that moved, the answer tokens where learning happens, and ε-clipped grpo gains a
    fraction of what m2po gains (``experiments/RESULTS.md`` §4).
    ``token_mdp``: grpo (ε = 0.2), grpo without trust region and m2po at staleness :func:`toy_staleness` and
    on-policy grpo (ε = 0.2) as the reference (on-policy the three objectives coincide: ratio 1, nothing to clip or
    mask), on a 4-prompt token MDP (tabular policy, exact return)."""
    if world not in DEMO_STALENESS:
        raise ValueError(f"demo world {world!r} is unknown; valid: {', '.join(DEMO_WORLDS)}")
    updates = DEMO_UPDATES[world] if updates is None else updates
    clipped = {"label": "grpo", "objective": "grpo", "objective_params": {"eps_low": 0.2, "eps_high": 0.2}}
    reference = {**clipped, "label": "grpo_on_policy", "schedule": "on_policy"}
    if world == "token_mdp":
        objectives: list[dict[str, Any]] = [
            clipped,
            {"label": "grpo_no_trust_region", "objective": "grpo",
             "objective_params": {"eps_low": float("inf"), "eps_high": float("inf")}},
            {"label": "m2po", "objective": "m2po"},
            reference,
        ]
        base: dict[str, Any] = {
            "world": "token_mdp", "world_params": {"family": "target", "vocab_size": 4, "length": 5,
                                                   "num_prompts": 4},
            "policy": "tabular", "updates": updates, "prompts_per_update": 4, "group_size": 8, "lr": 0.1,
            "eval_every": 5, "sample_every": 20, "checkpoint_every": 20, "seed": 0,
            "schedule": f"stale_k:{toy_staleness(updates)}",
        }
        return {"base": base, "axes": {"objective": objectives}}
    base = {"world": "synthetic_lm", "world_params": {"preset": DEMO_PRESET, **(world_params or {})},
            "updates": updates,
            "eval_every": 25, "sample_every": 0, "checkpoint_every": 350,
            "schedule": f"stale_k:{DEMO_STALENESS[world]}", "policy_params": {"token_draw": "inverse_cdf"}}
    m2po = {"label": "m2po", "objective": "m2po", "objective_params": {"tau": 0.04}}
    return {"base": base, "axes": {"objective": [clipped, m2po, reference], "seed": [0, 1, 2]}}


def demo_world_params(world: str, preset: str | None) -> dict[str, Any] | None:
    """The world parameters ``--preset`` asks for: None when not given; a ``ValueError`` naming what is valid for an
    unknown preset, or for a preset with ``--world token_mdp`` (which has none)."""
    if preset is None:
        return None
    if world != "synthetic_lm":
        raise ValueError(f"--preset {preset} is a synthetic_lm option; valid: leave it out with --world {world}")
    from offpolicylab.worlds import WORLDS

    return {"preset": WORLDS.resolve("synthetic_lm", {"preset": preset}, fill_defaults=False)["preset"]}


def toy_staleness(updates: int) -> int:
    """K of the token-MDP demo's ``stale_k:K``: 32, at most a quarter of the run (at least 1), so that the updates
    after the first K train on stale data of the run's own policy, not only on π₀'s."""
    return max(1, min(DEMO_STALENESS["token_mdp"], updates // 4))


def describe(grid: dict[str, Any], workers: int) -> str:
    """The first lines the demo prints: what runs, how many updates, on how many workers, and what the stale runs
    train on (stale_k:K: updates 0 … K on π₀'s batches, the rest on batches of their own policy K updates old)."""
    base, axes = grid["base"], grid["axes"]
    runs = math.prod(len(values) for values in axes.values())
    lag = int(str(base["schedule"]).split(":")[1])
    first = min(lag + 1, base["updates"])  # updates 0 … K consume π₀'s batches (version max(u − K, 0) = 0)
    own = base["updates"] - first
    stale = (f"the stale runs ({base['schedule']}) train on π₀'s data for their first {first} updates, then {own} "
             f"on data of their own policy {lag} updates old")
    world = base["world"]
    if "preset" in base.get("world_params", {}):
        world += f" (preset {base['world_params']['preset']})"
    return (f"demo: {runs} runs of {base['updates']} updates on {world} ({workers} worker"
            f"{'s' if workers != 1 else ''}); π₀ is built or loaded first, then progress with an ETA follows\n"
            f"demo: {stale}")


# ============================================================================================ the command
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``offpolicylab demo``'s flags."""
    parser.add_argument("--world", default="synthetic_lm", choices=DEMO_WORLDS,
                        help="synthetic_lm (default: grpo vs m2po at stale_k:256 and on-policy grpo, 3 seeds, on the "
                             "seed-scale LM world) or token_mdp (exact returns, under a minute)")
    parser.add_argument("--preset", default=None, metavar="NAME",
                        help=f"synthetic_lm only: the recipe (default {DEMO_PRESET}, recipe v5, for speed; "
                             "seed_scale_v7 is the world's default, several times slower per update)")
    parser.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    parser.add_argument("--workers", type=int, default=DEMO_WORKERS,
                        help=f"parallel processes (default {DEMO_WORKERS}: the nine LM runs end together on 2 cores)")
    parser.add_argument("--updates", type=int, default=None, help="updates per run (default: the demo's budget)")
    parser.add_argument("--rerun-changed", action="store_true",
                        help="run again the cells in --out that were run with another config (else refused)")
    parser.add_argument("--report-to", dest="report_to", default=None, metavar="STR",
                        help="experiment trackers for every run: tensorboard, wandb, mlflow, trackio or none, "
                             "comma-separated (docs/metrics.md, 'Tracker tags')")


def run_command(args: argparse.Namespace) -> int:
    """Run the demo's sweep into ``--out``, print its table, draw ``demo.png``; 1 when a run failed."""
    from offpolicylab.progress import print_table
    from offpolicylab.sweep import run_sweep
    from offpolicylab.worlds import make_world

    grid = demo_grid(args.updates, args.world, demo_world_params(args.world, args.preset))
    if args.report_to is not None:
        grid["base"]["report_to"] = args.report_to
    TrainConfig.from_dict(grid["base"])  # bad options are refused before π₀ is built
    print(describe(grid, args.workers), file=sys.stderr, flush=True)
    make_world(grid["base"]["world"], **grid["base"]["world_params"])  # a cached π₀ is built once, not per worker
    rows = run_sweep(grid, args.out, workers=args.workers, progress="bar" if sys.stderr.isatty() else "lines",
                     rerun_changed=args.rerun_changed)
    figure = demo_figure([Path(args.out) / row["cell"] for row in rows], Path(args.out) / "demo.png")
    print_table(rows, TABLE_COLUMNS)
    print(f"figure: {figure}")
    return 1 if any(row["status"] == "failed" for row in rows) else 0


# ============================================================================================ the figure
def configuration_label(config: dict[str, Any], label: str | None = None) -> str:
    """A legend label: the grid's objective label (``grpo no trust region``), its ε and τ (``ε = 0.2``, ``ε = ∞``,
    ``ε = 0.2 / 0.28`` for an asymmetric clip), then the schedule (``on-policy`` or ``stale_k:256``)."""
    objective = str(config.get("objective", "?"))
    name = (label or objective).replace("_on_policy", "").replace("_", " ")
    params = dict(config.get("objective_params") or {})
    parts = []
    if "eps_low" in params or "eps_high" in params:
        low, high = (_symbol_value(params.get(k, params.get("eps_low"))) for k in ("eps_low", "eps_high"))
        parts.append(f"ε = {low}" if low == high else f"ε = {low} / {high}")
    if "tau" in params:
        parts.append(f"τ = {_symbol_value(params['tau'])}")
    elif objective == "m2po":  # the grid leaves τ at its default: name it
        from offpolicylab.objectives import objective_params

        parts.append(f"τ = {_symbol_value(objective_params('m2po')['tau'].default)}")
    schedule = str(config.get("schedule", "on_policy"))
    schedule = "on-policy" if schedule in ("on_policy", "stale_k:0") else schedule
    return f"{name} ({', '.join(parts)}), {schedule}" if parts else f"{name}, {schedule}"


def _symbol_value(value: Any) -> str:
    number = float(value)
    return "∞" if math.isinf(number) else f"{number:g}"


def demo_figure(run_dirs: Sequence[str | Path], path: Path) -> Path:
    """Return per update, one line per configuration of the demo's runs ``run_dirs`` (the cells its sweep wrote:
    other runs in the folder are not drawn) (objective label and parameters ×
    schedule): the mean over its seeds with a band of ± 1 sd over seeds (where there are several; kept within the
    seeds' own range, so an exact return's band stays in [0, 1]); on-policy runs dashed (the reference), an ✕ on
    the line wherever the collapse detector flagged a run.  The return is the exact return where the world
    enumerates its responses, else the Monte-Carlo evaluation return, else the run's reward (docs/metrics.md)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import pandas as pd

    from offpolicylab.run_dir import REWARD_COLUMNS
    from offpolicylab.run_records import load_runs

    curves: dict[str, list[pd.Series]] = {}
    dashed: dict[str, bool] = {}
    flags: list[tuple[str, int]] = []
    used: set[str] = set()
    seeds: set[int] = set()
    for run in load_runs(run_dirs):
        frame = run.metrics
        column = next((c for c in (*RETURNS, *REWARD_COLUMNS) if c in frame and frame[c].notna().any()), None)
        if column is None:
            continue
        used.add(column)
        label = configuration_label(run.config, run.labels.get("objective"))
        series = frame[["update", column]].dropna().set_index("update")[column]
        curves.setdefault(label, []).append(series)
        dashed[label] = "on-policy" in label
        seeds.add(run.seed)
        flags += [(label, update) for update in run.collapse_updates()]
    fig, ax = plt.subplots(figsize=(9.5, 4.4))
    objectives = list(dict.fromkeys(label.split(",")[0].split(" (")[0] for label in curves))
    palette = dict(zip(objectives, plt.get_cmap("tab10").colors, strict=False))
    order = sorted(curves, key=lambda label: (dashed[label], list(curves).index(label)))
    for label in order:
        table = pd.concat(curves[label], axis=1).sort_index()
        mean = table.mean(axis=1)
        color = palette[label.split(",")[0].split(" (")[0]]
        style = "--" if dashed[label] else "-"
        ax.plot(mean.index, mean.values, style, color=color, lw=1.8, label=label)
        if table.shape[1] > 1:
            sd = table.std(axis=1, ddof=0)
            low = np.maximum(mean - sd, table.min(axis=1))
            high = np.minimum(mean + sd, table.max(axis=1))
            ax.fill_between(mean.index, low, high, color=color, alpha=0.2, lw=0)
        for flagged, update in flags:
            if flagged == label:
                ax.plot(update, float(np.interp(update, mean.index, mean.values)), marker="X", markersize=9,
                        color=color, markeredgecolor="black", linestyle="none")
    if flags:
        ax.plot([], [], marker="X", color="grey", markeredgecolor="black", linestyle="none",
                label="collapse detector flag")
    if curves:
        ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False, fontsize="small")
    ax.grid(alpha=0.3)
    ax.set_xlabel("update")
    names = {**RETURNS, **{c: "reward (current policy)" for c in REWARD_COLUMNS}}
    ax.set_ylabel(" / ".join(names[c] for c in sorted(used)) or "return")
    stale = sorted({label.rsplit(", ", 1)[-1] for label in curves if not dashed[label]})
    title = (f"stale data ({', '.join(stale)}) against the on-policy reference (dashed)"
             if stale and any(dashed.values()) else "demo runs")
    ax.set_title(title + (f"\nmean over {len(seeds)} seeds, band ± 1 sd" if len(seeds) > 1 else ""), fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
