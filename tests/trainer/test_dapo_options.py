"""DAPO's run options (Yu et al. 2025, arXiv:2503.14476): the soft overlong punishment (eq. 13) and dynamic sampling
(eq. 11), with values worked by hand; both off by default (the golden runs, tests/trainer/test_golden.py, are
unchanged)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from offpolicylab import trainer
from offpolicylab.build import build
from offpolicylab.config import TrainConfig, overlong_limit
from offpolicylab.profiling import Stopwatch
from offpolicylab.rollouts import overlong_penalty, varied_rows
from offpolicylab.stack import Run, Stack
from offpolicylab.step import own_reward, shaping_columns
from tests.small_runs import column, mdp_config, read_rows, train_killed_at


# ------------------------------------------------------------------------------------ overlong punishment
def test_overlong_penalty_by_hand() -> None:
    """L_max = 10, L_cache = 4: 0 up to 6 tokens, then (6 − |y|)/4, −1 past 10; the factor scales it."""
    lengths = torch.tensor([3, 6, 7, 8, 10, 11])
    want = [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    assert overlong_penalty(lengths, 10, 4).tolist() == want
    assert overlong_penalty(lengths, 10, 4, 0.5).tolist() == [0.5 * w for w in want]
    assert overlong_penalty(lengths, 10, 0).tolist() == [0, 0, 0, 0, 0, -1.0]


def test_overlong_limit_is_the_option_else_the_worlds_response_length() -> None:
    """L_max: overlong_max_len = 5 when given; unset, the world's max_response_len (here 8)."""
    world = SimpleNamespace(max_response_len=8)
    assert overlong_limit(TrainConfig(overlong_max_len=5), world) == 5
    assert overlong_limit(TrainConfig(), world) == 8


def test_overlong_penalty_equals_trl_reward() -> None:
    rewards = pytest.importorskip("trl.rewards")
    lengths = list(range(0, 24))
    punish = rewards.get_soft_overlong_punishment(max_completion_len=20, soft_punish_cache=7)
    expected = punish([[1] * n for n in lengths])
    assert overlong_penalty(torch.tensor(lengths), 20, 7).tolist() == pytest.approx(expected, abs=1e-15)


def test_overlong_run_shifts_rewards_not_training(tmp_path: Path) -> None:
    """token_mdp without EOS: every response has T = 3 tokens; L_max = 3, L_cache = 2 → R_length = (1 − 3)/2 = −1
    for every row.  A constant shift leaves group advantages and so the training unchanged: the losses are equal,
    reward_mean is 1 lower, overlong_penalty is −1 (equal up to float32 rounding of the shifted rewards)."""
    trainer.train(mdp_config(), tmp_path / "plain")
    trainer.train(mdp_config(overlong_buffer=2), tmp_path / "shaped")
    for name in ("grad_norm", "exact_return"):
        shaped = [row[name] for row in read_rows(tmp_path / "shaped") if row[name]]
        plain = [row[name] for row in read_rows(tmp_path / "plain") if row[name]]
        assert shaped and list(map(float, shaped)) == pytest.approx(list(map(float, plain)), rel=1e-4)
    assert column(tmp_path / "shaped", "overlong_penalty") == [-1.0] * 8
    shaped, plain = column(tmp_path / "shaped", "reward_mean"), column(tmp_path / "plain", "reward_mean")
    assert shaped == pytest.approx([r - 1.0 for r in plain], abs=1e-6)
    assert "overlong_penalty" not in read_rows(tmp_path / "plain")[0]


def test_overlong_buffer_longer_than_max_len_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="overlong_buffer=4 exceeds"):
        trainer.train(mdp_config(overlong_buffer=4), tmp_path / "run")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------------ dynamic sampling
class ScriptedRewards:
    """A world whose reward calls return the given rounds in order (each round: one list of rewards per group, rows
    of a group consecutive, as the policy samples them); everything else is the wrapped world's."""

    def __init__(self, world: object, rounds: list[list[list[float]]]) -> None:
        self.world, self.rounds = world, iter(rounds)

    def reward(self, prompt_index: torch.Tensor, response_ids: torch.Tensor, response_mask: torch.Tensor,
               generator: torch.Generator | None = None) -> torch.Tensor:
        rewards = torch.tensor(next(self.rounds), dtype=torch.float32).flatten()
        assert rewards.shape == prompt_index.shape  # one reward per sampled row
        return rewards

    def __getattr__(self, name: str) -> object:
        return getattr(self.world, name)


def scripted_run(rounds: list[list[list[float]]], **changes) -> Run:
    """A dynamic-sampling run (2 prompts × 2 responses per round) whose world rewards are ``rounds``."""
    run = build(TrainConfig(**{**mdp_config().to_dict(), "dynamic_sampling": True, "group_size": 2,
                                       **changes}))
    run.world = ScriptedRewards(run.world, rounds)
    return run


