"""Tiny random-init Llama + a character-level tokenizer built locally (no downloads) for the LLM tests."""

from __future__ import annotations

import string

import torch
import transformers

SPECIAL = ["<pad>", "<eos>", "<|user|>", "<|assistant|>", "<|system|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """One token per printable ASCII character plus the special tokens; decoding concatenates."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    chars = sorted(set(string.printable) - set("\x0b\x0c\r"))
    vocab = {tok: i for i, tok in enumerate(SPECIAL + ["<unk>"] + chars)}
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


