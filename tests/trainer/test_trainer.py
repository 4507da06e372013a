"""The training loop end to end on the real toy worlds: advantages, staleness bookkeeping, the 3-arm pitfall,
evaluation, non-finite losses and the run directory it writes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from offpolicylab import samples, trainer
from offpolicylab.build import build
from offpolicylab.contracts import Rollout
from offpolicylab.evaluation import exact_diagnostics
from offpolicylab.objectives import TokenBatch
from offpolicylab.objectives.advantages import group_advantages
from offpolicylab.run_dir import MAX_SAMPLE_TOKENS, RunDir, RunError
from tests.small_runs import bandit_config, column, mdp_config, nan_objective, read_rows

# ------------------------------------------------------------------------------------------------ advantages
#: estimator → (NumPy std's ddof, ε) or None for mean-only: verl's torch.std and TRL's nanstd are unbiased (ddof 1).
NUMPY_STD = {"mean": None, "std": (1, 1e-6), "std_trl": (1, 1e-4), "std_population": (0, 1e-6)}


def numpy_advantages(rewards: np.ndarray, groups: np.ndarray, estimator: str) -> np.ndarray:
    """A = r − r̄ per group, ÷ (np.std(r, ddof) + ε) for the std estimators; a group of equal rewards gets 0."""
    expected = np.zeros(len(rewards))
    for g in np.unique(groups):
        r = rewards[groups == g].astype(np.float64)
        if r.max() == r.min():
            continue
        a = r - r.mean()
        if NUMPY_STD[estimator] is not None:
            ddof, eps = NUMPY_STD[estimator]
            a = a / (r.std(ddof=ddof) + eps)
        expected[groups == g] = a
    return expected


@pytest.mark.parametrize("estimator", list(NUMPY_STD))
def test_group_advantages_match_numpy(estimator: str) -> None:
    """Groups of 4, of 2 (Bessel's correction doubles the variance there) and of 8 against NumPy."""
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(5), [4, 4, 2, 2, 8])
    rewards = rng.random(len(groups)).astype(np.float32)
    got = group_advantages(torch.from_numpy(rewards), torch.from_numpy(groups), estimator)
    np.testing.assert_allclose(got.numpy(), numpy_advantages(rewards, groups, estimator), rtol=1e-5, atol=1e-6)


def test_default_std_is_bessel_corrected() -> None:
    """GRPO's std as verl and TRL compute it: for a group of two rewards 0 and 1 the unbiased std is √½, so
    A = ±½/(√½ + ε) = ±√½ (the population std ½ would give ±1); for G = 8 the population std's advantages are
    √(8/7) times larger."""
    got = group_advantages(torch.tensor([0.0, 1.0]), torch.tensor([0, 0]))
    torch.testing.assert_close(got, torch.tensor([-0.5, 0.5]) / (0.5**0.5 + 1e-6))
    rewards, groups = torch.tensor([0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]), torch.zeros(8, dtype=torch.long)
    ratio = group_advantages(rewards, groups, "std_population") / group_advantages(rewards, groups)
    torch.testing.assert_close(ratio, torch.full((8,), (8 / 7) ** 0.5), rtol=1e-5, atol=0)


@pytest.mark.parametrize("value", [1.0, 0.1, 0.3, 0.7, 0.9])
@pytest.mark.parametrize("size", [2, 3, 4, 8, 16, 64])
@pytest.mark.parametrize("estimator", list(NUMPY_STD))
def test_constant_group_has_zero_advantage_even_normalised(value: float, size: int, estimator: str) -> None:
    """Equal rewards give A = 0 by the formula; a float32 mean can miss their value by an ulp (three rewards of 0.9
    on every CPU: three equal values have one summation order), which ÷ (s + 1e-6) would turn into |A| ≈ 0.01.
    A second group with a spread keeps its usual advantages."""
    rewards = torch.cat([torch.full((size,), value), torch.tensor([0.0, 1.0, 0.1, 1.0])])
    groups = torch.cat([torch.zeros(size, dtype=torch.long), torch.ones(4, dtype=torch.long)])
    got = group_advantages(rewards, groups, estimator)
    assert torch.equal(got[:size], torch.zeros(size))
    np.testing.assert_allclose(got[size:].numpy(), numpy_advantages(rewards.numpy(), groups.numpy(), estimator)[size:],
                               rtol=1e-5, atol=1e-6)


def test_group_of_one_has_zero_advantage() -> None:
    """A lone response carries no relative information: A = 0 (the unbiased std of one value is undefined)."""
    got = group_advantages(torch.tensor([0.7, 0.0, 1.0]), torch.tensor([0, 1, 1]))
    torch.testing.assert_close(got, torch.tensor([0.0, -(0.5**0.5), 0.5**0.5]) / (1 + 1e-6 * 2**0.5))


