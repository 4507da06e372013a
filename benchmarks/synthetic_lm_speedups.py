"""What the speed-ups that change numbers would buy one synthetic-LM update, against the eager pieces in one process.

    OMP_NUM_THREADS=1 python benchmarks/synthetic_lm_speedups.py [--world-param preset=seed_scale_v6] [--repeats 21]
        [--grid-minutes 180] [--cells 27] [--workers 2] [--budget-min 120]

The three pieces of an update (as ``synthetic_lm_floor.py`` times them: sampling 8 prompts × 8 responses, the
reward of 64 responses, scoring + backward) are timed eagerly and with each change that a new recipe may make,
interleaved round by round (medians):

- **compiled blocks** (the ``transformer`` policy's ``compiled=true``): every block through
  ``torch.compile(dynamic=True)`` (inductor's C++ backend on the CPU): the policy's blocks for sampling and for
  scoring + backward, the teacher's for the reward;
- **one uniform per step** (``token_draw=inverse_cdf``): each decoding step draws its token by the inverse CDF of
  its probabilities from one uniform per row instead of the exponential race's V numbers per row;
- both together for sampling.

Both change the sampled tokens (the inverse CDF draws other tokens from the same distribution; compiled kernels
round differently), so a grid run with them is another grid.  The script prints each variant's time, the ratio of
the fastest pieces to the eager ones, and the grid that ratio gives from ``--grid-minutes`` (the measured grid at the
eager speed) plus each process's compilation.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
from synthetic_lm_floor import interleaved_ms, key_values

from offpolicylab.policies import make_policy
from offpolicylab.worlds import make_world


def first_call_s(call: Callable[[], object]) -> float:
    """Seconds of one call (the first call of a compiled module includes its compilation)."""
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-param", action="append", default=[], help="a recipe field, key=value (repeatable)")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--grid-minutes", type=float, default=180.0,
                        help="the grid's measured wall minutes at the eager speed (v6: ≈ 180, benchmarks/README.md)")
    parser.add_argument("--cells", type=int, default=27)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--budget-min", type=float, default=120.0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    world_params = key_values(args.world_param or ["preset=seed_scale_v6"])
    world, compiled_world = make_world("synthetic_lm", **world_params), make_world("synthetic_lm", **world_params)
    compiled_world.teacher.net.compiled = True
    eager = make_policy("transformer", world)
    policies = {(draw, compiled): make_policy("transformer", world, token_draw=draw, compiled=compiled)
                for draw in ("race", "inverse_cdf") for compiled in (False, True)}
    prompts = world.sample_prompts(8, torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(0)
    rollout = eager.sample(prompts, 8, generator=generator)

    def sample(policy: Any) -> Callable[[], object]:
        return lambda: policy.sample(prompts, 8, generator=generator)

    def score_backward(policy: Any) -> Callable[[], None]:
        def call() -> None:
            logp, entropy = policy.score(rollout)
            (logp.sum() + 0 * entropy.sum()).backward()
        return call

    def reward(w: Any) -> Callable[[], object]:
        return lambda: w.reward(rollout.prompt_index, rollout.response_ids, rollout.response_mask)

    compiled = policies["race", True]
    compile_s = sum(first_call_s(call) for call in (sample(compiled), score_backward(compiled), reward(compiled_world)))
    pieces = {
        "sampling": {"eager": sample(eager), "compiled blocks": sample(compiled),
                     "one uniform per step": sample(policies["inverse_cdf", False]),
                     "both": sample(policies["inverse_cdf", True])},
        "scoring + backward": {"eager": score_backward(eager), "compiled blocks": score_backward(compiled)},
        "reward": {"eager": reward(world), "compiled blocks": reward(compiled_world)},
    }
    calls = {f"{piece}: {variant}": call for piece, variants in pieces.items() for variant, call in variants.items()}
    times = interleaved_ms(calls, args.repeats)
    print(f"threads={args.threads}; world {world_params}; {args.repeats} interleaved rounds, medians; first calls "
          f"of the compiled pieces (compilation included): {compile_s:.1f} s")
    eager_total = fastest_total = 0.0
    for piece, variants in pieces.items():
        base = times[f"{piece}: eager"]
        fastest = min(times[f"{piece}: {variant}"] for variant in variants)
        eager_total, fastest_total = eager_total + base, fastest_total + fastest
        for variant in variants:
            ms = times[f"{piece}: {variant}"]
            print(f"{piece + ': ' + variant:42s} {ms:8.1f} ms  {ms / base:5.2f}x")
    ratio = fastest_total / eager_total
    grid = args.grid_minutes * ratio + compile_s * args.cells / args.workers / 60
    print(f"{'the three pieces, eager / fastest':42s} {eager_total:8.1f} / {fastest_total:.1f} ms  {ratio:5.2f}x")
    print(f"grid at that ratio: {args.grid_minutes:g} min x {ratio:.2f} + compilation "
          f"({args.cells} processes on {args.workers} workers) = {grid:.0f} min; budget {args.budget_min:g} min")


if __name__ == "__main__":
    main()
