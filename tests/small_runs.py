"""Small, fast training configurations on the real toy worlds and readers of their metrics, shared by tests."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import torch

from offpolicylab.config import TrainConfig

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
    from offpolicylab.runs import RunDir

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
