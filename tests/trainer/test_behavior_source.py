"""``behavior_logp``: where the ratios' denominator comes from.  With an exact (fp32) sampler the sampler's numbers
are the trainer's, so every choice trains today's run bit for bit; with a reduced-precision sampler on-policy,
``sampler`` puts the numeric mismatch into every ratio and ``trainer`` leaves the ratio at 1 and the mismatch in
``sampler_logp``."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from offpolicylab import cli
from offpolicylab.behavior import resolve_behavior
from offpolicylab.config import TrainConfig
from offpolicylab.contracts import Prompts
from offpolicylab.policies.tabular import TabularSoftmaxPolicy
from offpolicylab.trainer import train
from tests.trainer.golden_runs import normalized_metrics

SMALL_MDP = {"vocab_size": 3, "length": 4, "num_prompts": 3}
TINY_LM = {"preset": "seed_scale", "vocab_size": 32, "response_len": 8, "num_keys": 4, "num_train_prompts": 16, "d_model": 16,
           "num_heads": 2, "num_layers": 2, "distill_steps": 20, "distill_batch": 16}
RUNS = {
    "tabular": dict(world="token_mdp", world_params={**SMALL_MDP, "family": "forking"}, objective="p3o", updates=6),
    "transformer": dict(world="synthetic_lm", world_params=TINY_LM, policy="transformer", objective="m2po",
                        updates=4, lr=3e-3),
}
COMMON = dict(prompts_per_update=3, group_size=4, eval_every=3, sample_every=0, checkpoint_every=100, seed=2)


def _run(tmp_path: Path, name: str, **overrides) -> Path:
    out = tmp_path / name
    train(TrainConfig(**{**COMMON, **overrides}), out)
    return out


def _rows(out: Path) -> list[dict[str, str]]:
    with open(out / "metrics.csv", newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_with_an_fp32_sampler_every_source_trains_todays_run_bit_for_bit(kind: str, tmp_path: Path) -> None:
    today = normalized_metrics(_run(tmp_path, "today", **RUNS[kind]))
    for source in ("sampler", "trainer"):
        run = _run(tmp_path, source, **RUNS[kind], behavior_logp=source,
                   policy_params={"sampler_precision": "fp32"})
        assert normalized_metrics(run) == today, source


def test_sampler_numbers_put_the_mismatch_into_every_ratio_trainer_numbers_into_sampler_logp(tmp_path: Path) -> None:
    """On-policy, one update per batch, bf16 sampler: with ``trainer`` the log-ratio is 0 and |behavior − sampler|
    is the mismatch; with ``sampler`` the log-ratio is that mismatch (the same draws at update 0, so the same
    number), and sampler_logp = behavior_logp."""
    runs = {source: _rows(_run(tmp_path, source, **RUNS["transformer"], behavior_logp=source,
                               policy_params={"sampler_precision": "bf16"})) for source in ("trainer", "sampler")}
    trainer, sampler = runs["trainer"], runs["sampler"]
    assert all(float(row["log_ratio_abs_mean"]) == 0.0 for row in trainer)
    assert all(float(row["sampler_log_ratio_abs_mean"]) > 0.0 for row in trainer)
    assert all(float(row["log_ratio_abs_mean"]) > 0.0 for row in sampler)
    assert all(float(row["sampler_log_ratio_abs_mean"]) == 0.0 for row in sampler)
    assert float(sampler[0]["log_ratio_abs_mean"]) == pytest.approx(float(trainer[0]["sampler_log_ratio_abs_mean"]),
                                                                    rel=1e-5)


def test_resolve_behavior_takes_the_numbers_the_source_names() -> None:
    policy = TabularSoftmaxPolicy(num_prompts=2, vocab_size=4, response_len=3, sampler_precision="fp8_e4m3")
    with torch.no_grad():
        policy.logits.normal_(0, 2, generator=torch.Generator().manual_seed(0))
    prompts = Prompts(ids=torch.zeros(2, 1, dtype=torch.long), mask=torch.ones(2, 1), index=torch.arange(2))
    rollout = policy.sample(prompts, 4, 1.0, torch.Generator().manual_seed(1))
    assert not torch.equal(rollout.behavior_logp, rollout.sampler_logp)
    for source in ("auto", "trainer"):
        assert resolve_behavior(policy, rollout, source) is rollout
    sampler = resolve_behavior(policy, rollout, "sampler")
    assert torch.equal(sampler.behavior_logp, rollout.sampler_logp)
    assert torch.equal(sampler.sampler_logp, rollout.sampler_logp)
    with pytest.raises(ValueError, match="behavior_logp must be one of auto, trainer, sampler"):
        resolve_behavior(policy, rollout, "engine")


def test_earlier_configs_recompute_flag_becomes_the_source() -> None:
    assert TrainConfig.from_dict({"recompute_behavior_logp": True}).behavior_logp == "trainer"
    assert TrainConfig.from_dict({"recompute_behavior_logp": "false"}).behavior_logp == "auto"
    assert "recompute_behavior_logp" not in TrainConfig().to_dict()


def test_a_run_written_before_the_switch_resumes_as_the_same_configuration(tmp_path: Path) -> None:
    """A config.json with the earlier ``recompute_behavior_logp: false`` (and no ``behavior_logp``) is the same
    configuration as ``behavior_logp: auto``: --resume extends it, and it trains as the uninterrupted run (the
    evaluation the short run made at its last update is the only difference the extension leaves)."""
    import json

    config = TrainConfig(**{**COMMON, **RUNS["tabular"]})
    whole = tmp_path / "whole"
    train(config, whole)
    short = tmp_path / "short"
    train(TrainConfig(**{**COMMON, **RUNS["tabular"], "updates": 3}), short)
    stored = json.loads((short / "config.json").read_text())
    stored["recompute_behavior_logp"] = stored.pop("behavior_logp") == "trainer"
    (short / "config.json").write_text(json.dumps(stored))
    assert cli.main(["run", "--resume", "--out", str(short), "--updates", str(config.updates)]) == 0
    trained = [[row[k] for k in ("update", "reward_mean", "grad_norm", "loss")] for row in _rows(short)]
    assert trained == [[row[k] for k in ("update", "reward_mean", "grad_norm", "loss")] for row in _rows(whole)]
