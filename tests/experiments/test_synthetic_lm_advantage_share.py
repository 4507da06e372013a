"""experiments/synthetic_lm_advantage_share.py: the share of tokens with a nonzero GRPO advantage on a hand-made
buffer, against the trainer's own advantages on a real run's buffer, and the token-weighted clip fraction given
Â ≠ 0 worked out by hand."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from offpolicylab.config import TrainConfig
from offpolicylab.objectives.advantages import group_advantages
from offpolicylab.trainer import train

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("advantage_share",
                                              ROOT / "experiments" / "synthetic_lm_advantage_share.py")
share = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(share)


def hand_buffer() -> dict[str, torch.Tensor]:
    """Two batches of four rows in groups of two.  Batch 0 (key 10): group 0 rewards (1, 0.1) moves, group 1
    (0, 0) does not; tokens 3 + 1 in group 0, 2 + 2 in group 1 → share 4 / 8.  Batch 1 (key 11): both groups equal
    (1, 1) and (0.1, 0.1) → share 0."""
    lengths = [3, 1, 2, 2, 4, 4, 1, 3]
    mask = torch.zeros(8, 4)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    return {"keys": torch.tensor([10, 11]), "rows": torch.tensor([4, 4]), "response_mask": mask,
            "rewards": torch.tensor([1.0, 0.1, 0.0, 0.0, 1.0, 1.0, 0.1, 0.1]),
            "group_ids": torch.tensor([0, 0, 1, 1, 0, 0, 1, 1]), "version": torch.tensor([2, 2, 2, 2, 3, 3, 3, 3])}


def test_share_by_hand() -> None:
    table = share.batch_table(hand_buffer())
    assert list(table["key"]) == [10, 11] and list(table["version"]) == [2, 3]
    assert list(table["tokens"]) == [8.0, 12.0]
    assert list(table["share_tokens"]) == [0.5, 0.0]
    assert list(table["share_groups"]) == [0.5, 0.0]
    assert list(table["success"]) == [0.25, 0.5]
    assert list(table["equal_with_residue"]) == [0.0, 0.0]  # two rewards of 0.1 average to 0.1 exactly
    assert list(table["residue_tokens"]) == [0.0, 0.0]


def test_three_rewards_of_0_9_are_a_group_with_residue() -> None:
    """float32: (0.9 + 0.9) + 0.9 rounds down, and divided by 3 it is one ulp below 0.9.  Three equal values have one
    summation order, so this holds on every CPU (eight can be summed pairwise, exactly, or in a row, not)."""
    buffer = {"keys": torch.tensor([5]), "rows": torch.tensor([6]), "response_mask": torch.ones(6, 2),
              "rewards": torch.tensor([0.9] * 3 + [0.0] * 3), "group_ids": torch.tensor([0] * 3 + [1] * 3),
              "version": torch.zeros(6, dtype=torch.long)}
    (row,) = share.batch_table(buffer).to_dict("records")
    assert row["equal_with_residue"] == 0.5 and row["residue_tokens"] == 0.5 and row["share_tokens"] == 0.0


def test_clip_fraction_given_nonzero_by_hand(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    torch.save({"buffer": hand_buffer(), "next_update": 10}, run / "checkpoint" / "state.pt")
    pd.DataFrame({"update": [9, 10, 11], "clip_frac": [0.9, 0.02, 0.01]}).to_csv(run / "metrics.csv", index=False)
    result = share.read_run(run)
    # token-weighted over the two batches (8 and 12 tokens): clip (0.02·8 + 0.01·12) / 20 = 0.014,
    # share (0.5·8 + 0·12) / 20 = 0.2, so 0.07 of the tokens with Â ≠ 0 were clipped
    assert result["clip_frac_logged"] == pytest.approx(0.014)
    assert result["share_tokens_logged"] == pytest.approx(0.2)
    assert result["clip_frac_given_nonzero"] == pytest.approx(0.07)
    assert result["keys"] == [10, 11] and result["versions"] == [2, 3] and result["logged_batches"] == 2


def test_matches_the_trainers_advantages_on_a_real_buffer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFPOLICYLAB_CACHE", str(tmp_path / "cache"))
    world = {"preset": "seed_scale_v6", "num_train_prompts": 16, "distill_steps": 1, "distill_batch": 4}
    config = TrainConfig(world="synthetic_lm", world_params=world, objective="grpo",
                         objective_params={"eps_low": 0.2, "eps_high": 0.2}, schedule="stale_k:3", updates=4,
                         lr=1e-2, seed=0, eval_every=4, eval_samples=1, sample_every=0, checkpoint_every=4)
    train(config, tmp_path / "run")
    buffer = torch.load(tmp_path / "run" / "checkpoint" / "state.pt", weights_only=True)["buffer"]
    table = share.batch_table(buffer)
    start = 0
    for count, fraction in zip(buffer["rows"].tolist(), table["share_tokens"], strict=True):
        part = slice(start, start + count)
        start += count
        advantages = group_advantages(buffer["rewards"][part], buffer["group_ids"][part], "std")
        mask = buffer["response_mask"][part].sum(1)
        assert fraction == pytest.approx(float(mask[advantages != 0].sum() / mask.sum()))
    result = share.read_run(tmp_path / "run")
    assert result["logged_batches"] == 0 and math.isnan(result["clip_frac_logged"])  # keys 4–6 lie beyond the run
