"""Seeds batched together for the transformer policy: the stacked network answers block s with member s — scoring
logits, KV-cached sampling and gradients equal each member's own, bit for bit — and a batched ``--seeds`` run on
the (tiny) synthetic-LM world writes each seed's separate run directory bit for bit, resume and sweeps included."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from offpolicylab import batched, sweep, trainer
from offpolicylab import grid as grid_module
from offpolicylab.config import TrainConfig
from offpolicylab.contracts import Prompts
from offpolicylab.policies.transformer import TransformerPolicy
from offpolicylab.policies.transformer_stack import StackedTransformerPolicy, stack_modules
from offpolicylab.stack import stack_policies
from tests.trainer.golden_runs import normalized_metrics
from tests.trainer.test_seeds import assert_same_run, interrupted

SEEDS = [3, 7, 11]
ROWS = 5  # rows per member
TINY_WORLD = {"preset": "seed_scale", "vocab_size": 32, "response_len": 8, "num_keys": 4, "num_train_prompts": 16, "d_model": 16,
              "num_heads": 2, "num_layers": 2, "distill_steps": 20, "distill_batch": 16}


def _policy(seed: int, d_model: int = 16, num_heads: int = 4) -> TransformerPolicy:
    return TransformerPolicy(vocab_size=20, response_len=6, prompt_vocab_size=25, max_prompt_len=5, d_model=d_model,
                             num_layers=2, num_heads=num_heads, seed=seed)


def _prompts(rows: int) -> Prompts:
    ids = torch.randint(25, (rows, 5), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(rows, 5)
    mask[::2, :2] = 0  # left padding on every other row
    return Prompts(ids=ids, mask=mask, index=torch.arange(rows))


def _stacked(**sizes: int) -> tuple[StackedTransformerPolicy, list[TransformerPolicy]]:
    """The stack of three members, and three independent copies of those members."""
    members = [_policy(seed, **sizes) for seed in SEEDS]
    alone = [_policy(seed, **sizes) for seed in SEEDS]
    return StackedTransformerPolicy(members), alone


def _block(value: Any, s: int, rows: int = ROWS) -> Any:
    return value[s * rows:(s + 1) * rows]


# ------------------------------------------------------------------------------------------------ the network
@pytest.mark.parametrize("sizes", [{}, {"d_model": 8, "num_heads": 2}, {"d_model": 24, "num_heads": 3}])
def test_stacked_scoring_logits_and_gradients_equal_each_members_own_bit_for_bit(sizes: dict[str, int]) -> None:
    """Also at widths where one batched matrix product over the blocks would sum in another order than each
    member's own (d_model 8)."""
    stacked, alone = _stacked(**sizes)
    prompts = _prompts(3 * ROWS)
    response = torch.randint(20, (3 * ROWS, 6), generator=torch.Generator().manual_seed(2))
    logits = stacked.response_logits(prompts.ids, prompts.mask, prompts.index, response)
    weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(3))
    (logits * weights).sum().backward()
    for s, member in enumerate(alone):
        own = member.response_logits(_block(prompts.ids, s), _block(prompts.mask, s), _block(prompts.index, s),
                                     _block(response, s))
        assert torch.equal(own, _block(logits, s))
        (own * _block(weights, s)).sum().backward()
        grads = dict(member.model.named_parameters())
        for name, param in stacked.model.named_parameters():
            assert torch.equal(param.grad[s], grads[name].grad), name


def test_stacked_kv_cached_sampling_draws_what_each_member_draws_alone_and_agrees_with_scoring() -> None:
    stacked, alone = _stacked()
    prompts = _prompts(3)
    together = stacked.sample(Prompts(prompts.ids.repeat(3, 1), prompts.mask.repeat(3, 1), prompts.index.repeat(3)),
                              2, 0.8, [torch.Generator().manual_seed(10 + s) for s in range(3)])
    assert (stacked.score(together)[0].detach() - together.behavior_logp).abs().max() < 1e-5
    for s, member in enumerate(alone):
        own = member.sample(prompts, 2, 0.8, torch.Generator().manual_seed(10 + s))
        for name in ("response_ids", "response_mask", "behavior_logp", "prompt_ids", "group_ids"):
            expected = _block(getattr(together, name), s, rows=6)
            assert torch.equal(getattr(own, name), expected - 3 * s if name == "group_ids" else expected), name
    greedy = stacked.greedy(Prompts(prompts.ids.repeat(3, 1), prompts.mask.repeat(3, 1), prompts.index.repeat(3)))
    for s, member in enumerate(alone):
        assert torch.equal(member.greedy(prompts).response_ids, greedy.response_ids[3 * s:3 * s + 3])


def test_members_are_views_of_their_slices_and_the_stack_refuses_what_it_cannot_do() -> None:
    members = [_policy(seed) for seed in SEEDS]
    stacked = stack_policies("transformer", members)
    assert isinstance(stacked, StackedTransformerPolicy)
    with torch.no_grad():
        stacked.model.head.weight[1] += 1.0  # what an optimizer step does to the stack ...
    assert torch.equal(members[1].state_dict()["head.weight"], _policy(7).state_dict()["head.weight"] + 1.0)
    assert torch.equal(members[0].state_dict()["head.weight"], _policy(3).state_dict()["head.weight"])
    with pytest.raises(TypeError, match="checkpoint its members"):
        stacked.state_dict()
    with pytest.raises(ValueError, match="must share shape"):
        StackedTransformerPolicy([_policy(0), TransformerPolicy(vocab_size=20, response_len=5, max_prompt_len=5,
                                                                d_model=16, num_heads=4)])
    with pytest.raises(ValueError, match="GRU.*cannot be stacked"):
        stack_modules([torch.nn.GRU(2, 2), torch.nn.GRU(2, 2)])


