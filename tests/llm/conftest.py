"""Fixtures for the LLM tests: a tiny random Llama and a local character tokenizer (see tiny.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

from offpolicylab.policies.hf import HFPolicy, LoraSpec  # noqa: E402

from .tiny import build_model, build_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture
def make_policy(tokenizer):
    def make(seed: int = 0, max_new_tokens: int = 12, **kwargs) -> HFPolicy:
        lora = kwargs.pop("lora", LoraSpec(r=4, alpha=8.0))
        return HFPolicy(build_model(len(tokenizer), seed), tokenizer, lora=lora, max_new_tokens=max_new_tokens,
                        **kwargs)

    return make
