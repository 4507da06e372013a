"""Seeds batched together: each seed's run directory equals the separate run's (``train`` with ``seed=S``) bit for
bit — metrics, events and checkpoint — for the tabular policy, and within float tolerance for the GRU
``sequence_model`` (its stacked recurrence sums in another order than ``nn.GRU``); a seed that stops leaves the
others unchanged; resume works per seed; the command line's ``--seeds``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from offpolicylab import batched, cli, trainer
from offpolicylab.batched import parse_seeds
from offpolicylab.config import TrainConfig
from offpolicylab.contracts import Prompts, Rollout
from offpolicylab.policies import TabularSoftmaxPolicy
from offpolicylab.policies.tabular import StackedTabularPolicy
from offpolicylab.run_dir import RunDir, RunError
from offpolicylab.stack import Stack, member_state, stacked_state
from tests.small_runs import bandit_config, mdp_config, nan_objective, read_rows
from tests.trainer.golden_runs import normalized_metrics

SEEDS = [3, 7, 11]
CONFIGS = {
    "mdp_grpo": mdp_config(updates=6, checkpoint_every=2, sample_every=2),
    "mdp_ac_mispo_stale_noisy_mixture": mdp_config(
        objective="ac_mispo", schedule="mixture:0.5", updates=6, checkpoint_every=3,
        world_params={"vocab_size": 3, "length": 3, "num_prompts": 2, "eos": True},
        policy_params={"sampler_noise_std": 0.1}),
    "mdp_m2po_stale_adamw": mdp_config(objective="m2po", schedule="stale_k:2", optimizer="adamw", updates=6),
    "bandit_rec_sync_sgd": bandit_config(objective="rec", schedule="sync:3,1", updates=6, eval_every=2),
}


def separate(config: TrainConfig, seed: int, out: Path) -> Path:
    trainer.train(dataclasses.replace(config, seed=seed), out)
    return out


def assert_same_run(batched: Path, alone: Path, resumed_at: int | None = None) -> None:
    """Same metrics (wall-clock columns aside), events (times aside; ``resumed_at``: plus one resume event at that
    update), summary and checkpoint, bit for bit."""
    assert normalized_metrics(batched) == normalized_metrics(alone)
    strip = [{k: v for k, v in e.items() if k != "time"} for e in RunDir(batched).read_events()]
    if resumed_at is not None:
        assert strip.pop(0) == {"event": "resume", "update": resumed_at}
    assert strip == [{k: v for k, v in e.items() if k != "time"} for e in RunDir(alone).read_events()]
    assert RunDir(batched).read_summary() == RunDir(alone).read_summary()
    assert RunDir(batched).read_config() == RunDir(alone).read_config()
    a, b = RunDir(batched).load_checkpoint(), RunDir(alone).load_checkpoint()
    a.pop("metrics_digest"), b.pop("metrics_digest")  # a hash of metrics.csv, whose time_* columns differ
    assert_equal_state(a, b)
    samples = sorted(p.name for p in (batched / "samples").glob("*.npz")) if (batched / "samples").exists() else []
    assert samples == (sorted(p.name for p in (alone / "samples").glob("*.npz"))
                       if (alone / "samples").exists() else [])


def assert_equal_state(a: Any, b: Any, where: str = "checkpoint") -> None:
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for key in a:
            assert_equal_state(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_equal_state(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    else:
        assert a == b, where


# ------------------------------------------------------------------------------------------------ equality
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_batched_seeds_write_the_separate_runs_bit_for_bit(name: str, tmp_path: Path) -> None:
    config = CONFIGS[name]
    summaries = batched.train_seeds(config, SEEDS, tmp_path / "batched")
    assert [s["status"] for s in summaries] == ["completed"] * len(SEEDS)
    for seed in SEEDS:
        assert_same_run(tmp_path / "batched" / f"seed={seed}", separate(config, seed, tmp_path / f"alone{seed}"))


GRU = mdp_config(policy="sequence_model", policy_params={"hidden_size": 8, "embed_dim": 4}, updates=4, eval_every=2,
                 sample_every=0, checkpoint_every=2)


def assert_close_run(batched: Path, alone: Path) -> None:
    """Same columns and rows; every number within float tolerance (rounding of the stacked GRU), the rest equal;
    the checkpointed weights within tolerance."""
    rows, expected = read_rows(batched), read_rows(alone)
    assert len(rows) == len(expected) and list(rows[0]) == list(expected[0])
    for row, want in zip(rows, expected, strict=True):
        for key, value in want.items():
            if key.startswith("time_") or value == row[key]:
                continue
            assert float(row[key]) == pytest.approx(float(value), rel=1e-4, abs=1e-5, nan_ok=True), \
                (key, row["update"])
    weights, own = RunDir(batched).load_checkpoint()["policy"], RunDir(alone).load_checkpoint()["policy"]
    assert set(weights) == set(own)
    for name in own:
        torch.testing.assert_close(weights[name], own[name], rtol=1e-4, atol=1e-6)


def test_batched_gru_seeds_stay_within_float_tolerance_of_the_separate_runs(tmp_path: Path) -> None:
    summaries = batched.train_seeds(GRU, SEEDS, tmp_path / "batched")
    assert [s["status"] for s in summaries] == ["completed"] * len(SEEDS)
    for seed in SEEDS:
        alone = separate(GRU, seed, tmp_path / f"alone{seed}")
        assert_close_run(tmp_path / "batched" / f"seed={seed}", alone)
        assert RunDir(tmp_path / "batched" / f"seed={seed}").read_config() == RunDir(alone).read_config()


def test_seeds_really_differ(tmp_path: Path) -> None:
    """The equality above is not vacuous: different seeds draw different batches."""
    batched.train_seeds(CONFIGS["mdp_grpo"], [0, 1], tmp_path)
    assert normalized_metrics(tmp_path / "seed=0") != normalized_metrics(tmp_path / "seed=1")


@pytest.mark.parametrize("policy", ["tabular", "sequence_model"])
def test_a_seed_that_stops_leaves_the_others_unchanged(policy: str, tmp_path: Path) -> None:
    """Three runs trained together (seeds 3, 7, 11); seed 7's objective turns its loss NaN at its third update: it
    stops as collapsed (no step, no checkpoint), exactly as its separate run does, and the group goes on without it
    (restacked) with seeds 3 and 11 unchanged (the GRU's within float tolerance)."""
    base = mdp_config(updates=6, checkpoint_every=1) if policy == "tabular" else \
        dataclasses.replace(GRU, updates=6, checkpoint_every=1)
    assert base.objective == "grpo"
    with nan_objective("grpo", after=2) as faulty:
        configs = [dataclasses.replace(base, seed=seed, objective=faulty if seed == 7 else "grpo") for seed in SEEDS]
        dirs = [tmp_path / "together" / f"seed={seed}" for seed in SEEDS]
        statuses = [s["status"] for s in batched.train_together(configs, dirs)]
        assert statuses == ["completed", "collapsed", "completed"]
        assert len(read_rows(dirs[1])) == 3
        for config, together in zip(configs, dirs, strict=True):
            alone = tmp_path / f"alone{config.seed}"
            trainer.train(config, alone)
            (assert_same_run if policy == "tabular" else assert_close_run)(together, alone)


# ------------------------------------------------------------------------------------------------ resume
def interrupted(config: TrainConfig, out: Path, monkeypatch: pytest.MonkeyPatch, at: int) -> None:
    """Kill (KeyboardInterrupt: no summary) the batched run when its first seed saves checkpoint ``at``."""
    save = RunDir.save_checkpoint

    def dies(self: RunDir, state: dict) -> None:
        if state["next_update"] == at:
            raise KeyboardInterrupt
        save(self, state)

    monkeypatch.setattr(RunDir, "save_checkpoint", dies)
    with pytest.raises(KeyboardInterrupt):
        batched.train_seeds(config, SEEDS, out)
    monkeypatch.setattr(RunDir, "save_checkpoint", save)


def test_batched_resume_ends_identical_to_separate_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = CONFIGS["mdp_ac_mispo_stale_noisy_mixture"]
    interrupted(config, tmp_path / "batched", monkeypatch, at=6)
    # every seed wrote row 5 (records come before checkpoints); the first died saving checkpoint 6, so every seed's
    # checkpoint is at 3 and the resume cuts rows 3–5 back
    assert [len(read_rows(tmp_path / "batched" / f"seed={s}")) for s in SEEDS] == [6, 6, 6]
    batched.train_seeds(config, SEEDS, tmp_path / "batched", resume=True)
    for seed in SEEDS:
        assert_same_run(tmp_path / "batched" / f"seed={seed}", separate(config, seed, tmp_path / f"alone{seed}"),
                        resumed_at=3)


def test_batched_gru_resume_stays_within_tolerance_of_separate_runs(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Resuming restacks the members' restored weights and optimizer states (the stack's parameter order is the
    module's)."""
    interrupted(GRU, tmp_path / "batched", monkeypatch, at=4)
    batched.train_seeds(GRU, SEEDS, tmp_path / "batched", resume=True)
    for seed in SEEDS:
        assert_close_run(tmp_path / "batched" / f"seed={seed}", separate(GRU, seed, tmp_path / f"alone{seed}"))


def test_one_seed_of_a_batched_run_resumes_on_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = CONFIGS["mdp_ac_mispo_stale_noisy_mixture"]
    interrupted(config, tmp_path / "batched", monkeypatch, at=6)
    cut = tmp_path / "batched" / "seed=7"
    trainer.train(dataclasses.replace(config, seed=7), cut, resume=True)
    assert_same_run(cut, separate(config, 7, tmp_path / "alone"), resumed_at=3)


def test_resume_refuses_seeds_at_different_updates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = mdp_config(updates=6, checkpoint_every=2)
    interrupted(config, tmp_path / "batched", monkeypatch, at=6)
    trainer.train(dataclasses.replace(config, seed=7), tmp_path / "batched" / "seed=7", resume=True)
    (tmp_path / "batched" / "seed=7" / "summary.json").unlink()  # seed 7 at update 6, the others at 4
    before = {p: p.read_bytes() for p in (tmp_path / "batched").rglob("*") if p.is_file()}
    with pytest.raises(RunError, match=r"different updates \(seed=3 at update 4, seed=7 at update 6"):
        batched.train_seeds(config, SEEDS, tmp_path / "batched", resume=True)
    assert {p: p.read_bytes() for p in (tmp_path / "batched").rglob("*") if p.is_file()} == before


def test_fresh_batched_run_refuses_an_existing_seed_directory_before_writing(tmp_path: Path) -> None:
    config = mdp_config(updates=2)
    trainer.train(dataclasses.replace(config, seed=7), tmp_path / "seed=7")
    with pytest.raises(RunError, match="seed=7 already holds a run"):
        batched.train_seeds(config, SEEDS, tmp_path)
    assert not (tmp_path / "seed=3").exists() and not (tmp_path / "seed=11").exists()


# ------------------------------------------------------------------------------------------------ the parts
def test_stacked_table_answers_each_block_with_its_member_and_members_see_the_steps() -> None:
    gen = torch.Generator().manual_seed(0)
    members = [TabularSoftmaxPolicy(num_prompts=3, vocab_size=4, response_len=3, eos_id=1,
                                    init_logits=torch.randn(3, 3, 5, 4, generator=gen)) for _ in range(3)]
    alone = [TabularSoftmaxPolicy(num_prompts=3, vocab_size=4, response_len=3, eos_id=1,
                                  init_logits=m.logits.detach().clone()) for m in members]
    stacked = StackedTabularPolicy(members)
    index = torch.randint(3, (12,), generator=gen)
    responses = torch.randint(4, (12, 3), generator=gen)
    ids = torch.zeros(12, 1, dtype=torch.long)
    logits = stacked.response_logits(ids, torch.ones(12, 1), index, responses)
    for s, block in enumerate(logits.split(4)):
        rows = slice(4 * s, 4 * s + 4)
        assert torch.equal(block, alone[s].response_logits(ids[rows], torch.ones(4, 1), index[rows], responses[rows]))
    for t in range(3):  # decoding reads one position: the same numbers as the teacher-forced column
        assert torch.equal(stacked.next_logits(None, ids, torch.ones(12, 1), index, responses, t), logits[:, t])
        assert torch.equal(alone[0].next_logits(None, ids[:4], torch.ones(4, 1), index[:4], responses[:4], t),
                           logits[:4, t])
    with torch.no_grad():
        stacked.logits[1] += 1.0  # what an optimizer step does to the stack ...
    assert torch.equal(members[1].logits, alone[1].logits.detach() + 1.0)  # ... member 1 sees
    assert torch.equal(members[0].logits, alone[0].logits.detach())


@pytest.mark.parametrize("noise", [0.0, 0.3])
def test_sampling_with_one_generator_per_block_draws_what_each_member_draws_alone(noise: float) -> None:
    policies = [TabularSoftmaxPolicy(num_prompts=2, vocab_size=3, response_len=4, eos_id=0, sampler_noise_std=noise,
                                     init_logits=torch.randn(2, 4, 4, 3, generator=torch.Generator().manual_seed(s)))
                for s in range(3)]
    alone = [p.sample(Prompts(torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1), torch.tensor([0, 1])), 5,
                      0.7, torch.Generator().manual_seed(10 + s)) for s, p in enumerate(policies)]
    stacked = StackedTabularPolicy(policies)
    prompts = Prompts(torch.zeros(6, 1, dtype=torch.long), torch.ones(6, 1), torch.tensor([0, 1] * 3))
    together = stacked.sample(prompts, 5, 0.7, [torch.Generator().manual_seed(10 + s) for s in range(3)])
    for s, one in enumerate(alone):
        rows = slice(10 * s, 10 * s + 10)
        for name in ("response_ids", "response_mask", "behavior_logp", "sampler_logp"):
            a, b = getattr(one, name), getattr(together, name)
            assert (a is None and b is None) or torch.equal(a, b[rows]), name


def test_optimizer_state_round_trips_through_members() -> None:
    param = torch.nn.Parameter(torch.randn(3, 4))
    optimizer = torch.optim.Adam([param], lr=0.1)
    param.grad = torch.randn(3, 4)
    optimizer.step()
    full = optimizer.state_dict()
    members = [member_state(full, s) for s in range(3)]
    assert torch.equal(members[2]["state"][0]["exp_avg"], full["state"][0]["exp_avg"][2])
    assert_equal_state(stacked_state(members), full)


# ------------------------------------------------------------------------------------------------ the command line
TINY = ["--world", "token_mdp", "--objective", "grpo", "--world-param", "vocab_size=3", "--world-param", "length=3",
        "--world-param", "num_prompts=2", "--prompts-per-update", "2", "--group-size", "4", "--updates", "3",
        "--eval-every", "2", "--sample-every", "0"]


@pytest.mark.parametrize(("seeds", "named"), [
    ("0,a", "--seeds '0,a' is malformed; valid: comma-separated distinct integers"),
    ("0,,1", "is malformed"),
    ("", "is malformed"),
    ("-1,2", "is malformed"),
    ("1,1", "has a repeated seed"),
    ("0,4294967296", "has a seed out of range"),
])
def test_malformed_seeds_exit_2_with_one_line_and_write_nothing(seeds: str, named: str, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", *TINY, f"--seeds={seeds}", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and named in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="valid: comma-separated"):
        parse_seeds(seeds)


def test_seeds_and_seed_exclude_each_other(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", *TINY, "--seeds", "0,1", "--seed", "2", "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2 and "--seeds and --seed exclude each other" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("policy", ["tabular", "sequence_model"])
def test_cli_seeds_write_the_runs_of_seed(policy: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--seeds 0,1 writes out/seed=0 and out/seed=1 as --seed 0 and --seed 1 do (the GRU within float tolerance),
    and --resume of a finished batched run is refused like a finished single run."""
    flags = [*TINY, "--policy", policy, "--policy-param", "hidden_size=8", "--policy-param", "embed_dim=4"] \
        if policy == "sequence_model" else TINY
    assert cli.main(["run", *flags, "--seeds", "0,1", "--out", str(tmp_path / "both")]) == 0
    out = capsys.readouterr().out
    assert "seed=0: completed" in out and "seed=1: completed" in out
    for seed in (0, 1):
        assert cli.main(["run", *flags, "--seed", str(seed), "--out", str(tmp_path / f"one{seed}")]) == 0
        if policy == "tabular":
            assert normalized_metrics(tmp_path / "both" / f"seed={seed}") == normalized_metrics(tmp_path / f"one{seed}")
        else:
            assert_close_run(tmp_path / "both" / f"seed={seed}", tmp_path / f"one{seed}")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--seeds", "0,1", "--out", str(tmp_path / "both"), "--resume"])
    assert exit_.value.code == 2 and "already finished" in capsys.readouterr().err


def test_runs_of_different_objectives_train_together_bit_for_bit(tmp_path: Path) -> None:
    """grpo (std advantages), rec (mean advantages) and m2po (its own metrics) in one group, stale data: each
    member writes its separate run's directory."""
    base = CONFIGS["mdp_m2po_stale_adamw"]
    configs = [dataclasses.replace(base, objective="grpo", seed=3), dataclasses.replace(base, objective="rec", seed=3),
               dataclasses.replace(base, objective="m2po", seed=7)]
    dirs = [tmp_path / "together" / str(i) for i in range(3)]
    assert [s["status"] for s in batched.train_together(configs, dirs)] == ["completed"] * 3
    for i, config in enumerate(configs):
        alone = tmp_path / f"alone{i}"
        trainer.train(config, alone)
        assert_same_run(dirs[i], alone)


def test_members_sharing_an_objective_are_scored_in_one_call_bit_for_bit(tmp_path: Path) -> None:
    """Members with the same objective and parameters next to each other (a sweep's seeds) are scored by one
    objective call with per-run reductions (``trainer.objective_groups``): p3o (a per-run ESS in its loss), m2po
    (a per-run cut), mu_grpo and grpo in groups of two, ac_mispo (state) alone — each member writes its separate
    run's directory."""
    base = CONFIGS["mdp_m2po_stale_adamw"]
    members = [("p3o", 3), ("p3o", 7), ("m2po", 3), ("m2po", 11), ("mu_grpo", 3), ("mu_grpo", 11), ("ac_mispo", 7),
               ("grpo", 3), ("grpo", 7)]
    configs = [dataclasses.replace(base, objective=name, seed=seed) for name, seed in members]
    dirs = [tmp_path / "together" / str(i) for i in range(len(configs))]
    assert [s["status"] for s in batched.train_together(configs, dirs)] == ["completed"] * len(configs)
    for i, config in enumerate(configs):
        alone = tmp_path / f"alone{i}"
        trainer.train(config, alone)
        assert_same_run(dirs[i], alone)


def test_runs_that_differ_in_more_than_seed_and_objective_are_refused_before_writing(tmp_path: Path) -> None:
    base = mdp_config(updates=2)
    with pytest.raises(ValueError, match="every field but seed, objective, objective_params; lr differ"):
        batched.train_together([base, dataclasses.replace(base, lr=0.5, seed=1)], [tmp_path / "a", tmp_path / "b"])
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("num_prompts", [2, 400])  # 200 and 40,000 table entries per member
def test_clipping_all_members_at_once_clips_each_as_its_separate_run(num_prompts: int) -> None:
    gen = torch.Generator().manual_seed(1)
    members = [TabularSoftmaxPolicy(num_prompts=num_prompts, vocab_size=4, response_len=5) for _ in range(3)]
    grads = [torch.randn(members[0].logits.shape, generator=gen) * scale for scale in (0.001, 5.0, 100.0)]
    expected = []
    for member, grad in zip(members, grads, strict=True):
        member.logits.grad = grad.clone()
        expected.append((torch.nn.utils.clip_grad_norm_([member.logits], 1.0), member.logits.grad.clone()))
    stacked = StackedTabularPolicy(members)
    stacked.logits.grad = torch.stack(grads)
    stack = Stack([None] * 3, [None] * 3, stacked, None, None, [])  # type: ignore[arg-type]
    norms = stack.clip_gradients(1.0)
    for index, (norm, grad) in enumerate(expected):
        assert torch.equal(norms[index], norm) and torch.equal(stacked.logits.grad[index], grad)
    assert norms[0] < 1.0 < norms[1]  # one member left unclipped, the others scaled


def test_a_rollout_split_into_blocks_joins_back_field_by_field(tmp_path: Path) -> None:
    """Rollout.split gives each member its rows with group ids from 0; Rollout.concat of the blocks gives back
    every field of the rollout (the batched loop relies on both)."""
    policies = [TabularSoftmaxPolicy(num_prompts=4, vocab_size=3, response_len=4, eos_id=2) for _ in range(3)]
    stacked = StackedTabularPolicy(policies)
    prompts = Prompts.concat([Prompts(ids=torch.arange(4)[:, None], mask=torch.ones(4, 1),
                                      index=torch.arange(4)) for _ in range(3)])
    generators = [torch.Generator().manual_seed(s) for s in range(3)]
    whole = stacked.sample(prompts, 5, 1.0, generators)
    whole = whole.with_(rewards=torch.rand(len(whole)), version=torch.zeros(len(whole), dtype=torch.long))
    blocks = whole.split(3)
    assert [len(block) for block in blocks] == [20, 20, 20]
    assert all(int(block.group_ids.min()) == 0 and int(block.group_ids.max()) == 3 for block in blocks)
    joined = Rollout.concat(blocks)
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "behavior_logp", "group_ids",
                 "prompt_index", "rewards", "version"):
        assert torch.equal(getattr(joined, name), getattr(whole, name)), name
    with pytest.raises(ValueError, match="equal blocks"):
        whole.split(7)


def test_a_stack_the_policy_refuses_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """The stacked GRU takes only an fp32 sampler: --seeds with a reduced-precision GRU sampler is one ValueError
    before any seed directory (config, lock) exists."""
    config = dataclasses.replace(GRU, policy_params={**GRU.policy_params, "sampler_precision": "bf16"})
    with pytest.raises(ValueError, match="sampler_precision=fp32"):
        batched.train_seeds(config, SEEDS, tmp_path / "batched")
    assert not (tmp_path / "batched").exists()
