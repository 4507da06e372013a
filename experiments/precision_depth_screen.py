"""How the 16-bit trainer's rounding of the v6 student scales with its depth and width, against SmolLM2-135M's
measured bf16 rounding (docs/synthetic_lm_v6.md, candidate 1's screen: 1.02 % of tokens beyond 0.18, p99.9 0.296).

    python experiments/precision_depth_screen.py --shapes 2x64,4x64,8x64 --distill-steps 150 \\
        --json experiments/results/precision_depth_screen.json

Students: the v6 world built with an ``L``-layer, width-``d`` π₀ (the v6 recipe with ``num_layers``, ``d_model`` and
``distill_steps`` replaced: its teacher distilled, sharpened to t_π₀ = 0.7, θ recomputed, cached), every shape the
same number of steps; plus v6's shipped π₀ (2 layers, d 64, 600 steps) as the anchor.  Responses:
``--prompts`` training prompts × ``--group`` samples at temperature 1 from each student's fp32 sampler.  Per response
token, |Δ log π| between (log-softmax always in fp32 from the logits, as ``trainer_precision`` computes it):

* ``rounding:<p>`` — the trainer's forward under ``<p>`` autocast vs fp32 (the rounding itself; SmolLM2's row);
* ``batching:<p>`` — the old-log-prob recompute in micro-batches of ``--micro-batch`` rows vs the training forward
  of every row at once, both in ``<p>`` (lag 0: zero where the CPU kernels are batch-invariant);
* ``engine:<p>`` — the sampler as a separate engine (the whole network cast to ``<p>``, its softmax in ``<p>``:
  ``sampler_precision``) vs the trainer's ``<p>`` autocast forward of the same tokens (the rollout–trainer mismatch);
* ``step:<p>`` — the precision's share of a one-update log-ratio: θ' = θ + lr · sign(ξ) on every fp32 master weight
  (ξ ~ N(0, 1) seeded, lr ``--lr``), |[log π_p(θ') − log π_p(θ)] − [log π_32(θ') − log π_32(θ)]|.

``--trainer-weights cast``: the trainer's 16-bit forwards (every row but ``engine``'s sampler side and the fp32
reference) read 16-bit copies of every weight, as FSDP's ``param_dtype`` runs them (``trainer_weights=cast``).
``--recompute-split-k k``: the ``batching`` row's micro-batches run their linear maps as split-K GEMMs with k
slices (``recompute_split_k``; the training forward keeps torch's kernels).  ``--shapes none``: v6's shipped π₀ alone.  ``--score-padding longest``: every scoring forward over its rows' longest
response (``score_padding``).  ``--logit-offset c``: every student's logits shifted by c
(``logit_offset``).  ``chosen_logit.offset_rule`` is the smallest multiple of 0.5 that lifts SmolLM2-135M's share
of chosen-token fp32 logits ≥ 32 (12.4 %) into the unshifted student (docs/synthetic_lm_v7.md, part 5's rule).

Each comparison reports p99, p99.9, max and the shares beyond 0.18 (ε = 0.2's upper clip edge in log space) and 0.09,
overall and by π_old bin (``experiments/precision_screen.py``'s ``summary``, the SmolLM2 screen's statistics); plus the chosen tokens' fp32 logits.  The rule that reads it is in docs/synthetic_lm_v7.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from precision_screen import summary  # noqa: E402  (experiments/: quantiles of |Δ| by π_old bin)

from offpolicylab.behavior import recompute_behavior_logp  # noqa: E402
from offpolicylab.policies.precision import sampler_weights  # noqa: E402
from offpolicylab.run_dir import write_json  # noqa: E402
from offpolicylab.worlds import synthetic_lm_v6 as v6  # noqa: E402

SMOLLM2 = {"beyond_clip": 0.0102, "p999": 0.296, "chosen_logit_share_ge_32": 0.124}


def offset_rule(chosen: np.ndarray, share: float = SMOLLM2["chosen_logit_share_ge_32"]) -> float:
    """The smallest c ∈ 0.5·ℕ with mean(z + c ≥ 32) ≥ ``share`` over the chosen-token fp32 logits z."""
    c = 0.0
    while (chosen + c >= 32).mean() < share:
        c += 0.5
    return c


def student(shape: tuple[int, int], steps: int) -> tuple[Any, float]:
    """(π₀ of ``shape`` = (layers, width): the v6 world built with those sizes and ``steps`` distillation steps — its
    own build, cached where the world caches π₀, so a preset with that recipe loads it — and the CPU seconds the
    build took); ``steps = 0``: v6's shipped π₀."""
    layers, width = shape
    if steps == 0:
        return v6.ChainLM().pretrained_policy(), 0.0
    recipe = replace(v6.ChainRecipe(), num_layers=layers, d_model=width, distill_steps=steps)
    start = time.process_time()
    world = v6.ChainLM(recipe)
    return world.pretrained_policy(), time.process_time() - start


