"""Tiny random-init Llama + a character-level tokenizer built locally (no downloads) for the LLM tests and
``benchmarks/llm_vs_trl.py``."""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from pathlib import Path

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



def save_model_and_data(root: Path, tokenizer: transformers.PreTrainedTokenizerBase, rows: list[dict[str, str]],
                        splits: Sequence[str]) -> dict[str, Path]:
    """A tiny model for ``tokenizer`` and the tokenizer saved under ``root/model``, and the GSM8k ``rows`` as
    ``root/gsm8k/<split>.jsonl`` for each split: {"model": ..., "data": ...}."""
    build_model(len(tokenizer), seed=0).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    (root / "gsm8k").mkdir()
    for split in splits:
        (root / "gsm8k" / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return {"model": root / "model", "data": root / "gsm8k"}


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


GGUF_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
GGUF_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tiny_gguf(path: str, seed: int = 0, hidden: int = 32, layers: int = 2) -> None:
    """A tiny random Llama as a GGUF file (float32 tensors, llama.cpp names) with a byte-level BPE tokenizer (the
    256 byte symbols, two merges, three control tokens, EOS ``<|im_end|>``) and a chat template, written with the
    ``gguf`` package, as llama.cpp's converter lays one out."""
    import gguf
    import numpy as np
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    tokens = symbols + ["Ġt", "Ġth", *GGUF_SPECIAL]
    merges = ["Ġ t", "Ġt h"]
    heads, kv_heads, ffn = 4, 2, 2 * hidden
    head_dim = hidden // heads
    rng = np.random.default_rng(seed)

    def weight(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - len(GGUF_SPECIAL)) + [3] * len(GGUF_SPECIAL))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_chat_template(GGUF_CHAT_TEMPLATE)
    writer.add_tensor("token_embd.weight", weight(len(tokens), hidden))
    for layer in range(layers):
        prefix = f"blk.{layer}."
        writer.add_tensor(prefix + "attn_norm.weight", 1.0 + weight(hidden, scale=0.1))
        writer.add_tensor(prefix + "attn_q.weight", weight(hidden, hidden))
        writer.add_tensor(prefix + "attn_k.weight", weight(kv_heads * head_dim, hidden))
        writer.add_tensor(prefix + "attn_v.weight", weight(kv_heads * head_dim, hidden))
        writer.add_tensor(prefix + "attn_output.weight", weight(hidden, hidden))
        writer.add_tensor(prefix + "ffn_norm.weight", 1.0 + weight(hidden, scale=0.1))
        writer.add_tensor(prefix + "ffn_gate.weight", weight(ffn, hidden))
        writer.add_tensor(prefix + "ffn_up.weight", weight(ffn, hidden))
        writer.add_tensor(prefix + "ffn_down.weight", weight(hidden, ffn))
    writer.add_tensor("output_norm.weight", 1.0 + weight(hidden, scale=0.1))
    writer.add_tensor("output.weight", weight(len(tokens), hidden, scale=1.0))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