# ------------------------------------------------------------------------------------------------ runs
@pytest.fixture(scope="module")
def world_params(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return {**TINY_WORLD, "cache_dir": str(tmp_path_factory.mktemp("slm_cache"))}


def _config(world_params: dict[str, Any], **changes: Any) -> TrainConfig:
    base: dict[str, Any] = {"world": "synthetic_lm", "world_params": world_params, "objective": "grpo", "updates": 6,
                            "prompts_per_update": 2, "group_size": 4, "eval_every": 3, "sample_every": 2,
                            "checkpoint_every": 2}
    return TrainConfig.from_dict({**base, **changes})


@pytest.mark.parametrize("changes", [{}, {"objective": "m2po", "schedule": "stale_k:2"},
                                     {"objective": "cispo", "schedule": "mixture:0.5"},
                                     {"policy_params": {"token_draw": "inverse_cdf"}}],
                         ids=["grpo", "m2po_stale", "cispo_mixture", "inverse_cdf"])
def test_batched_seeds_write_the_separate_runs_bit_for_bit(world_params: dict[str, Any], changes: dict[str, Any],
                                                           tmp_path: Path) -> None:
    config = _config(world_params, **changes)
    summaries = batched.train_seeds(config, SEEDS, tmp_path / "batched")
    assert [s["status"] for s in summaries] == ["completed"] * 3
    for seed in SEEDS:
        alone = tmp_path / f"alone{seed}"
        trainer.train(dataclasses.replace(config, seed=seed), alone)
        assert_same_run(tmp_path / "batched" / f"seed={seed}", alone)
    assert normalized_metrics(tmp_path / "batched" / "seed=3") != normalized_metrics(tmp_path / "batched" / "seed=7")


def test_batched_seeds_of_a_small_random_transformer_on_an_enumerable_world(tmp_path: Path) -> None:
    """``init=random`` on a token MDP: the exact evaluation (return and KL by enumeration) goes through the stack."""
    config = TrainConfig(world="token_mdp", world_params={"vocab_size": 3, "length": 3, "num_prompts": 2, "eos": True},
                         policy="transformer", policy_params={"init": "random", "d_model": 8, "num_heads": 2,
                                                              "num_layers": 1},
                         objective="grpo", schedule="mixture:0.5", updates=5, prompts_per_update=2, group_size=4,
                         eval_every=2, sample_every=2, checkpoint_every=2)
    batched.train_seeds(config, SEEDS, tmp_path / "batched")
    for seed in SEEDS:
        alone = tmp_path / f"alone{seed}"
        trainer.train(dataclasses.replace(config, seed=seed), alone)
        assert_same_run(tmp_path / "batched" / f"seed={seed}", alone)
    assert "exact_return" in (tmp_path / "alone3" / "metrics.csv").read_text().splitlines()[0]


def test_batched_transformer_run_resumes_per_seed(world_params: dict[str, Any], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed while the first seed saves its last checkpoint (8; every seed's last saved one is 4): the batched
    resume, and one seed resumed on its own, end identical to the uninterrupted separate runs."""
    config = _config(world_params, updates=8, schedule="stale_k:2", checkpoint_every=4)
    interrupted(config, tmp_path / "batched", monkeypatch, at=8)
    cut = tmp_path / "cut"
    interrupted(config, cut, monkeypatch, at=8)
    batched.train_seeds(config, SEEDS, tmp_path / "batched", resume=True)
    trainer.train(dataclasses.replace(config, seed=7), cut / "seed=7", resume=True)
    for seed in SEEDS:
        alone = tmp_path / f"alone{seed}"
        trainer.train(dataclasses.replace(config, seed=seed), alone)
        assert_same_run(tmp_path / "batched" / f"seed={seed}", alone, resumed_at=4)
    assert_same_run(cut / "seed=7", tmp_path / "alone7", resumed_at=4)


def test_a_sweep_keeps_transformer_cells_as_separate_tasks(world_params: dict[str, Any], tmp_path: Path) -> None:
    """Batching transformer seeds saves no time (benchmarks/README.md), so a sweep runs each cell as its own task;
    each cell's run is its separate run, and a rerun reuses done cells and resumes the interrupted one alone."""
    base = {"world": "synthetic_lm", "world_params": world_params, "updates": 3, "prompts_per_update": 2,
            "group_size": 4, "eval_every": 2, "sample_every": 0}
    grid = {"base": base, "axes": {"schedule": ["on_policy", "stale_k:2"], "seed": [0, 1, 2]}}
    cells = grid_module.expand_grid(grid, tmp_path / "sweep")
    assert sweep.seed_groups(cells) == [[index] for index in range(len(cells))]
    rows = sweep.run_sweep(grid, tmp_path / "sweep")
    assert {row["status"] for row in rows} == {"completed"}
    for cell in cells:
        alone = tmp_path / "alone" / cell.name
        trainer.train(TrainConfig.from_dict(cell.config), alone)
        assert normalized_metrics(cell.out_dir) == normalized_metrics(alone)
    (Path(cells[1].out_dir) / "summary.json").unlink()  # seed 1 looks interrupted: it alone is resumed
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "sweep").rglob("metrics.csv")}
    again = sweep.run_sweep(grid, tmp_path / "sweep")  # done cells are reused, not run again
    assert all(row["status"] == "completed" for row in again)
    after = {p: p.stat().st_mtime_ns for p in (tmp_path / "sweep").rglob("metrics.csv")}
    assert [p.parent for p in after if after[p] != before[p]] == [Path(cells[1].out_dir)]
    assert normalized_metrics(cells[1].out_dir) == normalized_metrics(tmp_path / "alone" / cells[1].name)