def test_dynamic_sampling_keeps_varied_groups_by_hand() -> None:
    """N = 2 prompts: round 1 has one varied group ([0, 1]), round 2 another ([1, 0]) → the batch is those two,
    group ids 0, 1; 2 rounds, 2 of 4 groups kept; reward_current sees all 8 sampled rewards."""
    run = scripted_run([[[1, 1], [0, 1]], [[0, 0], [1, 0]], [[5, 6], [7, 8]]])
    (collected,) = trainer.collect(Stack.one(run), 0, Stopwatch())
    batch = trainer.take(run, 0)
    assert batch.rewards.tolist() == [0, 1, 1, 0] and batch.group_ids.tolist() == [0, 0, 1, 1]
    assert (collected.rounds, collected.groups, collected.kept) == (2, 4, 2)
    assert float(own_reward(collected.fresh, 0)) == pytest.approx(4 / 8)
    assert shaping_columns(run, collected) == {"dynamic_rounds": 2.0, "dynamic_kept_frac": 0.5}


def test_dynamic_sampling_truncates_and_fills() -> None:
    """Three varied groups over two rounds → the first two; with one round allowed and one varied group, the batch
    is filled with the first equal-reward group."""
    run = scripted_run([[[0, 1], [1, 1]], [[2, 3], [4, 5]]])
    (collected,) = trainer.collect(Stack.one(run), 0, Stopwatch())
    assert trainer.take(run, 0).rewards.tolist() == [0, 1, 2, 3]
    assert (collected.rounds, collected.groups, collected.kept) == (2, 4, 3)
    run = scripted_run([[[1, 1], [0, 1]]], dynamic_sampling_max_batches=1)
    (collected,) = trainer.collect(Stack.one(run), 0, Stopwatch())
    batch = trainer.take(run, 0)
    assert batch.rewards.tolist() == [0, 1, 1, 1] and batch.group_ids.tolist() == [0, 0, 1, 1]
    assert (collected.rounds, collected.groups, collected.kept) == (1, 2, 1)


def test_dynamic_sampling_run_trains_on_varied_groups(tmp_path: Path) -> None:
    """Real sampling (token_mdp, G = 4): every group of a batch has unequal rewards whenever the rounds found
    enough; a run writes the columns, and its seeds train one after another."""
    from offpolicylab.batched import train_seeds

    run = build(mdp_config(dynamic_sampling=True, group_size=2))
    for update in range(6):
        (collected,) = trainer.collect(Stack.one(run), update, Stopwatch())
        batch = trainer.take(run, update)
        assert batch.group_ids.tolist() == [0, 0, 1, 1]
        if collected.kept >= 2:
            assert varied_rows(batch.rewards, batch.group_ids).all()
    train_seeds(mdp_config(dynamic_sampling=True), [0, 1], tmp_path)
    for seed in (0, 1):
        rows = read_rows(tmp_path / f"seed={seed}")
        assert len(rows) == 8 and all(float(row["dynamic_rounds"]) >= 1 for row in rows)
        assert all(0 < float(row["dynamic_kept_frac"]) <= 1 for row in rows)
        assert math.isfinite(column(tmp_path / f"seed={seed}", "loss")[-1])


def test_dynamic_sampling_cells_train_alone(tmp_path: Path) -> None:
    """Each run samples as often as it needs, so no two runs can share one stacked sampling call."""
    from offpolicylab import batched, sweep
    from offpolicylab import grid as grid_module

    base = {**mdp_config().to_dict(), "dynamic_sampling": True}
    cells = grid_module.expand_grid({"base": base, "axes": {"seed": [0, 1, 2]}}, tmp_path)
    assert sweep.seed_groups(cells) == [[0], [1], [2]]
    with pytest.raises(ValueError, match="dynamic_sampling"):
        batched.check_together([TrainConfig(**base), TrainConfig(**{**base, "seed": 1})])


def test_dynamic_sampling_and_overlong_runs_resume_identically(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed after update 5's row, before its checkpoint: the resumed run's metrics equal an uninterrupted one's
    (the extra sampling rounds draw from the run's own generator, which the checkpoint holds)."""

    config = mdp_config(dynamic_sampling=True, overlong_buffer=1, schedule="stale_k:2", updates=8,
                        world_params={"vocab_size": 3, "length": 3, "num_prompts": 2, "eos": True})
    trainer.train(config, tmp_path / "full")
    train_killed_at(config, tmp_path / "cut", 6, monkeypatch)
    trainer.train(config, tmp_path / "cut", resume=True)

    def strip(rows: list[dict[str, str]]) -> list[dict[str, str]]:
        return [{k: v for k, v in r.items() if not k.startswith("time_")} for r in rows]

    assert strip(read_rows(tmp_path / "cut")) == strip(read_rows(tmp_path / "full"))
    assert any(float(r["overlong_penalty"]) < 0 for r in read_rows(tmp_path / "full"))


def test_a_stack_of_several_members_refuses_dynamic_sampling(tmp_path: Path) -> None:
    """Dynamic sampling runs in a stack of one only: Stack.of and train_together refuse it with one line naming
    what is valid, before any file is written; run --seeds trains such seeds one after another."""
    from offpolicylab.batched import train_together

    configs = [mdp_config(dynamic_sampling=True, seed=seed) for seed in (0, 1)]
    runs = [build(config) for config in configs]
    with pytest.raises(ValueError, match=r"^runs with dynamic_sampling cannot train together .*; valid: train them "
                                         r"one after another \(run --seeds and a sweep do\)$"):
        Stack.of(runs, [None, None], [run.optimizer.state_dict() for run in runs], [torch.get_rng_state()] * 2)
    with pytest.raises(ValueError, match="^runs with dynamic_sampling cannot train together"):
        train_together(configs, [tmp_path / "a", tmp_path / "b"])
    assert not any(tmp_path.iterdir())