@pytest.mark.parametrize(("objective", "choice", "used"), [
    ("grpo", "auto", "std"),  # GRPO (Shao et al. 2024): (r − r̄)/σ
    ("rec", "auto", "mean"),  # REC (Yao et al. 2025): r − r̄
    ("opmd", "auto", "mean"),
    ("m2po", "auto", "std"),
    ("grpo", "mean", "mean"),  # an explicit choice overrides the paper's
    ("rec", "std", "std"),
    ("grpo", "std_trl", "std_trl"),
    ("grpo", "std_population", "std_population"),
])
def test_advantage_estimator_is_used_and_recorded(tmp_path: Path, objective: str,
                                                  choice: str, used: str) -> None:
    """The batch's advantages are the NumPy group formula of the estimator used, and config.json names it.  Read
    from the run's sample files (every update's whole batch: rewards, groups and per-token advantages)."""
    trainer.train(mdp_config(objective=objective, advantage=choice, updates=2, checkpoint_every=2, sample_every=1),
                  tmp_path / "r")
    assert json.loads((tmp_path / "r" / "config.json").read_text())["advantage"] == used
    seen = []
    for path in sorted((tmp_path / "r" / "samples").glob("update_*.npz")):
        with np.load(path, allow_pickle=False) as arrays:
            mask = arrays["batch_mask"]
            assert bool((mask[:, 0] > 0).all())  # every row's first token is valid: its advantage is the row's
            seen.append((arrays["batch_rewards"].astype(np.float64), arrays["batch_group_ids"],
                         arrays["batch_advantage"][:, 0]))
    assert len(seen) == 2
    informative = 0
    for rewards, groups, advantages in seen:
        for g in np.unique(groups):
            r = rewards[groups == g]
            informative += int(r.std() > 0)
        np.testing.assert_allclose(advantages, numpy_advantages(rewards, groups, used), rtol=1e-5, atol=1e-6)
    assert informative > 0  # some group had distinct rewards, so mean and std differ


def test_unknown_advantage_is_rejected() -> None:
    with pytest.raises(ValueError, match="valid: one of auto, mean, std, std_trl, std_population"):
        mdp_config(advantage="zscore")


# ------------------------------------------------------------------------------------------------ the pitfall
def _final_probs(run: Path) -> torch.Tensor:
    state = RunDir(run).load_checkpoint()
    return torch.softmax(state["policy"]["logits"].reshape(-1), 0)


def test_three_arm_pitfall_end_to_end(tmp_path: Path) -> None:
    """REC's pitfall: fixed π_b = [0.3, 0.6, 0.1] data (offline:1), r = [0, 0.8, 1].  REINFORCE (no IS) ascends
    Σ_a n_a A_a ∇ log π(a) and ends on the 0.8 arm; the importance-weighted −A·r (GRPO with ε = inf, no trust
    region) ascends Σ_a π(a) A_a and moves to the optimal arm."""
    common = dict(schedule="offline:1", updates=40, lr=4.0, prompts_per_update=16, group_size=8, checkpoint_every=40)
    trainer.train(bandit_config(objective="reinforce", **common), tmp_path / "reinforce")
    no_is = _final_probs(tmp_path / "reinforce")
    assert no_is[1] > 0.9
    trainer.train(bandit_config(objective="grpo", objective_params={"eps_low": float("inf"), "eps_high": float("inf")}, **common),
                  tmp_path / "is")
    weighted = _final_probs(tmp_path / "is")
    assert weighted[1] < 0.9 and int(weighted.argmax()) == 2
    # fixed data: the same batch every update, so its reward never changes
    assert len(set(column(tmp_path / "reinforce", "reward_mean"))) == 1


# ------------------------------------------------------------------------------------------------ staleness
@pytest.mark.parametrize(("schedule", "expected"), [
    ("on_policy", [0, 0, 0, 0, 0, 0]),
    ("stale_k:2", [0, 1, 2, 2, 2, 2]),
    ("sync:2,1", [0, 1, 1, 2, 1, 2]),
    ("stages:3", [0, 1, 2, 0, 1, 2]),
    ("epochs:2", [0, 1, 0, 1, 0, 1]),
    ("offline", [0, 1, 2, 3, 4, 5]),
    ("offline:2", [0, 1, 2, 3, 4, 5]),
    ("mixture:0.5", [0, 0.5, 1, 1.5, 2, 2.5]),  # half the prompts from π_0 (staleness u), half fresh
])
def test_each_sequence_carries_its_staleness(tmp_path: Path, schedule: str, expected: list[float]) -> None:
    trainer.train(bandit_config(schedule=schedule), tmp_path)
    assert column(tmp_path, "staleness_mean") == expected


