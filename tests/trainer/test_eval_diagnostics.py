"""Evaluation diagnostics: the Monte-Carlo standard error of the sampled return and the sampled KL(π‖π_0), each
against an independent computation (NumPy formulas, exact enumeration of a token MDP)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from offpolicylab import trainer
from offpolicylab.build import build, is_enumerable, tracks_kl_init
from offpolicylab.config import TrainConfig
from offpolicylab.diagnostics import stats
from offpolicylab.evaluation import kl_from_scores
from offpolicylab.resume import watches_tail
from offpolicylab.stack import Run
from offpolicylab.staleness import parse_schedule
from tests.small_runs import mdp_config, read_rows


# ------------------------------------------------------------------------------------------ standard error
@pytest.mark.parametrize("seed", range(6))
def test_stratified_standard_error_matches_numpy(seed: int) -> None:
    """SE = √(Σ_g n_g s_g²) / N with s_g² the ddof-1 variance of group g (groups of unequal sizes ≥ 2)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(2, 9, size=int(rng.integers(1, 7)))
    values = rng.random(int(sizes.sum())) < rng.random()  # 0/1 rewards, as a verifiable reward gives
    values = values.astype(np.float64) + 0.1 * (rng.random(values.shape) < 0.3)
    groups = np.repeat(np.arange(len(sizes)), sizes)
    expected = np.sqrt(sum(n * np.var(values[groups == g], ddof=1) for g, n in enumerate(sizes))) / len(values)
    got = stats.stratified_standard_error(torch.from_numpy(values), torch.from_numpy(groups))
    assert float(got) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_standard_error_with_a_singleton_group_is_the_iid_formula() -> None:
    values = np.array([1.0, 0.0, 0.0, 1.0, 0.1])
    groups = np.array([0, 0, 1, 1, 2])
    expected = np.std(values, ddof=1) / np.sqrt(len(values))
    got = stats.stratified_standard_error(torch.from_numpy(values), torch.from_numpy(groups))
    assert float(got) == pytest.approx(expected, rel=1e-12)
    assert float(stats.stratified_standard_error(torch.ones(1), torch.zeros(1, dtype=torch.long))) == 0.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the mixed-device case)")
def test_standard_error_of_host_rewards_with_gpu_group_ids() -> None:
    """The trainer's evaluation passes rewards on the host and a GPU policy's group ids on the GPU (this raised
    'Expected all tensors to be on the same device' in index_add on an H100)."""
    values = np.array([1.0, 0.0, 0.1, 1.0, 0.0, 0.0])
    groups = np.array([0, 0, 0, 1, 1, 1])
    expected = np.sqrt(sum(3 * np.var(values[groups == g], ddof=1) for g in (0, 1))) / len(values)
    got = stats.stratified_standard_error(torch.from_numpy(values), torch.from_numpy(groups).cuda())
    assert float(got) == pytest.approx(expected, rel=1e-12)


