"""A mismatch correction with the sampler's numbers as behaviour is refused before anything is written: the
correction weighs π_b/π_sampler, which ``behavior_logp = sampler`` makes 1 on every token (the run would train
uncorrected without saying so)."""

from __future__ import annotations

from pathlib import Path

import pytest

from offpolicylab import trainer
from offpolicylab.behavior import behavior_source
from offpolicylab.policies.hf import HFPolicy
from offpolicylab.policies.tabular import TabularSoftmaxPolicy
from tests.small_runs import mdp_config

NOISY = {"policy_params": {"sampler_noise_std": 0.1}}


@pytest.mark.parametrize("params", [{"tis_cap": 2.0}, {"correction": {"engine": "verl", "rollout_is": "token",
                                                                        "rollout_is_threshold": 2.0}}])
def test_a_correction_with_sampler_behaviour_is_refused_before_writing(tmp_path: Path, params: dict) -> None:
    config = mdp_config(objective="grpo", objective_params=params, behavior_logp="sampler", **NOISY)
    with pytest.raises(ValueError, match="behavior_logp=trainer"):
        trainer.train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    summary = trainer.train(mdp_config(objective="grpo", objective_params=params, behavior_logp="trainer",
                                       updates=2, **NOISY), tmp_path / "ok")
    assert summary["status"] == "completed"


def test_auto_resolves_to_each_policys_default_source() -> None:
    """``auto`` is the toy policies' own numbers and an hf policy's sampler's (the refusal names it)."""
    assert behavior_source(TabularSoftmaxPolicy(num_prompts=1, vocab_size=2, response_len=1), "auto") == "trainer"
    assert behavior_source(object.__new__(HFPolicy), "auto") == "sampler"
    assert behavior_source(object.__new__(HFPolicy), "trainer") == "trainer"