def test_stale_data_has_ratios_away_from_one(tmp_path: Path) -> None:
    trainer.train(bandit_config(schedule="stale_k:2", lr=2.0), tmp_path)
    deviation = column(tmp_path, "log_ratio_abs_mean")
    assert deviation[0] == 0.0 and all(d > 0 for d in deviation[3:])


def test_epochs_reuse_the_same_responses(tmp_path: Path) -> None:
    trainer.train(bandit_config(schedule="epochs:2", updates=4), tmp_path)
    rewards = column(tmp_path, "reward_mean")
    assert rewards[0] == rewards[1] and rewards[2] == rewards[3]


# ------------------------------------------------------------------------------------------------ run directory
def test_run_directory_contents(tmp_path: Path) -> None:
    summary = trainer.train(mdp_config(), tmp_path)
    rows = read_rows(tmp_path)
    assert [int(r["update"]) for r in rows] == list(range(8))
    assert list(rows[0])[0] == "update"
    assert {"loss", "grad_norm", "reward_mean", "staleness_mean", "kl_k3", "clip_frac", "exact_return",
            "eval_reward_greedy", "eval_reward_sampled", "exact_kl_init", "time_update_s"} <= set(rows[0])
    evaluated = [int(r["update"]) for r in rows if r["exact_return"] != ""]
    assert evaluated == [0, 4, 7]
    assert 0.0 <= float(rows[-1]["exact_return"]) <= summary["optimal_return"]
    assert summary["status"] == "completed" and summary["updates_done"] == 8
    assert summary["final_exact_return"] == float(rows[-1]["exact_return"])
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["objective_params"]["eps_low"] == 0.2  # resolved defaults are stored
    samples = sorted((tmp_path / "samples").glob("update_*.npz"))
    assert [p.name for p in samples] == ["update_000000.npz", "update_000004.npz"]
    with np.load(samples[0], allow_pickle=False) as data:
        assert set(data.files) == {"log_ratio", "advantage", "entropy", "kept", "seq_log_ratio", "staleness",
                                   "batch_log_ratio", "batch_advantage", "batch_mask", "batch_kept", "batch_entropy",
                                   "batch_rewards", "batch_group_ids", "micro_batch"}
        assert data["log_ratio"].shape == data["kept"].shape and data["staleness"].shape == (8,)


def test_samples_are_subsampled_to_the_cap() -> None:
    batch_size, width = 700, 8  # 5600 valid tokens > 4096
    batch = TokenBatch(logp=torch.randn(batch_size, width), behavior_logp=torch.randn(batch_size, width),
                               advantages=torch.randn(batch_size), mask=torch.ones(batch_size, width),
                               staleness=torch.zeros(batch_size))
    arrays = samples.histogram_samples(batch, None, seed=0, update=3)
    assert arrays["log_ratio"].shape == (MAX_SAMPLE_TOKENS,) and arrays["seq_log_ratio"].shape == (batch_size,)
    again = samples.histogram_samples(batch, None, seed=0, update=3)
    assert np.array_equal(arrays["log_ratio"], again["log_ratio"])


def test_existing_run_directory_is_not_overwritten(tmp_path: Path) -> None:
    trainer.train(bandit_config(updates=2), tmp_path)
    before = (tmp_path / "metrics.csv").read_text()
    with pytest.raises(RunError, match="already holds a run"):
        trainer.train(bandit_config(updates=2), tmp_path)
    assert (tmp_path / "metrics.csv").read_text() == before


def test_bad_config_writes_nothing(tmp_path: Path) -> None:
    for config in (bandit_config(objective="nope"), bandit_config(schedule="stale_k:-1"),
                   bandit_config(objective="mispo", objective_params={"tok_bounds": "2,0.5"})):
        with pytest.raises(ValueError):
            trainer.train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("cut", [5, 7])