# ------------------------------------------------------------------------------------------ sampled KL to π_0
def _moved_policy() -> Run:
    parts = build(mdp_config())
    with torch.no_grad():
        for p in parts.policy.trainable_parameters():
            p.add_(0.7 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    return parts


def initial_scores(initial, sampled):
    """π_0's log-probs of the sampled tokens, as evaluation takes them (one no-grad forward)."""
    with torch.no_grad():
        return initial.score(sampled)[0]


def test_sampled_kl_matches_numpy_on_the_same_samples() -> None:
    """k1 = mean(log π − log π_0), k3 = mean(π_0/π − 1 − log(π_0/π)) over the valid tokens, π_0 scoring the
    samples of π."""
    parts = _moved_policy()
    gen = torch.Generator().manual_seed(0)
    sampled = parts.policy.sample(parts.world.eval_prompts(), 16, 1.0, gen)
    sampled = sampled.with_(response_mask=(torch.rand(sampled.response_mask.shape, generator=gen) > 0.2).float())
    with torch.no_grad():
        initial = parts.initial.score(sampled)[0].double().numpy()
    current = sampled.behavior_logp.double().numpy()
    valid = sampled.response_mask.numpy() > 0
    delta = (initial - current)[valid]  # log π_0/π
    got = kl_from_scores(initial_scores(parts.initial, sampled), sampled)
    assert got["eval_kl_init_k1"] == pytest.approx(np.mean(-delta), rel=1e-5)
    assert got["eval_kl_init_k3"] == pytest.approx(np.mean(np.expm1(delta) - delta), rel=1e-5)


def test_sampled_kl_is_unbiased_for_the_exact_kl() -> None:
    """Token sums of k1 and k3 are unbiased for the sequence KL(π‖π_0); with fixed-length responses (T tokens)
    T · (token mean) → the exact KL by enumeration.  40 000 responses: the Monte-Carlo error is ~1 %."""
    parts = _moved_policy()
    exact = parts.world.exact_kl(parts.policy, parts.initial)
    sampled = parts.policy.sample(parts.world.eval_prompts(), 20_000, 1.0, torch.Generator().manual_seed(1))
    got = kl_from_scores(initial_scores(parts.initial, sampled), sampled)
    length = parts.world.max_response_len
    assert exact > 0.3
    assert length * got["eval_kl_init_k1"] == pytest.approx(exact, rel=0.05)
    assert length * got["eval_kl_init_k3"] == pytest.approx(exact, rel=0.05)


# ------------------------------------------------------------------------------------------ in the trainer
def test_trainer_writes_the_evaluation_columns(tmp_path: Path) -> None:
    """The sampled J agrees with the exact J within its standard error, and the sampled KL tracks the exact KL
    (evaluation follows the update's optimizer step, so π ≠ π_0 already at update 0)."""
    trainer.train(mdp_config(lr=0.5, updates=9, eval_every=4, eval_samples=3000), tmp_path / "run")
    rows = [r for r in read_rows(tmp_path / "run") if r["eval_reward_sampled"]]
    assert [int(r["update"]) for r in rows] == [0, 4, 8]
    for row in rows:
        se = float(row["eval_reward_se"])
        assert 0.0 < se < 0.02
        assert abs(float(row["eval_reward_sampled"]) - float(row["exact_return"])) < 4.5 * se
        assert float(row["eval_kl_init_k3"]) > 0.0
    last = rows[-1]
    assert float(last["exact_kl_init"]) > 0.05
    length = 3  # mdp_config: fixed-length responses of 3 tokens
    assert length * float(last["eval_kl_init_k3"]) == pytest.approx(float(last["exact_kl_init"]), rel=0.15)


def test_kl_to_initial_is_off_for_the_llm_policy_unless_asked() -> None:
    assert tracks_kl_init(TrainConfig(policy="tabular"))
    assert not tracks_kl_init(TrainConfig(policy="hf"))
    assert tracks_kl_init(TrainConfig(policy="hf", eval_kl_init="on"))
    assert not tracks_kl_init(TrainConfig(policy="tabular", eval_kl_init="off"))
    with pytest.raises(ValueError, match="eval_kl_init='sometimes' is invalid; valid: one of auto, on, off"):
        TrainConfig(eval_kl_init="sometimes")


def test_without_kl_tracking_no_frozen_copy_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a world that cannot be enumerated (a tiny synthetic LM), eval_kl_init=off keeps no second policy (the
    memory it saves); an enumerable world keeps π₀ for its exact KL either way."""
    monkeypatch.setenv("OFFPOLICYLAB_CACHE", str(tmp_path / "cache"))
    tiny = {"preset": "seed_scale", "vocab_size": 32, "response_len": 8, "num_keys": 4, "num_train_prompts": 16, "d_model": 16,
            "num_heads": 2, "num_layers": 1, "distill_steps": 2, "distill_batch": 8}
    config = TrainConfig(world="synthetic_lm", world_params=tiny, objective="grpo", updates=2)
    assert not is_enumerable(build(config).world)
    assert build(TrainConfig(**{**config.to_dict(), "eval_kl_init": "off"})).initial is None
    assert build(config).initial is not None
    assert build(mdp_config(eval_kl_init="off")).initial is not None


# ------------------------------------------------------------------------------------------ the current policy's reward
@pytest.mark.parametrize("schedule", ["on_policy", "stale_k:2", "stages:3"])
def test_current_reward_is_the_reward_of_what_the_current_policy_generated(tmp_path: Path, schedule: str) -> None:
    """reward_current at u = mean reward of the batches generated at u: under stale_k:2 the batch generated at u
    is consumed at u + 2 (so reward_current[u] = reward_mean[u + 2]; at u = 0 π_0 generates batches 0, 1, 2);
    under stages:3 only every third update generates (3 batches), NaN in between."""
    trainer.train(mdp_config(schedule=schedule, updates=9), tmp_path / "run")
    rows = read_rows(tmp_path / "run")
    current = np.array([float(r["reward_current"]) for r in rows])
    consumed = np.array([float(r["reward_mean"]) for r in rows])
    if schedule == "on_policy":
        np.testing.assert_allclose(current, consumed, rtol=1e-6)
    elif schedule == "stale_k:2":
        assert current[0] == pytest.approx(consumed[:3].mean(), rel=1e-6)
        np.testing.assert_allclose(current[1:7], consumed[3:9], rtol=1e-6)
    else:
        assert np.isnan(current[[1, 2, 4, 5, 7, 8]]).all()
        for start in (0, 3, 6):
            assert current[start] == pytest.approx(consumed[start:start + 3].mean(), rel=1e-6)


# ------------------------------------------------------------------------------------------ the drained tail
@pytest.mark.parametrize(("spec", "total", "tail"), [
    ("stale_k:3", 10, [7, 8, 9]),  # batches generated at u ≥ 7 would be consumed at u + 3 ≥ 10
    ("stale_k:0", 10, []),  # on-policy: every update's batch is its own
    ("on_policy", 10, []),
    ("sync:4,1", 10, []),  # version(u) = u − (u mod 4) − 1: update 7 generates for u = 8, 9 (< 10); the next
    # generation, for u = 12 …, would be at update 11 ≥ 10
    ("sync:4,2", 11, [10]),  # version(u) = u − (u mod 4) − 2: update 6 generates for u = 8 … 10; update 10 would
    # generate for u = 12 … 15, all ≥ 11
    ("stages:4", 10, []),  # between stages π_u never generates, with or without an end
    ("epochs:2", 10, []),  # one batch every second update, consumed at once
    ("offline", 10, []),  # the frozen π_0 answers everything
])
def test_tail_updates_are_those_whose_batches_would_be_consumed_after_the_end(spec: str, total: int,
                                                                             tail: list[int]) -> None:
    """Worked by hand from each schedule's version(u): an update watches the tail when a run without end would
    generate there and every batch it would generate is consumed at an update ≥ ``total``."""
    schedule = parse_schedule(spec)
    assert [u for u in range(total) if watches_tail(schedule, u, total)] == tail


def test_the_drained_tail_is_watched_without_changing_the_training(tmp_path: Path) -> None:
    """stale_k:2, 9 updates: the queue drains at updates 7 and 8; with ``collapse_tail`` the current policy's reward is
    measured there (finite) and every other column — the training — is bit-identical to the run without it."""
    for watch in (True, False):
        trainer.train(mdp_config(schedule="stale_k:2", updates=9, collapse_tail=watch), tmp_path / str(watch))
    watched, blind = (read_rows(tmp_path / str(w)) for w in (True, False))
    assert np.isfinite([float(r["reward_current"]) for r in watched]).all()
    assert np.isnan([float(r["reward_current"]) for r in blind[7:]]).all()

    def training(rows: list[dict[str, str]]) -> list[dict[str, str]]:
        return [{k: v for k, v in r.items() if k != "reward_current" and not k.startswith("time_")} for r in rows]

    assert training(watched) == training(blind)
    assert [r["reward_current"] for r in watched[:7]] == [r["reward_current"] for r in blind[:7]]
