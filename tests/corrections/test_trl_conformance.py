"""Our ``trl`` correction against the installed TRL's own code, on the shared fixtures.

TRL computes its vLLM importance-sampling ratio inline in ``GRPOTrainer._generate_and_score_completions``; the test
takes that block from the installed source (``inspect.getsource``) and runs TRL's own lines on the fixtures, so
a change in TRL's code shows here.  The off-policy sequence mask is TRL's static ``GRPOTrainer.get_off_policy_mask``.
TRL's per-token loss is ``per_token_loss · ratio · off_policy_mask`` with its mask unchanged: we check
``weights · keep == ratio · off_policy_mask`` on the response and ``keep == mask ∧ ¬invalid ∧ off_policy_mask``.
"""

from __future__ import annotations

import inspect
import math
import textwrap
from types import SimpleNamespace

import pytest
import torch

from offpolicylab import corrections
from tests.corrections.fixtures import FIXTURES

grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer")  # trl is a dev dependency: CI always runs this

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
BOUNDS = ((3.0, None), (2.0, 0.5), (None, 0.8), (1.01, 0.99))


def trl_ratio_block() -> str:
    """The IS-ratio block of the installed ``_generate_and_score_completions``, dedented."""
    lines = inspect.getsource(grpo_trainer.GRPOTrainer._generate_and_score_completions).splitlines()
    for start, line in enumerate(lines):
        if line.strip() == "if self.use_vllm and self.vllm_importance_sampling_correction:" and \
                "mask = completion_mask" in lines[start + 1]:
            break
    else:
        pytest.fail("TRL's importance-sampling block was not found in GRPOTrainer._generate_and_score_completions: "
                    "TRL changed; re-read its source and update offpolicylab/corrections/trl.py")
    indent = len(line) - len(line.lstrip())
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
        end += 1
    return textwrap.dedent("\n".join(lines[start:end]))


BLOCK = compile(trl_ratio_block(), "trl-grpo-is-block", "exec")


def run_trl(logp, sampler, mask, mode, clip_max, clip_min):
    trainer = SimpleNamespace(use_vllm=True, vllm_importance_sampling_correction=True,
                              vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_max=clip_max,
                              vllm_importance_sampling_clip_min=clip_min)
    scope = {"self": trainer, "completion_mask": mask, "tool_mask": None, "old_per_token_logps": logp,
             "sampling_per_token_logps": sampler, "torch": torch, "math": math}
    exec(BLOCK, scope)  # TRL's own lines
    ratio = scope["vllm_importance_sampling_ratio"]
    invalid = scope.get("invalid_mis_mask", torch.zeros_like(ratio, dtype=torch.bool))
    return ratio.expand(logp.shape), invalid.expand(logp.shape)


def exact(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True, check_dtype=False)


@pytest.mark.parametrize("name", FIXTURES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bounds", BOUNDS, ids=lambda b: f"max{b[0]}-min{b[1]}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_importance_sampling_matches_trl(name, mode, bounds, dtype) -> None:
    logp, sampler, mask, _ = FIXTURES[name](dtype)
    mask = mask.int()  # TRL's completion_mask is int
    clip_max, clip_min = bounds
    ratio, invalid = run_trl(logp, sampler, mask, mode, clip_max, clip_min)
    weights, keep = corrections.apply("trl", logp, sampler, mask, vllm_importance_sampling_mode=mode,
                                      vllm_importance_sampling_clip_max=clip_max,
                                      vllm_importance_sampling_clip_min=clip_min)
    valid = mask.bool()
    exact(weights * keep, torch.where(valid, ratio, 0.0))
    exact(weights[~valid], torch.zeros_like(weights[~valid]))
    exact(keep, (valid & ~invalid).int())


@pytest.mark.parametrize("name", FIXTURES)
@pytest.mark.parametrize("delta", [0.5, 1e-3, 0.0])
def test_off_policy_mask_matches_trl(name, delta) -> None:
    logp, sampler, mask, advantages = FIXTURES[name]()
    current = logp + 0.01 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(7))
    theirs = grpo_trainer.GRPOTrainer.get_off_policy_mask(
        advantages=advantages.unsqueeze(1), per_token_logps=current, sampling_per_token_logps=sampler, mask=mask,
        off_policy_threshold=delta)
    weights, keep = corrections.apply("trl", logp, sampler, mask, advantages=advantages, current_logp=current,
                                      vllm_importance_sampling_correction=False, off_policy_mask_threshold=delta)
    exact(keep, mask * theirs)
    exact(weights, mask)


def test_the_block_is_trls_and_the_defaults_are_grpoconfigs() -> None:
    """The executed block is TRL's ratio code, and our defaults are GRPOConfig's."""
    assert "torch.exp(logps_diff)" in trl_ratio_block()
    from trl import GRPOConfig

    fields = GRPOConfig.__dataclass_fields__
    for name, spec in corrections.ENGINES["trl"].params.items():
        assert fields[name].default == spec.default, name


def test_issue_4772_numbers() -> None:
    """TRL #4772: 0.012 nat per token over 100 tokens is a sequence ratio e^1.2 ≈ 3.32 > 3.0, so the default
    sequence_mask drops the sequence, while token_truncate keeps every token at ratio e^0.012."""
    logp = torch.full((1, 100), -1.0 + 0.012, dtype=torch.float64)
    sampler = torch.full((1, 100), -1.0, dtype=torch.float64)
    mask = torch.ones(1, 100)
    _, keep = corrections.apply("trl", logp, sampler, mask)
    assert keep.sum() == 0
    weights, keep = corrections.apply("trl", logp, sampler, mask, vllm_importance_sampling_mode="token_truncate")
    assert keep.sum() == 100 and torch.allclose(weights, torch.full_like(weights, math.exp(0.012)))
