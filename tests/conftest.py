"""Test-wide settings: one intra-op thread (the tensors here are small; more threads only add contention on the
2-core CI machine), a non-interactive matplotlib backend, and the fixtures of the tests marked ``llm`` (a tiny random
Llama and a local character tokenizer, see tiny_llm.py; skipped without the llm extra)."""

import os

os.environ.setdefault("MPLBACKEND", "Agg")

import torch  # noqa: E402

torch.set_num_threads(1)


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer():
    pytest.importorskip("transformers")
    from tests.tiny_llm import build_tokenizer

    return build_tokenizer()


@pytest.fixture
def make_policy(tokenizer):
    pytest.importorskip("peft")
    from offpolicylab.policies.hf import HFPolicy, LoraSpec
    from tests.tiny_llm import build_model

    def make(seed: int = 0, max_new_tokens: int = 12, **kwargs) -> HFPolicy:
        lora = kwargs.pop("lora", LoraSpec(r=4, alpha=8.0))
        return HFPolicy(build_model(len(tokenizer), seed), tokenizer, lora=lora, max_new_tokens=max_new_tokens,
                        **kwargs)

    return make
