"""Small, fast training configurations on the real toy worlds and readers of their metrics, shared by tests."""

from __future__ import annotations

import contextlib
import csv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from offpolicylab.config import TrainConfig
from offpolicylab.objectives import LossOutput, TokenBatch, get_objective, register, unregister

torch.set_num_threads(1)


def bandit_config(**changes: Any) -> TrainConfig:
    """A 3-arm bandit run of a few updates (cheap: T = 1, 16 responses per update)."""
    base: dict[str, Any] = dict(world="three_arm_pitfall", objective="reinforce", updates=6, prompts_per_update=4,
                                group_size=4, optimizer="sgd", lr=0.5, eval_every=100, sample_every=0,
                                checkpoint_every=100)
    base.update(changes)
    return TrainConfig(**base)


def mdp_config(**changes: Any) -> TrainConfig:
    """A token MDP small enough to enumerate in milliseconds (V = 3, T = 3, 2 prompts)."""
    base: dict[str, Any] = dict(world="token_mdp", world_params={"vocab_size": 3, "length": 3, "num_prompts": 2},
                                objective="grpo", updates=8, prompts_per_update=2, group_size=4, eval_every=4,
                                sample_every=4, checkpoint_every=1)
    base.update(changes)
    return TrainConfig(**base)


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path / "metrics.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def column(path: Path, name: str) -> list[float]:
    return [float(row[name]) for row in read_rows(path)]


def train_killed_at(config: TrainConfig, out: Path, next_update: int, monkeypatch: Any) -> None:
    """Train ``config`` into ``out`` and die (KeyboardInterrupt, like a kill) when the checkpoint of
    ``next_update`` is about to be saved; the checkpoint saving is restored afterwards."""
    from offpolicylab import trainer
    from offpolicylab.run_dir import RunDir

    save = RunDir.save_checkpoint

    def dies(self: RunDir, state: dict) -> None:
        if state["next_update"] == next_update:
            raise KeyboardInterrupt
        save(self, state)

    monkeypatch.setattr(RunDir, "save_checkpoint", dies)
    try:
        trainer.train(config, out)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError(f"the run ended without reaching the checkpoint of update {next_update}")
    finally:
        monkeypatch.setattr(RunDir, "save_checkpoint", save)


@contextlib.contextmanager
def nan_objective(base: str, after: int) -> Iterator[str]:
    """Registers, for the ``with`` block, an objective that is ``base`` with a NaN loss once it has been updated more
    than ``after`` times (a fault, through the public extension API); yields its name."""
    parent = type(get_objective(base))
    name = f"test_{base}_nan_after_{after}"

    @register(name)
    class NanAfter(parent):  # type: ignore[valid-type, misc]
        """``base`` with a NaN loss after ``after`` updates."""

        updates = 0

        def update(self, batch: TokenBatch) -> None:
            self.updates += 1
            super().update(batch)

        def __call__(self, batch: TokenBatch, *, metrics: bool = True) -> LossOutput:
            out = super().__call__(batch, metrics=metrics)
            return out if self.updates <= after else LossOutput(out.loss * float("nan"), out.metrics, out.token_mask)

    try:
        yield name
    finally:
        unregister(name)
