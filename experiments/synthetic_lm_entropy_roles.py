"""Token entropy H_t = −Σ_v π(v | x, y_<t) log π(v | x, y_<t) of π's own samples in the chain world (recipes v6 / v7),
by the token's role — text, ``=``, ANS, a step or answer digit, EOS — for π₀ and for the π of finished runs (their
last checkpoint): which tokens a run sharpened (docs/synthetic_lm_v7.md, part 20).

    python experiments/synthetic_lm_entropy_roles.py runs/v7s/long_s256 runs/v7s/long_s0 --json out.json

π₀ is read once, from the first run's world; every π scores its own samples (``--batches`` × ``--prompts`` prompts ×
the run's group size, drawn with one fixed generator).  The checkpoint is loaded with ``weights_only=True``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from offpolicylab.build import build
from offpolicylab.config import TrainConfig
from offpolicylab.rollouts import sample
from offpolicylab.run_dir import RunDir, write_json
from offpolicylab.stack import Run
from offpolicylab.worlds.synthetic_lm_v6 import ANS, EOS, NUM_DIGITS, STEP

ROLES = ("text", "=", "ANS", "digit", "EOS")


def roles(response: Tensor) -> Tensor:
    """Each response token's index in :data:`ROLES`, [B, T]: a digit right after ``=`` or ANS is a ``digit``."""
    previous = torch.cat([torch.full_like(response[:, :1], -1), response[:, :-1]], 1)
    role = torch.zeros_like(response)
    role[response == STEP] = ROLES.index("=")
    role[response == ANS] = ROLES.index("ANS")
    role[response == EOS] = ROLES.index("EOS")
    role[(response < NUM_DIGITS) & ((previous == STEP) | (previous == ANS))] = ROLES.index("digit")
    return role


def load_run(run_dir: Path, final: bool) -> Run:
    """The run of ``run_dir``'s config.json, its policy at the last checkpoint when ``final`` (else π₀)."""
    directory = RunDir(run_dir)
    run = build(TrainConfig.from_dict(directory.read_config()))
    if final:
        state = torch.load(directory.checkpoint_path, map_location="cpu", weights_only=True)
        run.policy.load_state_dict(state["policy"])
    return run


def entropy_by_role(run: Run, batches: int, prompts: int, seed: int = 123) -> dict[str, Any]:
    """Mean entropy per role over π's own samples, each role's share of the tokens and of the summed entropy, and
    the mean reward of the samples."""
    generator = torch.Generator().manual_seed(seed)
    entropies: list[Tensor] = []
    kinds: list[Tensor] = []
    rewards: list[Tensor] = []
    with torch.no_grad():
        for _ in range(batches):
            rollout = sample(run.policy, run.world.sample_prompts(prompts, generator), run.config, generator)
            _, entropy = run.policy.score(rollout)
            valid = rollout.response_mask.bool()
            entropies.append(entropy[valid])
            kinds.append(roles(rollout.response_ids)[valid])
            rewards.append(run.world.reward(rollout.prompt_index, rollout.response_ids, rollout.response_mask))
    entropy, kind = torch.cat(entropies).double(), torch.cat(kinds)
    result: dict[str, Any] = {"tokens": int(entropy.numel()), "entropy": float(entropy.mean()),
                              "reward": float(torch.cat(rewards).double().mean())}
    for index, name in enumerate(ROLES):
        chosen = entropy[kind == index]
        result[name] = {"entropy": float(chosen.mean()) if chosen.numel() else None,
                        "token_share": chosen.numel() / entropy.numel(),
                        "entropy_share": float(chosen.sum() / entropy.sum())}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished run directories of one chain world")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=64, help="prompts per batch")
    parser.add_argument("--json", type=Path, default=None, help="also write the table here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    table = {"pi0": entropy_by_role(load_run(args.runs[0], final=False), args.batches, args.prompts)}
    for run_dir in args.runs:
        table[str(run_dir)] = entropy_by_role(load_run(run_dir, final=True), args.batches, args.prompts)
    for label, row in table.items():
        cells = "  ".join(f"{name} {row[name]['entropy']:.3f} ({row[name]['token_share']:.0%})"
                          for name in ROLES if row[name]["entropy"] is not None)
        print(f"{label}: reward {row['reward']:.3f}  entropy {row['entropy']:.3f}  {cells}")
    if args.json:
        write_json(args.json, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
