"""How much of a stale buffer can be clipped at all: the share of response tokens whose GRPO advantage is nonzero, per
buffered batch, beside the clip fraction the run logged when it consumed that batch.

GRPO's advantage Â_i = (R_i − mean_g R) / (std_g R + 1e-6) is 0 for every response of a group g whose G rewards
are equal (Shao et al. 2024, arXiv:2402.03300).  The ε-clip acts on a token only through −Â·r, so a token with Â = 0 is
never counted as clipped, while it stays in the denominator of the clip fraction (ours, `clip_frac`, and verl's
`actor/pg_clipfrac`, a masked mean over all response tokens).  The clip fraction therefore factors as

    clip_frac = share(Â ≠ 0) × clip_frac | Â ≠ 0

and a run whose success saturates (more groups all right) clips less at the same per-token drift.  This script reads
the first factor off a run's checkpoint — the stale buffer holds every batch the next updates will consume, with its
rewards, group ids and masks — and, with the run's ``metrics.csv``, the clip fraction logged at the updates that
consume them (the buffer's ``keys``; updates the run has not reached are left out), both token-weighted over the
batches, so that their ratio is the clip fraction among the tokens with Â ≠ 0.  Runs trained before the trainer
gave equal-reward groups Â = 0 exactly gave the residue groups of :func:`group_kinds` |Â| ≈ 0.007, which can be
clipped: the second ratio printed counts their tokens in the denominator too.

    python experiments/synthetic_lm_advantage_share.py RUN_DIR [RUN_DIR ...] [--metrics CSV] [--json OUT.json]

Only tensors are read (``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import Tensor


def group_kinds(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Two [N] bool tensors: whether the row's group has rewards that are not all equal (its GRPO advantage is
    nonzero), and whether its rewards are all equal to one value v whose float32 mean (Σ r) / n is not v (three
    rewards of 0.9 on any CPU; eight of 0.1 when summed in a row, as here) — a *residue group*, to which a group-mean advantage without
    the equal-rewards case gives |Â| ≈ 0.007 instead of 0."""
    moving = torch.zeros_like(rewards, dtype=torch.bool)
    residue = torch.zeros_like(rewards, dtype=torch.bool)
    for group in group_ids.unique():
        rows = group_ids == group
        r = rewards[rows]
        equal = bool((r == r[0]).all())
        moving[rows] = not equal
        residue[rows] = equal and float(r.sum() / len(r)) != float(r[0])
    return moving, residue


def batch_table(buffer: dict[str, Tensor]) -> pd.DataFrame:
    """One row per buffered batch: ``key`` (the update that consumes it), ``version`` (the policy that sampled it),
    ``tokens``, ``share_tokens`` (response tokens with Â ≠ 0 over all response tokens), ``share_groups``,
    ``success`` (share of responses with reward 1), and the residue groups of :func:`group_kinds`: their share of
    the groups (``equal_with_residue``) and of the tokens (``residue_tokens``)."""
    rows = []
    start = 0
    for key, count in zip(buffer["keys"].tolist(), buffer["rows"].tolist(), strict=True):
        part = slice(start, start + count)
        start += count
        rewards, groups = buffer["rewards"][part], buffer["group_ids"][part]
        mask = buffer["response_mask"][part].sum(1)
        moving, residual = group_kinds(rewards, groups)
        firsts = [int((groups == g).nonzero()[0]) for g in groups.unique()]
        rows.append({"key": key, "version": int(buffer["version"][part].max()), "tokens": float(mask.sum()),
                     "share_tokens": float(mask[moving].sum() / mask.sum()),
                     "share_groups": float(moving[firsts].float().mean()),
                     "success": float((rewards == 1.0).float().mean()),
                     "equal_with_residue": float(residual[firsts].float().mean()),
                     "residue_tokens": float(mask[residual].sum() / mask.sum())})
    return pd.DataFrame(rows)


def read_run(run_dir: Path, metrics_csv: Path | None = None) -> dict[str, Any]:
    """The buffer's batches of ``run_dir``'s checkpoint, summarised, and the clip fraction logged at their keys in
    ``metrics_csv`` (default: the run's own; another run's when a shorter rerun of it supplies the checkpoint)."""
    state = torch.load(run_dir / "checkpoint" / "state.pt", weights_only=True, map_location="cpu")
    table = batch_table(state["buffer"])
    metrics = pd.read_csv(metrics_csv or run_dir / "metrics.csv").set_index("update")
    logged = table[table["key"].isin(metrics.index)]
    tokens = logged["tokens"].to_numpy()

    def weighted(values: Any) -> float:
        return float((values * tokens).sum() / tokens.sum()) if len(logged) else math.nan

    clip = weighted(metrics.loc[logged["key"], "clip_frac"].to_numpy())
    share, extra = weighted(logged["share_tokens"].to_numpy()), weighted(logged["residue_tokens"].to_numpy())
    return {"run": str(run_dir), "next_update": int(state["next_update"]),
            "versions": [int(table["version"].min()), int(table["version"].max())],
            "keys": [int(table["key"].min()), int(table["key"].max())], "batches": len(table),
            "share_tokens": float(table["share_tokens"].mean()), "share_groups": float(table["share_groups"].mean()),
            "success": float(table["success"].mean()), "equal_with_residue": float(table["equal_with_residue"].mean()),
            "residue_tokens": float(table["residue_tokens"].mean()),
            "logged_batches": len(logged),
            "clip_frac_logged": clip, "share_tokens_logged": share,
            "clip_frac_given_nonzero": clip / share if share else math.nan,
            "clip_frac_given_nonzero_or_residue": clip / (share + extra) if share + extra else math.nan}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--metrics", type=Path, default=None,
                        help="read the logged clip fraction from this metrics.csv (a longer run of the same config)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    results = [read_run(run, args.metrics) for run in args.runs]
    print("| run | sampled by versions | consumed at | Â ≠ 0: tokens / groups | success | equal with residue | "
          "clip_frac logged (batches) | clip_frac given Â ≠ 0 (or a residue group) |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['run']} | {r['versions'][0]}–{r['versions'][1]} | {r['keys'][0]}–{r['keys'][1]} | "
              f"{100 * r['share_tokens']:.1f} % / {100 * r['share_groups']:.1f} % | {100 * r['success']:.1f} % | "
              f"{100 * r['equal_with_residue']:.1f} % | "
              f"{100 * r['clip_frac_logged']:.3f} % ({r['logged_batches']}) | "
              f"{100 * r['clip_frac_given_nonzero']:.3f} % ({100 * r['clip_frac_given_nonzero_or_residue']:.3f} %) |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