def test_resume_in_process_matches_uninterrupted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: int) -> None:
    """Interrupt after update ``cut``'s metrics row but before its checkpoint; resuming redoes update ``cut`` and the
    metrics file ends identical to an uninterrupted run (the SIGKILL version is in test_cli).  Update 7 lies in the
    drained tail of stale_k:2 over 9 updates, where the current policy generates only for the collapse detector."""
    config = mdp_config(objective="ac_mispo", schedule="stale_k:2", updates=9)
    trainer.train(config, tmp_path / "full")
    save = RunDir.save_checkpoint

    def dies_at_sixth(self: RunDir, state: dict) -> None:
        if state["next_update"] == cut + 1:
            raise KeyboardInterrupt  # not an Exception: the loop writes no summary, like a kill
        save(self, state)

    monkeypatch.setattr(RunDir, "save_checkpoint", dies_at_sixth)
    with pytest.raises(KeyboardInterrupt):
        trainer.train(config, tmp_path / "cut")
    monkeypatch.setattr(RunDir, "save_checkpoint", save)
    assert len(read_rows(tmp_path / "cut")) == cut + 1 and not (tmp_path / "cut" / "summary.json").exists()
    summary = trainer.train(config, tmp_path / "cut", resume=True)

    def strip(rows: list[dict[str, str]]) -> list[dict[str, str]]:
        return [{k: v for k, v in r.items() if not k.startswith("time_")} for r in rows]

    assert strip(read_rows(tmp_path / "cut")) == strip(read_rows(tmp_path / "full"))
    assert summary["status"] == "completed"
    assert [(e["event"], e["update"]) for e in RunDir(tmp_path / "cut").read_events()] == [("resume", cut)]


def test_resume_with_other_options_is_refused(tmp_path: Path) -> None:
    trainer.train(bandit_config(updates=3), tmp_path)
    (tmp_path / "summary.json").unlink()
    with pytest.raises(RunError, match="different configuration"):
        trainer.train(bandit_config(updates=3, lr=0.1), tmp_path, resume=True)


def test_corrupt_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    trainer.train(bandit_config(updates=3, checkpoint_every=1), tmp_path)
    (tmp_path / "summary.json").unlink()  # pretend the run was interrupted
    (tmp_path / "checkpoint" / "state.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(RunError, match="corrupt checkpoint"):
        trainer.train(bandit_config(updates=3, checkpoint_every=1), tmp_path, resume=True)


# ------------------------------------------------------------------------------------------------ collapse
def test_non_finite_loss_stops_the_run_as_collapsed(tmp_path: Path) -> None:
    with nan_objective("reinforce", after=2) as objective:
        summary = trainer.train(bandit_config(objective=objective, updates=6, checkpoint_every=1), tmp_path)
    assert summary["status"] == "collapsed" and summary["collapse_update"] == 2
    rows = read_rows(tmp_path)
    assert len(rows) == 3 and rows[-1]["loss"] == "nan"
    assert [e["event"] for e in RunDir(tmp_path).read_events()] == ["non_finite_loss", "collapse"]
    assert RunDir(tmp_path).load_checkpoint()["next_update"] == 2  # the bad step was never taken


def test_buffer_packing_round_trips_ragged_rollouts() -> None:
    gen = torch.Generator().manual_seed(0)

    def rollout(rows: int, pw: int, rw: int, noisy: bool) -> Rollout:
        return Rollout(
            prompt_ids=torch.randint(0, 5, (rows, pw), generator=gen), prompt_mask=torch.ones(rows, pw),
            response_ids=torch.randint(0, 5, (rows, rw), generator=gen), response_mask=torch.ones(rows, rw),
            behavior_logp=torch.randn(rows, rw, generator=gen), group_ids=torch.arange(rows),
            prompt_index=torch.arange(rows), rewards=torch.rand(rows, generator=gen),
            version=torch.full((rows,), 3), sampler_logp=torch.randn(rows, rw, generator=gen) if noisy else None,
            temperature=0.7)

    for noisy in (False, True):
        buffer = {4: rollout(6, 2, 5, noisy), 9: rollout(3, 4, 2, noisy)}
        back = Rollout.unpack(Rollout.pack(buffer))
        assert list(back) == [4, 9]
        for key, original in buffer.items():
            for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "behavior_logp",
                         "group_ids", "prompt_index", "rewards", "version", "sampler_logp"):
                a, b = getattr(original, name), getattr(back[key], name)
                assert (a is None and b is None) or torch.equal(a, b), name
            assert back[key].temperature == 0.7
    assert Rollout.unpack(Rollout.pack({})) == {}


def test_exact_diagnostics_match_the_world_enumeration(tmp_path: Path) -> None:
    parts = build(mdp_config(lr=0.5))
    with torch.no_grad():
        for p in parts.policy.trainable_parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    got = exact_diagnostics(parts)
    assert got["exact_return"] == pytest.approx(parts.world.exact_return(parts.policy), rel=1e-9)
    assert got["exact_kl_init"] == pytest.approx(parts.world.exact_kl(parts.policy, parts.initial), rel=1e-9)
    assert got["exact_kl_init"] > 0
