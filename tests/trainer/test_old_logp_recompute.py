"""The old log-probs as verl computes them (``logp_micro_batch``): the trainer's scoring forward recomputes them right
after generation in their own micro-batches, the sampler's numbers move to ``sampler_logp``, and ``sampler_kl`` is
the k1 estimate mean(log π_sampler − log π_trainer) over the valid tokens."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from offpolicylab.behavior import sample_rollout
from offpolicylab.config import TrainConfig
from offpolicylab.contracts import Prompts
from offpolicylab.policies.transformer import TransformerPolicy
from offpolicylab.trainer import train
from tests.trainer.test_behavior_source import COMMON, RUNS


def _policy(**kwargs) -> TransformerPolicy:
    return TransformerPolicy(vocab_size=24, response_len=6, eos_id=3, max_prompt_len=3, d_model=16, num_layers=2,
                             num_heads=2, seed=1, **kwargs)


def _prompts() -> Prompts:
    ids = torch.tensor([[5, 6, 7], [8, 9, 10], [11, 12, 13]])
    return Prompts(ids=ids, mask=torch.ones(3, 3), index=torch.arange(3))


@pytest.mark.parametrize(("trainer", "sampler"), [("fp32", "fp32"), ("bf16", "bf16"), ("bf16", "fp32")])
def test_recompute_scores_micro_batches_and_keeps_the_samplers_numbers(trainer: str, sampler: str) -> None:
    """behavior_logp = the scoring forward of rows [0, 5), [5, 10), [10, 12) (each its own call, as written out
    here); sampler_logp = what the sampling pass reported for the same draws without the option."""
    policy = _policy(trainer_precision=trainer, sampler_precision=sampler)
    policy.logp_micro_batch = 5
    rollout = sample_rollout(policy, _prompts(), 4, 1.0, torch.Generator().manual_seed(0), "trainer")
    plain = _policy(trainer_precision=trainer, sampler_precision=sampler)
    engine = plain.sample(_prompts(), 4, 1.0, torch.Generator().manual_seed(0), policy_logp=False)
    assert torch.equal(rollout.response_ids, engine.response_ids)
    assert torch.equal(rollout.sampler_logp, engine.sampler_logp if engine.sampler_logp is not None
                       else engine.behavior_logp)
    with torch.no_grad():
        parts = [plain.score(rollout.select(torch.arange(a, b)))[0] for a, b in ((0, 5), (5, 10), (10, 12))]
    assert torch.equal(rollout.behavior_logp, torch.cat(parts) * rollout.response_mask)


def test_sampler_kl_is_the_k1_estimate_of_the_recorded_batch(tmp_path: Path) -> None:
    """sampler_kl = Σ_valid (log π_sampler − log π_trainer) / #valid, recomputed in NumPy from the recorded batch's
    sampler_log_ratio (= log π_trainer − log π_sampler) and mask; a bf16 sampler against a bf16 trainer disagrees."""
    out = tmp_path / "run"
    train(TrainConfig(**{**COMMON, **RUNS["transformer"], "sample_every": 1, "behavior_logp": "trainer",
                         "policy_params": {"sampler_precision": "bf16", "trainer_precision": "bf16",
                                           "logp_micro_batch": 4}}), out)
    with open(out / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    for row in rows:
        recorded = np.load(out / "samples" / f"update_{int(row['update']):06d}.npz")
        mask = recorded["batch_mask"] > 0
        expected = -recorded["batch_sampler_log_ratio"][mask].astype(np.float64).mean()
        assert float(row["sampler_kl"]) == pytest.approx(expected, rel=1e-5, abs=1e-9)
        assert float(row["sampler_log_ratio_abs_mean"]) > 0.0