def logp_of(policy: Any, rollout: Any, precision: str, micro_batch: int = 0, weights: str = "master") -> np.ndarray:
    """The valid tokens' log π under ``precision`` (the trainer's forward on ``weights``: ``trainer_weights``),
    in micro-batches or whole."""
    policy.set_trainer_precision(precision, weights="master" if precision == "fp32" else weights)
    scored = recompute_behavior_logp(policy, rollout, micro_batch).behavior_logp
    policy.set_trainer_precision("fp32")
    return scored[rollout.response_mask > 0].double().numpy()


def engine_logp(policy: Any, rollout: Any, precision: str) -> np.ndarray:
    """The separate engine's numbers: the whole network cast to ``precision``, its log-softmax in it."""
    with torch.no_grad(), sampler_weights(policy.model, precision):
        logits = policy.response_logits(rollout.prompt_ids, rollout.prompt_mask, rollout.prompt_index,
                                        rollout.response_ids)
        logp = torch.log_softmax(logits, -1).gather(-1, rollout.response_ids[..., None]).squeeze(-1).float()
    return logp[rollout.response_mask > 0].double().numpy()


def screen_one(policy: Any, world: Any, prompts: int, group: int, micro_batch: int, lr: float,
               seed: int, weights: str = "master") -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    batch = world.sample_prompts(prompts, generator)
    rollout = policy.sample(batch, group, 1.0, generator)
    with torch.no_grad():
        logits = policy.response_logits(rollout.prompt_ids, rollout.prompt_mask, rollout.prompt_index,
                                        rollout.response_ids)
    chosen = logits.gather(-1, rollout.response_ids[..., None]).squeeze(-1)[rollout.response_mask > 0].numpy()
    old = logp_of(policy, rollout, "fp32")
    moved = policy.clone()
    noise = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for weight in moved.model.parameters():
            weight.add_(lr * torch.randn(weight.shape, generator=noise).sign())
    drift = logp_of(moved, rollout, "fp32") - old
    out: dict[str, Any] = {
        "tokens": int(len(old)),
        "chosen_logit": {"p50": float(np.median(chosen)), "p99": float(np.quantile(chosen, 0.99)),
                         "share_ge_32": float((np.abs(chosen) >= 32).mean()), "offset_rule": offset_rule(chosen)},
        "share_pi_old_ge_0.9": float((np.exp(old) >= 0.9).mean()),
        "step:fp32 drift": summary(np.abs(drift), old),
    }
    for precision in ("bf16", "fp16"):
        whole = logp_of(policy, rollout, precision, weights=weights)
        out[f"rounding:{precision}"] = summary(np.abs(whole - old), old)
        out[f"batching:{precision}"] = summary(np.abs(logp_of(policy, rollout, precision, micro_batch, weights)
                                                    - whole), old)
        out[f"engine:{precision}"] = summary(np.abs(engine_logp(policy, rollout, precision) - whole), old)
        out[f"step:{precision}"] = summary(np.abs(logp_of(moved, rollout, precision, weights=weights) - whole - drift),
                                         old)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="2x64,4x64,8x64", help="layers x width, comma-separated; none: the anchor "
                                                                 "alone")
    parser.add_argument("--score-padding", default="fixed", choices=("fixed", "longest"),
                        help="the length of each scoring forward (score_padding)")
    parser.add_argument("--logit-offset", type=float, default=0.0, help="shift every student's logits by c")
    parser.add_argument("--trainer-weights", default="master", choices=("master", "cast"),
                        help="the weights the trainer's 16-bit forwards read (trainer_weights)")
    parser.add_argument("--recompute-split-k", type=int, default=1,
                        help="> 1: the recompute's micro-batches run split-K GEMMs (recompute_split_k)")
    parser.add_argument("--distill-steps", type=int, default=150)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1.5e-5, help="the sign step of step:<p> (v6's learning rate)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-anchor", action="store_true", help="skip v6's shipped π₀")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    world = v6.ChainLM()
    shapes = [] if args.shapes == "none" else [tuple(int(x) for x in item.split("x")) for item in args.shapes.split(",")]
    plan = ([] if args.no_anchor else [("v6_pi0 2x64 (600 steps)", (2, 64), 0)]) + [
        (f"{layers}x{width} ({args.distill_steps} steps)", (layers, width), args.distill_steps)
        for layers, width in shapes]
    results: dict[str, Any] = {"smollm2": SMOLLM2, "args": vars(args) | {"json": str(args.json)}, "students": {}}
    for name, shape, steps in plan:
        policy, seconds = student(shape, steps)
        policy.shift_logits(args.logit_offset)
        policy.score_padding = args.score_padding
        policy.recompute_split_k = args.recompute_split_k  # read by the recompute alone (micro-batches > 0)
        found = screen_one(policy, world, args.prompts, args.group, args.micro_batch, args.lr, args.seed,
                           args.trainer_weights)
        found["distill_cpu_s"] = seconds
        results["students"][name] = found
        row = " ".join(f"{key} {found[key]['beyond_clip']:.4%}/{found[key]['p999']:.3f}"
                       for key in found if ":" in key and "drift" not in key)
        print(f"{name}: distill {seconds:.0f} s CPU; z_y p50 {found['chosen_logit']['p50']:.1f}; {row}", flush=True)
        if args.json:
            write_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
