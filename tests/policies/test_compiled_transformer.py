"""``compiled = true``: the transformer's blocks through ``torch.compile`` compute what the eager blocks compute, to
float32 rounding — scoring, gradients and KV-cached sampling — and a copy of a compiled policy follows its own
weights (the compiled function is bound to no module)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from offpolicylab import trainer
from offpolicylab.config import TrainConfig
from offpolicylab.contracts import Prompts
from offpolicylab.policies.transformer import TransformerPolicy
from offpolicylab.policies.transformer_stack import StackedTransformerPolicy
from tests.policies.test_transformer_stack import TINY_WORLD
from tests.small_runs import train_killed_at
from tests.trainer.test_seeds import assert_same_run

TOLERANCE = 1e-5  # float32 rounding of fused kernels, logits of order 1
pytestmark = pytest.mark.skipif(not any(shutil.which(n) for n in ("g++", "c++", "clang++")),
                                reason="torch.compile on the CPU needs a C++ compiler, and this machine has none")


def _policy(compiled: bool, seed: int = 0) -> TransformerPolicy:
    return TransformerPolicy(vocab_size=20, response_len=6, eos_id=1, prompt_vocab_size=25, max_prompt_len=5,
                             d_model=16, num_layers=2, num_heads=4, seed=seed, compiled=compiled)


def _prompts(rows: int) -> Prompts:
    ids = torch.randint(25, (rows, 5), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(rows, 5)
    mask[::2, :2] = 0  # left padding on every other row
    return Prompts(ids=ids, mask=mask, index=torch.arange(rows))


def test_compiled_scoring_and_gradients_equal_eager_to_rounding() -> None:
    eager, compiled = _policy(False), _policy(True)
    prompts = _prompts(6)
    response = torch.randint(20, (6, 6), generator=torch.Generator().manual_seed(2))
    weights = torch.randn(6, 6, 20, generator=torch.Generator().manual_seed(3))
    outputs = []
    for policy in (eager, compiled):
        logits = policy.response_logits(prompts.ids, prompts.mask, prompts.index, response)
        (logits * weights).sum().backward()
        outputs.append((logits.detach(), {name: p.grad for name, p in policy.model.named_parameters()}))
    (eager_logits, eager_grads), (compiled_logits, compiled_grads) = outputs
    assert (eager_logits - compiled_logits).abs().max() < TOLERANCE
    for name, grad in eager_grads.items():
        assert (grad - compiled_grads[name]).abs().max() <= TOLERANCE * max(1.0, float(grad.abs().max())), name


def test_compiled_sampling_agrees_with_eager_scoring_and_a_copy_keeps_its_own_weights() -> None:
    eager, compiled = _policy(False), _policy(True)
    rollout = compiled.sample(_prompts(4), 3, generator=torch.Generator().manual_seed(5))
    mask = rollout.response_mask > 0
    with torch.no_grad():
        assert (eager.score(rollout)[0] - rollout.behavior_logp)[mask].abs().max() < TOLERANCE
        copy = compiled.clone()
        before = copy.score(rollout)[0]
        for param in compiled.model.parameters():
            param.add_(0.5)
        assert torch.equal(copy.score(rollout)[0], before)  # the copy did not follow the original's new weights
        assert (compiled.score(rollout)[0] - before)[mask].abs().max() > 0.01  # the original did move


def test_what_compiled_blocks_cannot_run_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="need compiled=false"):
        StackedTransformerPolicy([_policy(True, 1), _policy(True, 2)])
    with pytest.raises(ValueError, match="cannot run sampler_precision=fp8_e4m3"):
        TransformerPolicy(vocab_size=20, response_len=6, compiled=True, sampler_precision="fp8_e4m3")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(ValueError, match="needs a C\\+\\+ compiler"):
        _policy(True)
    assert not _policy(False).model.compiled  # eager blocks need no compiler


def test_a_compiled_run_resumed_after_a_kill_ends_as_the_uninterrupted_one(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Both options together on a small synthetic-LM world, killed while it saves checkpoint 4 of 6."""
    config = TrainConfig(world="synthetic_lm", world_params={**TINY_WORLD, "cache_dir": str(tmp_path / "cache")},
                         policy_params={"compiled": True, "token_draw": "inverse_cdf"}, objective="grpo",
                         schedule="stale_k:2", updates=6, prompts_per_update=2, group_size=4, eval_every=3,
                         sample_every=0, checkpoint_every=2)
    train_killed_at(config, tmp_path / "cut", 4, monkeypatch)
    trainer.train(config, tmp_path / "cut", resume=True)
    trainer.train(config, tmp_path / "whole")
    assert_same_run(tmp_path / "cut", tmp_path / "whole", resumed_at=2)
