"""Calibration measurements of the synthetic-LM world (the numbers ``docs/synthetic_lm.md`` records).

    python -m offpolicylab.synthetic_lm_calibration [--world-param k=v ...] [--profile PROFILE.json]
                                            [--lrs 1e-4,3e-4,1e-3] [--kl-updates 30] [--success-samples 32]

prints (1) π₀'s token profile on temperature-1 samples (one per training prompt) side by side with a reference
profile (``offpolicylab.diagnostics.profile``, the same statistics code as ``offpolicylab calibrate``), (2) π₀'s
initial success on the evaluation prompts (share of reward 1, of valid format, mean reward, with standard errors),
(3) m(y) of degenerate responses against θ, and (4) for each learning rate, the per-update KL between consecutive
policies of short on-policy GRPO runs with the world's training defaults:

    KL_u = mean over the batch's response tokens of Σ_v π_u(v | x, y_{<t}) [log π_u(v | ·) − log π_{u+1}(v | ·)]

(exact over the vocabulary at each sampled position, the batch the update was computed on).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from typing import Any

import torch

from offpolicylab.config import TrainConfig, parse_assignments
from offpolicylab.diagnostics.profile import compare_profiles, format_comparison, load_profile, token_profile
from offpolicylab.worlds import make_world
from offpolicylab.worlds.synthetic_lm import ANS, FIRST_TEXT, SyntheticLM


def policy_token_profile(world: SyntheticLM, policy: Any, samples_per_prompt: int = 1, seed: int = 0) -> dict:
    """Token profile of ``policy``'s temperature-1 samples on every training prompt."""
    prompts = world._prompts(torch.arange(world.num_prompts))
    rollout = policy.sample(prompts, samples_per_prompt, 1.0, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        logp, entropy = policy.score(rollout)
    return token_profile(entropy, logp, rollout.response_mask)


def initial_success(world: SyntheticLM, policy: Any, samples: int = 32, seed: int = 0) -> dict[str, float]:
    """Shares of reward 1 and of valid format (reward > 0) and the mean reward, each with its standard error, over
    ``samples`` temperature-1 samples per evaluation prompt."""
    rollout = policy.sample(world.eval_prompts(), samples, 1.0, torch.Generator().manual_seed(seed))
    reward = world.reward(rollout.prompt_index, rollout.response_ids, rollout.response_mask).double()
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


def update_kls(config: TrainConfig, updates: int) -> list[float]:
    """KL_u (module docstring) for ``updates`` on-policy updates of ``config``."""
    from offpolicylab.trainer import Stopwatch, build, generate, group_advantages, token_batch

    parts = build(config)
    params = list(parts.policy.trainable_parameters())
    kls = []
    for update in range(updates):
        rollout = generate(parts, update, Stopwatch())
        advantages = group_advantages(rollout.rewards, rollout.group_ids, parts.advantage == "std")
        logp, entropy = parts.policy.score(rollout)
        batch = token_batch(rollout, logp, entropy, advantages, update)
        parts.objective.update(batch)
        loss = parts.objective(batch).loss
        parts.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
        with torch.no_grad():
            before = torch.log_softmax(_logits(parts.policy, rollout).double(), -1)
            parts.optimizer.step()
            after = torch.log_softmax(_logits(parts.policy, rollout).double(), -1)
            kl = (before.exp() * (before - after)).sum(-1)
            mask = rollout.response_mask
            kls.append(float((kl * mask).sum() / mask.sum()))
    return kls


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
    world_params = parse_assignments(args.world_param, "--world-param")
    world = make_world("synthetic_lm", **world_params)
    pi0 = world.pretrained_policy()
    profile = policy_token_profile(world, pi0)
    if args.profile:
        rows = compare_profiles(load_profile(args.profile), profile)
        print(format_comparison(rows, names=("reference", "synthetic_lm π₀")))
    else:
        print(json.dumps({k: v for k, v in profile.items() if not isinstance(v, list)}, indent=1))
    print("initial success:", json.dumps(initial_success(world, pi0, args.success_samples)))
    print("degenerate text:", json.dumps(degenerate_scores(world)))
    for lr in [float(x) for x in args.lrs.split(",") if x]:
        config = TrainConfig.from_dict({"world": "synthetic_lm", "world_params": world_params, "objective": "grpo",
                                        "lr": lr, "updates": args.kl_updates})
        kls = update_kls(config, args.kl_updates)
        print(f"lr {lr:g}: per-update KL median {statistics.median(kls):.2e}, max {max(kls):.2e} "
              f"over {len(kls)} updates", flush=True)


if __name__ == "__main__":
    main()
