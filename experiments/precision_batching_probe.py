"""At which width this CPU's 16-bit kernels become batch-variant for the student: the lag-0 component of a
recomputed old log-prob (docs/synthetic_lm_v7.md, part 8).

    python experiments/precision_batching_probe.py --widths 64,128,256,576 --json runs/batching_probe.json

For each width d: a randomly initialised 2-layer :class:`~offpolicylab.policies.transformer.TransformerPolicy`
(d / 64 · 4 heads, at least 4; vocabulary, prompt and response lengths of recipe v6), ``--rows`` responses sampled
from it in fp32; then, in each precision, the responses' log π scored by the trainer's forward (``trainer_weights``
``--weights``) in micro-batches of ``--micro-batch`` rows (the old-log-prob recompute) and in one forward of every
row (the training forward).  |Δ log π| between the two: its max, p99.9, the share of tokens that differ at all and
the share beyond 0.18 (ε = 0.2's upper clip edge).  Batch variance is a property of the kernels at a shape, not of
the weights, so random weights suffice; nothing is injected.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from offpolicylab.behavior import recompute_behavior_logp  # noqa: E402
from offpolicylab.contracts import Prompts  # noqa: E402
from offpolicylab.policies.transformer import TransformerPolicy  # noqa: E402
from offpolicylab.run_dir import write_json  # noqa: E402

CLIP = 0.18
VOCAB, PROMPT_LEN, RESPONSE_LEN = 256, 4, 32  # recipe v6's shapes (docs/synthetic_lm_v6.md)


def student(width: int, seed: int) -> TransformerPolicy:
    return TransformerPolicy(vocab_size=VOCAB, response_len=RESPONSE_LEN, max_prompt_len=PROMPT_LEN, d_model=width,
                             num_layers=2, num_heads=max(4, width // 64 * 4) if width % 64 == 0 else 4, seed=seed)


def batching(policy: TransformerPolicy, rollout: Any, precision: str, weights: str, micro_batch: int
             ) -> dict[str, float]:
    """|log π (micro-batches) − log π (one forward)| over the valid tokens, in ``precision``."""
    policy.set_trainer_precision(precision, weights=weights if precision != "fp32" else "master")
    parts = recompute_behavior_logp(policy, rollout, micro_batch).behavior_logp
    whole = recompute_behavior_logp(policy, rollout, 0).behavior_logp
    policy.set_trainer_precision("fp32")
    valid = rollout.response_mask > 0
    delta = (parts - whole)[valid].abs().double().numpy()
    return {"tokens": int(delta.size), "max": float(delta.max()), "p999": float(np.quantile(delta, 0.999)),
            "share_differing": float((delta > 0).mean()), "beyond_clip": float((delta > CLIP).mean())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="64,128,256,576")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--weights", default="cast", choices=("master", "cast"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results: dict[str, Any] = {"args": vars(args) | {"json": str(args.json)}, "widths": {}}
    for width in (int(w) for w in args.widths.split(",")):
        policy = student(width, args.seed)
        generator = torch.Generator().manual_seed(args.seed)
        prompts = Prompts(ids=torch.randint(0, VOCAB, (args.rows, PROMPT_LEN), generator=generator),
                          mask=torch.ones(args.rows, PROMPT_LEN), index=torch.arange(args.rows))
        rollout = policy.sample(prompts, 1, 1.0, generator)
        rows = {precision: batching(policy, rollout, precision, args.weights, args.micro_batch)
                for precision in ("fp32", "bf16", "fp16")}
        results["widths"][str(width)] = rows
        print(f"d {width}: " + "  ".join(f"{p} max {r['max']:.3g} differing {r['share_differing']:.2%} beyond "
                                         f"{r['beyond_clip']:.3%}" for p, r in rows.items()), flush=True)
        if args.json:
            write_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
