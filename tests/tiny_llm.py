"""Tiny random-init Llama + a character-level tokenizer built locally (no downloads) for the LLM tests and
``benchmarks/llm_vs_trl.py``."""

from __future__ import annotations

import string
from collections.abc import Sequence

import torch
import transformers

from offpolicylab.contracts import Prompts

SPECIAL = ["<pad>", "<eos>", "<|user|>", "<|assistant|>", "<|system|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer(extra_tokens: Sequence[str] = ()) -> transformers.PreTrainedTokenizerFast:
    """One token per printable ASCII character plus the special tokens; decoding concatenates.  ``extra_tokens``
    are appended to the vocabulary (decodable; text still encodes per character)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    chars = sorted(set(string.printable) - set("\x0b\x0c\r"))
    vocab = {tok: i for i, tok in enumerate(SPECIAL + ["<unk>"] + chars + list(extra_tokens))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
        additional_special_tokens=SPECIAL[2:],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(vocab_size: int, seed: int = 0, hidden: int = 32) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, eos_token_id=1, bos_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    # larger random weights than the default init so the tiny model's distributions are far from uniform
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.5)
    return model.float().eval()



def encode_prompts(tokenizer: transformers.PreTrainedTokenizerBase, texts: list[str]) -> Prompts:
    """``texts`` tokenized and left-padded with ``pad_token_id`` into :class:`Prompts` (index 0 … N−1)."""
    rows = [tokenizer(t)["input_ids"] for t in texts]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    mask = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = 1
    return Prompts(ids, mask, torch.arange(len(rows)))
