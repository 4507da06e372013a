"""Recipe v6 calibration (``experiments/synthetic_lm_v6_calibration.md``): the teacher's length knobs and π₀'s
temperature scan, each statistic beside its target.

    python experiments/synthetic_lm_v6_calibration.py teacher      # length knobs, teacher samples only (seconds)
    python experiments/synthetic_lm_v6_calibration.py pi0          # (a), (e) initial success, (f) at the start

``pi0`` builds the preset's π₀ (distils once, cached), then for each t_π₀ in the scan sharpens the same distilled
student, recomputes θ, and prints π₀'s token profile (one temperature-1 sample per training prompt), its initial
success (64 evaluation prompts × 32 samples) and its response lengths; the rule of ``docs/synthetic_lm_v6.md``
chooses t_π₀: among the temperatures meeting (a) and (e), the one minimising the larger of
|share − 52.5 %| / 7.5 % and |p80 − 0.675| / 0.175.  No training run is made.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from offpolicylab.synthetic_lm_calibration import SEED_SCALE_TARGETS, initial_success, policy_token_profile  # noqa: E402
from offpolicylab.worlds import make_world  # noqa: E402
from offpolicylab.worlds import synthetic_lm as v5  # noqa: E402
from offpolicylab.worlds.synthetic_lm_v6 import (  # noqa: E402
    CHAIN_PRESETS,
    ChainLM,
    ChainTeacher,
    _find,
    make_student,
    parse,
    random_prompts,
    response_mask,
)

TEMPERATURES = (1.0, 0.9, 0.8, 0.7, 0.6)
SUCCESS_WINDOW = (0.05, 0.30)
CENTRE = (0.525, 0.675)
HALF_WIDTH = (0.075, 0.175)


def teacher_scan(samples: int = 512) -> None:
    """Length statistics of teacher samples for each (β_eq, t_c) of the committed grid and its extension."""
    print("| β_eq | t_c | mean length | p90 | truncated | steps | chain right | < 0.01 nat | p80 |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for beta in (1.0, 1.25, 1.5, 1.75, 2.0):
        for centre in (40, 44, 48, 36, 32):
            recipe = replace(CHAIN_PRESETS["seed_scale_v6"], step_bias=beta, answer_centre=float(centre))
            teacher = ChainTeacher(recipe)
            generator = torch.Generator().manual_seed(1)
            prompts = random_prompts(recipe, samples, generator)
            response, logp = teacher.sample(prompts, generator)
            found = parse(response, teacher.start[prompts[:, 0] - 13], teacher.rule_of(prompts[:, 0] - 13), prompts)
            length = found["length"].float()
            entropy = -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)[response_mask(response) > 0]
            right = found["right"] & found["ended"] & found["grammar"] & (found["steps"] >= recipe.min_steps)
            print(f"| {beta} | {centre} | {length.mean():.1f} | {length.quantile(0.9):.0f} | "
                  f"{(~found['ended']).float().mean():.1%} | {found['steps'].float().mean():.1f} | "
                  f"{right.float().mean():.1%} | {(entropy < 0.01).float().mean():.1%} | "
                  f"{entropy.quantile(0.8):.3f} |", flush=True)


def lengths(world: ChainLM, policy: object, seed: int = 0) -> dict[str, float]:
    """Mean and p90 of π₀'s response length (tokens up to and including EOS) and the share truncated, one
    temperature-1 sample per training prompt."""
    rollout = policy.sample(world._prompts(torch.arange(world.num_prompts)), 1, 1.0,  # type: ignore[attr-defined]
                            torch.Generator().manual_seed(seed))
    found = world.parse(rollout.prompt_index, rollout.response_ids)
    length = found["length"].float()
    return {"mean": float(length.mean()), "p90": float(length.quantile(0.9)),
            "truncated": float((~found["ended"]).float().mean()), "steps": float(found["steps"].float().mean())}


def pi0_scan(success_samples: int = 32, num_layers: int | None = None,
             temperatures: tuple[float, ...] = TEMPERATURES, num_rules: int = 1, distill_steps: int | None = None
             ) -> None:
    """π₀'s profile and initial success at each t_π₀ of ``temperatures``, from the distilled student of v6's recipe
    (with ``num_layers`` layers and ``distill_steps`` distillation steps when given, and ``num_rules`` step rules)."""
    given = {"num_layers": num_layers, "distill_steps": distill_steps}
    sizes = {"num_rules": num_rules, **{k: v for k, v in given.items() if v is not None}}
    world = make_world("synthetic_lm", preset="seed_scale_v6", **sizes)
    plain = replace(world.recipe, pi0_temperature=1.0)
    found = _find(world.cache_dir, plain)
    if found is None:
        raise SystemExit(f"the distilled student (t_π₀ = 1) is not in {world.cache_dir}")
    print(f"recipe: {world.recipe}\n")
    print("| t_π₀ | < 0.01 nat [45, 60 %] | p80 [0.5, 0.85] nat | ≥ 1 nat | π(y) < 1e-3 | success [5, 30 %] | "
          "format valid | length mean | p90 | truncated | steps | θ |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for t in temperatures:
        policy = v5.sharpen(make_student(plain, found[0]), t)
        with torch.random.fork_rng(devices=[]):
            world.threshold = v5.format_threshold(world, policy)  # type: ignore[arg-type]
        profile = policy_token_profile(world, policy)  # type: ignore[arg-type]
        success = initial_success(world, policy, success_samples)  # type: ignore[arg-type]
        length = lengths(world, policy)
        share, p80 = profile["share_entropy_below_0.01"], profile["entropy_p80"]
        rows.append((t, share, p80, success["success"]))
        print(f"| {t} | {share:.1%} | {p80:.3f} | {profile['share_entropy_at_least_1']:.1%} | "
              f"{profile['share_sampled_prob_below_1e-3']:.2%} | {success['success']:.1%} ± "
              f"{success['success_se']:.1%} | {success['format_valid']:.1%} | {length['mean']:.1f} | "
              f"{length['p90']:.0f} | {length['truncated']:.1%} | {length['steps']:.1f} | {world.threshold:.2f} |",
              flush=True)
    (low_s, high_s), (low_p, high_p) = SEED_SCALE_TARGETS.values()
    meeting = [r for r in rows if low_s <= r[1] <= high_s and low_p <= r[2] <= high_p
               and SUCCESS_WINDOW[0] <= r[3] <= SUCCESS_WINDOW[1]]
    if not meeting:
        print("\nno temperature meets (a) and (e): the recipe fails its first calibration")
        return
    best = min(meeting, key=lambda r: max(abs(r[1] - CENTRE[0]) / HALF_WIDTH[0], abs(r[2] - CENTRE[1]) / HALF_WIDTH[1]))
    print(f"\nchosen t_π₀ = {best[0]} (of {[r[0] for r in meeting]} meeting (a) and (e))")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("teacher", "pi0"))
    parser.add_argument("--success-samples", type=int, default=32)
    parser.add_argument("--num-layers", type=int, default=None, help="pi0: the student's depth (default v6's)")
    parser.add_argument("--temperatures", default=",".join(str(t) for t in TEMPERATURES),
                        help="pi0: the t_π₀ values scanned, comma-separated")
    parser.add_argument("--num-rules", type=int, default=1, help="pi0: the chain's step rules R (default v6's 1)")
    parser.add_argument("--distill-steps", type=int, default=None, help="pi0: distillation steps (default v6's)")
    args = parser.parse_args(argv)
    if args.what == "teacher":
        teacher_scan()
    else:
        pi0_scan(args.success_samples, args.num_layers, tuple(float(t) for t in args.temperatures.split(",")),
                 args.num_rules, args.distill_steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
