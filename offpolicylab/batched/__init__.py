"""Runs trained as one computation: several seeds of one configuration (``offpolicylab run --seeds 0,1,2``), or a
sweep's cells that differ only in seed and objective (docs/design.md, "Batched seeds").

A layer above the trainer: it checks that the runs can train together, builds each with
:func:`offpolicylab.build.build`, stacks them (:meth:`offpolicylab.stack.Stack.of`) and hands the stack to the
trainer's one update loop (:func:`offpolicylab.trainer.run_updates`).  Every run writes the run directory its
separate run writes.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from offpolicylab.build import build, check_memory
from offpolicylab.config import MAX_SEED, TrainConfig
from offpolicylab.lifecycle import (
    checked_resume,
    guarded,
    open_run,
    open_trackers,
    resolve_config,
    write_summary,
)
from offpolicylab.policies import policy_ability
from offpolicylab.profiling import Stopwatch
from offpolicylab.progress import describe_run, log
from offpolicylab.run_dir import RunDir, RunError
from offpolicylab.stack import Run, Stack, check_stackable, stack_policies, stackable
from offpolicylab.trainer import run_updates, train

MEMBER_FIELDS = ("seed", "objective", "objective_params")
"""The fields in which the runs trained together by :func:`train_together` may differ."""

__all__ = ["MEMBER_FIELDS", "Stack", "parse_seeds", "seed_dir", "train_seeds", "train_together"]


def train_seeds(config: TrainConfig, seeds: list[int], run_dirs: str | Path | list[str | Path], *,
                resume: bool = False, progress: bool | str = False, profile: bool = False) -> list[dict[str, Any]]:
    """Train ``config`` once per seed of ``seeds``, writing for seed S the run directory that ``train`` of
    ``config`` with ``seed=S`` writes — ``run_dirs[i]`` for ``seeds[i]``, or ``run_dirs/seed=S`` when one folder is
    given — and return the summaries.  Policy kinds that stack train all seeds as one computation; others train
    them one after another."""
    configs = [replace(config, seed=seed) for seed in seeds]
    if isinstance(run_dirs, (str, Path)):
        run_dirs = [seed_dir(run_dirs, seed) for seed in seeds]
    if len(run_dirs) != len(seeds):
        raise ValueError(f"{len(seeds)} seeds but {len(run_dirs)} run directories")
    if policy_ability(config.policy, "stack") is None or len(seeds) == 1 or config.dynamic_sampling:
        if progress and len(seeds) > 1 and config.dynamic_sampling:
            log("offpolicylab: dynamic_sampling samples as often as each seed needs: the seeds train one after "
                "another")
        elif progress and len(seeds) > 1:
            log(f"offpolicylab: policy {config.policy} trains its seeds one after another (batched: "
                f"{', '.join(stackable())})")
        return [train(c, path, resume=resume, progress=progress, profile=profile)
                for c, path in zip(configs, run_dirs, strict=True)]
    return train_together(configs, run_dirs, resume=resume, progress=progress, profile=profile)


def train_together(configs: list[TrainConfig], run_dirs: list[str | Path], *, resume: bool = False,
                   progress: bool | str = False, profile: bool = False) -> list[dict[str, Any]]:
    """Train the runs ``configs`` — one stackable policy kind, equal in every field but :data:`MEMBER_FIELDS` —
    as one computation, ``configs[i]`` writing ``run_dirs[i]`` as ``train(configs[i], run_dirs[i])`` does; returns
    the summaries.  Everything that can refuse the command is checked for every run before any file is written."""
    check_together(configs)
    directories = [RunDir(path, fsync=configs[0].fsync) for path in run_dirs]
    runs, rng_states = build_runs(configs)
    stack_policies(configs[0].policy, [run.policy for run in runs])  # a stack the kind refuses, before writing
    check_memory(runs[0].config, runs[0].world, len(runs))
    check_directories(directories, runs, resume)
    with contextlib.ExitStack() as locks:
        for directory in directories:
            locks.enter_context(directory.locked())
        openings = open_trackers(directories, runs, resume)  # every seed's, before any seed's file is written
        starts = []
        for index, (directory, run) in enumerate(zip(directories, runs, strict=True)):
            starts.append(open_run(directory, run, resume, openings[index]))
            if resume:  # the global RNG state its checkpoint recorded
                rng_states[index] = torch.get_rng_state()
        if progress:
            log(describe_run(runs[0].config, runs[0].memory_plan) +
                f"; seeds {','.join(str(c.seed) for c in configs)} batched")
        stack = Stack.of(runs, directories, [run.optimizer.state_dict() for run in runs], rng_states)
        watch = Stopwatch()
        statuses = guarded(directories, profile, lambda: run_updates(stack, starts[0], watch, progress), watch,
                           starts[0])
        return [write_summary(directory, run, status)
                for directory, run, status in zip(directories, runs, statuses, strict=True)]


def check_together(configs: list[TrainConfig]) -> None:
    """``ValueError`` unless ``configs`` can train as one computation (:func:`train_together`)."""
    if policy_ability(configs[0].policy, "stack") is None:
        raise ValueError(f"policy {configs[0].policy} cannot train runs together; valid: {', '.join(stackable())}")
    check_stackable(configs[0])
    shared = [{k: v for k, v in c.to_dict().items() if k not in MEMBER_FIELDS} for c in configs]
    differ = sorted({k for other in shared[1:] for k in other if other[k] != shared[0][k]})
    if differ:
        raise ValueError(f"runs trained together must agree in every field but {', '.join(MEMBER_FIELDS)}; "
                         f"{', '.join(differ)} differ")


def build_runs(configs: list[TrainConfig]) -> tuple[list[Run], list[torch.Tensor]]:
    """:func:`~offpolicylab.build.build` of each config, and the global RNG state after each build (what each
    separate run's checkpoint records: the toy policies draw nothing from the global RNG once built)."""
    runs, states = [], []
    for config in configs:
        runs.append(build(config))
        states.append(torch.get_rng_state())
    return runs, states


def check_directories(directories: list[RunDir], runs: list[Run], resume: bool) -> None:
    """Refuse, before anything is written, a directory that is a file or in use, that a fresh run would overwrite,
    or (``resume``) whose stored run does not resume (:func:`~offpolicylab.lifecycle.checked_resume`, and its
    metrics.csv against its checkpoint: :meth:`~offpolicylab.run_dir.RunDir.check_metrics`) or whose checkpoint is at
    another update than the others'."""
    for directory in directories:
        directory.check_free()
    if not resume:
        taken = [str(d.path) for d in directories if d.holds_run()]
        if taken:
            raise RunError(f"run directory {taken[0]} already holds a run; pass --resume to continue the seeds or "
                           "choose another --out")
        return
    updates = {}
    for directory, run in zip(directories, runs, strict=True):
        state = checked_resume(directory, resolve_config(run.config, run.objective), run.config)
        updates[directory.path.name] = 0 if state is None else int(state["next_update"])
        directory.check_metrics(updates[directory.path.name], state)  # what open_run cuts back, checked first
    if len(set(updates.values())) > 1:
        found = ", ".join(f"{name} at update {value}" for name, value in updates.items())
        raise RunError(f"the seeds' checkpoints are at different updates ({found}); valid: resume each seed on its "
                       "own (--seed S --out DIR/seed=S --resume)")


def seed_dir(out_dir: str | Path, seed: int) -> Path:
    """The run directory of seed ``seed`` of a ``--seeds`` run (a sweep cell's name for its seed axis)."""
    return Path(out_dir) / f"seed={seed}"


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` → [0, 1, 2]: distinct integers in 0 … 2³² − 1; anything else raises ``ValueError``."""
    items = [item.strip() for item in str(text).split(",")]
    valid = f"valid: comma-separated distinct integers in 0..{MAX_SEED}, e.g. 0,1,2"
    if not all(item.isdigit() for item in items):
        raise ValueError(f"--seeds {text!r} is malformed; {valid}")
    seeds = [int(item) for item in items]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {text!r} has a repeated seed; {valid}")
    if max(seeds) > MAX_SEED:
        raise ValueError(f"--seeds {text!r} has a seed out of range; {valid}")
    return seeds
