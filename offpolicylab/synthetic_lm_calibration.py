"""Calibration measurements of the synthetic-LM world (the numbers ``docs/synthetic_lm.md`` records).

    python -m offpolicylab.synthetic_lm_calibration [--world-param k=v ...] [--profile PROFILE.json]
                                            [--lrs 1e-4,3e-4,1e-3] [--kl-updates 30] [--success-samples 32]
    python experiments/synthetic_lm_drift.py [--world-param k=v ...] --lrs 3e-5,1e-4,3e-4 --out runs/drift \
        [--updates 300] [--workers 2]

prints (1) π₀'s token profile on temperature-1 samples (one per training prompt) side by side with a reference
profile (``offpolicylab.diagnostics.profile``, the same statistics code as ``offpolicylab calibrate``), (2) π₀'s
initial success on the evaluation prompts (share of reward 1, of valid format, mean reward, with standard errors),
(3) m(y) of degenerate responses against θ, and (4) for each learning rate, the per-update KL between consecutive
policies of short on-policy GRPO runs with the world's training defaults:

    KL_u = mean over the batch's response tokens of Σ_v π_u(v | x, y_{<t}) [log π_u(v | ·) − log π_{u+1}(v | ·)]

(exact over the vocabulary at each sampled position, the batch the update was computed on).

The drift measurement (``experiments/synthetic_lm_drift.py`` runs its sweep; this module holds its grid and rule)
measures drift the way the M2PO paper reports it (Zheng et al. 2025, "Prosperity
before Collapse", arXiv:2510.01161, Fig. 6d): the share of tokens whose ε = 0.2 GRPO clip is active,

    clip_frac = mean over updates u < U of  (1/N_u) Σ_t 1[(A_t > 0 ∧ r_t > 1 + ε) ∨ (A_t < 0 ∧ r_t < 1 − ε)]

for each learning rate in two short runs of U updates from π₀: the papers' s = 0 (``stages:4`` — one rollout batch
of 4 × 8 prompts split into 4 minibatches, one optimizer update each, staleness 0–3, as the paper's 256 prompts in
minibatches of 64) and ``stale_k:256``; :func:`drift_table` prints them next to the paper's numbers, and the rate is chosen by
:func:`choose_lr`.  Only clip fractions are read from these runs.

π₀'s profile is printed next to Qwen3-8B's chain of thought (Wang et al. 2025, "Beyond the 80/20 Rule",
arXiv:2506.01939: 50.64 % of tokens below 0.01 nat, 80th percentile 0.672 nat; no rare-token share published) and
the SmolLM2 profile (:func:`seed_scale_table`).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

from offpolicylab.config import TrainConfig, parse_assignments
from offpolicylab.contracts import rewards_of
from offpolicylab.diagnostics.profile import compare_profiles, format_comparison, side_by_side, token_profile
from offpolicylab.profile_files import load_profile
from offpolicylab.stack import Run, Stack
from offpolicylab.trainer import UpdateHook, train
from offpolicylab.worlds import make_world
from offpolicylab.worlds.synthetic_lm import ANS, FIRST_TEXT, PRESETS, SyntheticLM


def policy_token_profile(world: SyntheticLM, policy: Any, samples_per_prompt: int = 1, seed: int = 0) -> dict:
    """Token profile of ``policy``'s temperature-1 samples on every training prompt."""
    prompts = world._prompts(torch.arange(world.num_prompts))
    rollout = policy.sample(prompts, samples_per_prompt, 1.0, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        logp, entropy = policy.score(rollout)
    return token_profile(entropy, logp, rollout.response_mask)


SEED_SCALE_TARGETS = {"share_entropy_below_0.01": (0.45, 0.60), "entropy_p80": (0.5, 0.85)}
"""The ranges the default recipe's π₀ must meet (around Qwen3-8B's published chain-of-thought statistics,
``load_profile("qwen3_8b_cot")``), by profile key."""


def world_profile_document(world: SyntheticLM, policy: Any, name: str = "synthetic_lm π₀") -> dict[str, Any]:
    """``policy``'s :func:`policy_token_profile` as a profile document (source ``measured``, temperature 1), ready
    for :func:`~offpolicylab.diagnostics.profile.side_by_side` next to packaged profiles."""
    return {"source": "measured", "model": name, "sampling": {"temperature": 1.0},
            "profile": policy_token_profile(world, policy)}


def seed_scale_table(world: SyntheticLM, policy: Any) -> str:
    """Markdown: ``policy``'s profile beside Qwen3-8B's chain of thought (published) and SmolLM2-135M's (measured),
    then each of :data:`SEED_SCALE_TARGETS` with its range and verdict."""
    document = world_profile_document(world, policy)
    table = side_by_side({"Qwen3-8B CoT": load_profile("qwen3_8b_cot"),
                          "SmolLM2-135M": load_profile("smollm2_135m_instruct_gsm8k"), "synthetic_lm π₀": document})
    checks = [f"- {key}: {document['profile'][key]:.4f} in [{low:g}, {high:g}]: "
              f"{'yes' if low <= document['profile'][key] <= high else 'no'}"
              for key, (low, high) in SEED_SCALE_TARGETS.items()]
    return table + "\n\n" + "\n".join(checks)


# ================================================================================================ drift
PAPER_CLIP_FRACTIONS = {  # M2PO paper (Zheng et al. 2025, arXiv:2510.01161), Fig. 6d, averaged over training
    "Qwen3-1.7B-Base": {"s0": 0.0007, "s256": 0.0066, "m2po_s256_masked": 0.0002},
    "Qwen2.5-32B": {"s0": 0.0005, "s256": 0.0122, "m2po_s256_masked": 0.0006},
}
S0_WINDOW = (3e-4, 1.5e-3)
"""Item range of ε = 0.2 GRPO's clip fraction at the papers' s = 0 (4 minibatch updates per rollout batch)."""
PROFILED_PRESET = "seed_scale"
"""The preset :func:`main` measures when ``--world-param preset=`` is not given: recipe v5, whose token roles its
profile reads (the world's default since recipe v7 is a chain world: experiments/synthetic_lm_v6_calibration.py)."""
STALE_WINDOW = (3e-3, 2.5e-2)
"""Item range of ε = 0.2 GRPO's clip fraction over the first 300 updates at ``stale_k:256``."""
S0_TARGET = math.sqrt(0.0007 * 0.0005)
STALE_TARGET = math.sqrt(0.0066 * 0.0122)
"""Geometric means of the paper's two models (0.059 % and 0.90 %): the points :func:`choose_lr` aims at."""
DRIFT_SCHEDULES = {"s0": "stages:4", "s256": "stale_k:256"}


def drift_grid(lrs: list[float], updates: int = 300, world_params: dict[str, Any] | None = None) -> dict[str, Any]:
    """The sweep grid of the drift measurement: ε = 0.2 GRPO, each learning rate × {``stages:4``, ``stale_k:256``},
    ``updates`` updates from π₀, the world's other defaults (evaluation only at the end)."""
    base = {"world": "synthetic_lm", "world_params": dict(world_params or {}), "objective": "grpo",
            "objective_params": {"eps_low": 0.2, "eps_high": 0.2}, "updates": updates, "eval_every": updates,
            "sample_every": 0, "checkpoint_every": updates, "seed": 0}
    return {"base": base, "axes": {"lr": [{"label": f"{lr:g}", "lr": lr} for lr in lrs],
                                   "schedule": [{"label": k, "schedule": v} for k, v in DRIFT_SCHEDULES.items()]}}


def clip_fractions(sweep_dir: str | Path) -> list[dict[str, float]]:
    """Per learning rate of a finished :func:`drift_grid` sweep: the mean ``clip_frac`` over its updates at s = 0 and
    at s = 256 (nothing else of those runs is read)."""
    from offpolicylab.run_records import load_runs

    by_lr: dict[float, dict[str, float]] = {}
    for run in load_runs([sweep_dir]):
        lr = float(run.config["lr"])
        by_lr.setdefault(lr, {"lr": lr})[run.labels["schedule"]] = float(run.metrics["clip_frac"].mean())
    return [by_lr[lr] for lr in sorted(by_lr)]


def _log_distance(value: float, target: float) -> float:
    return abs(math.log(max(value, 1e-12) / target))


def choose_lr(rows: list[dict[str, float]]) -> tuple[float, str]:
    """The learning rate by the rule fixed before any stale run (``docs/synthetic_lm.md``): among the rates whose s = 0
    and s = 256 clip fractions both lie in their windows, the one minimising the larger of |log(c₀ / 0.059 %)| and
    |log(c₂₅₆ / 0.90 %)|; if none meets both, the stale one decides: among the rates inside the stale window (else
    all), the one with c₂₅₆ closest to 0.90 % on a log scale.  Returns (lr, which branch decided)."""
    def inside(value: float, window: tuple[float, float]) -> bool:
        return window[0] <= value <= window[1]

    both = [r for r in rows if inside(r["s0"], S0_WINDOW) and inside(r["s256"], STALE_WINDOW)]
    if both:
        best = min(both, key=lambda r: max(_log_distance(r["s0"], S0_TARGET), _log_distance(r["s256"], STALE_TARGET)))
        return best["lr"], "both windows met"
    stale = [r for r in rows if inside(r["s256"], STALE_WINDOW)]
    best = min(stale or rows, key=lambda r: _log_distance(r["s256"], STALE_TARGET))
    return best["lr"], ("no rate meets both windows; the stale window decides" if stale else
                        "no rate meets the stale window; closest stale clip fraction")


def drift_table(rows: list[dict[str, float]], updates: int) -> str:
    """Markdown: each learning rate's two clip fractions beside the paper's, with the windows."""
    papers = "; ".join(f"{name} {v['s0']:.2%} / {v['s256']:.2%}" for name, v in PAPER_CLIP_FRACTIONS.items())
    lines = [f"ε = 0.2 GRPO clip fraction, mean over updates 0–{updates - 1} (paper, Fig. 6d, mean over training: "
             f"{papers} at s = 0 / s = 256)", "",
             "| lr | s = 0 (stages:4) | in [0.03 %, 0.15 %] | s = 256 (stale_k:256) | in [0.3 %, 2.5 %] |",
             "|---:|---:|:---:|---:|:---:|"]
    for r in rows:
        yes = ["yes" if w[0] <= r[k] <= w[1] else "no" for k, w in (("s0", S0_WINDOW), ("s256", STALE_WINDOW))]
        lines.append(f"| {r['lr']:g} | {r['s0']:.3%} | {yes[0]} | {r['s256']:.3%} | {yes[1]} |")
    return "\n".join(lines)


def initial_success(world: SyntheticLM, policy: Any, samples: int = 32, seed: int = 0) -> dict[str, float]:
    """Shares of reward 1 and of valid format (reward > 0) and the mean reward, each with its standard error, over
    ``samples`` temperature-1 samples per evaluation prompt."""
    rollout = policy.sample(world.eval_prompts(), samples, 1.0, torch.Generator().manual_seed(seed))
    reward = rewards_of(world, rollout).double()
    out = {}
    for name, values in (("success", (reward == 1.0).double()), ("format_valid", (reward > 0).double()),
                         ("mean_reward", reward)):
        out[name] = float(values.mean())
        out[name + "_se"] = float(values.std() / math.sqrt(values.numel()))
    return out


def degenerate_scores(world: SyntheticLM) -> dict[str, float]:
    """m(y) of a one-token text loop and of a two-token text loop (ANS and a digit at the end) on evaluation
    prompt 0, next to θ."""
    width = world.max_response_len
    prompt = world.prompt_tokens[world.num_prompts][None]
    loops = torch.stack([torch.full((width,), FIRST_TEXT + 20),
                         torch.tensor([FIRST_TEXT + 20, FIRST_TEXT + 21] * width)[:width]])
    loops[:, -2], loops[:, -1] = ANS, 0
    m = world.teacher.mean_log_prob(prompt.expand(2, -1), loops)
    return {"theta": world.threshold, "one_token_loop": float(m[0]), "two_token_loop": float(m[1])}


def update_kls(config: TrainConfig) -> list[float]:
    """KL_u (module docstring) of each of the ``config.updates`` updates of a training run of ``config`` (the loss,
    KL penalty, proximal log-probs and clipping of that run), the consumed batch scored before and after each step."""
    return measured_updates(config)[1]


class UpdateKL(UpdateHook):
    """Observes a training run (:class:`~offpolicylab.trainer.UpdateHook`): KL_u of each update, the batch the update
    consumes scored before and after its step, and the run itself."""

    def __init__(self) -> None:
        self.kls: list[float] = []
        self.run: Run | None = None
        self._before: tuple[Any, torch.Tensor] | None = None

    def on_batch(self, update: int, stack: Stack, rollouts: list[Any]) -> None:
        (rollout,) = rollouts
        with torch.no_grad():
            self._before = rollout, torch.log_softmax(_logits(stack.policy, rollout).double(), -1)

    def on_update(self, update: int, stack: Stack, steps: list[Any], rows: list[dict[str, Any]]) -> None:
        rollout, before = self._before
        with torch.no_grad():
            after = torch.log_softmax(_logits(stack.policy, rollout).double(), -1)
        kl = (before.exp() * (before - after)).sum(-1)
        mask = rollout.response_mask
        self.kls.append(float((kl * mask).sum() / mask.sum()))
        (self.run,) = stack.members


def measured_updates(config: TrainConfig) -> tuple[Run, list[float]]:
    """(the run after the ``config.updates`` updates of a training run of ``config``, KL_u of each update): the loop's
    own run (:func:`~offpolicylab.trainer.train`, observed by :class:`UpdateKL`; its run directory is temporary)."""
    hook = UpdateKL()
    with tempfile.TemporaryDirectory() as folder:
        train(config, Path(folder) / "run", hooks=[hook])
    return hook.run, hook.kls


def _logits(policy: Any, rollout: Any) -> torch.Tensor:
    return policy.response_logits(rollout.prompt_ids, rollout.prompt_mask, rollout.prompt_index,
                                  rollout.response_ids)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="calibration measurements of the synthetic_lm world")
    parser.add_argument("--world-param", action="append", default=[], metavar="K=V")
    parser.add_argument("--profile", default=None,
                        help="reference token profile to compare with: a JSON file or a packaged profile's name")
    parser.add_argument("--lrs", default="", help="comma-separated learning rates for the per-update KL")
    parser.add_argument("--kl-updates", type=int, default=30)
    parser.add_argument("--success-samples", type=int, default=32)
    args = parser.parse_args(argv)
    world_params = {"preset": PROFILED_PRESET, **parse_assignments(args.world_param, "--world-param")}
    if world_params["preset"] not in PRESETS:
        parser.error(f"--world-param preset={world_params['preset']} is not a recipe-v5 preset; valid: "
                     f"{', '.join(PRESETS)} (recipes v6 and v7: experiments/synthetic_lm_v6_calibration.py)")
    world = make_world("synthetic_lm", **world_params)
    initial = world.pretrained_policy()
    print(seed_scale_table(world, initial))
    profile = policy_token_profile(world, initial)
    if args.profile:
        rows = compare_profiles(load_profile(args.profile), profile)
        print(format_comparison(rows, names=("reference", "synthetic_lm π₀")))
    else:
        print(json.dumps({k: v for k, v in profile.items() if not isinstance(v, list)}, indent=1))
    print("initial success:", json.dumps(initial_success(world, initial, args.success_samples)))
    print("degenerate text:", json.dumps(degenerate_scores(world)))
    for lr in [float(x) for x in args.lrs.split(",") if x]:
        config = TrainConfig.from_dict({"world": "synthetic_lm", "world_params": world_params, "objective": "grpo",
                                        "lr": lr, "updates": args.kl_updates})
        kls = update_kls(config)
        print(f"lr {lr:g}: per-update KL median {statistics.median(kls):.2e}, max {max(kls):.2e} "
              f"over {len(kls)} updates", flush=True)


if __name__ == "__main__":
    main()
