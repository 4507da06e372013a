"""Write a random-init Qwen2.5-1.5B-shaped model directory with the tests' character tokenizer (no downloads).

The body has Qwen2.5-1.5B's sizes (28 layers of width 1536, MLP 8960, 12 query and 2 key/value heads); the
vocabulary is the character tokenizer's (~110 tokens, so the embedding is tiny), with EOS and a chat template, so
``offpolicylab run --world gsm8k --model DIR`` runs the real CLI and trainer on it (e.g. on a GPU with
``--policy-param load_in_4bit=true``) without a hub model.  Its responses are random characters: it measures
speed and memory of the training loop, not learning.

    python benchmarks/qwen_char_model.py DIR [--device cuda]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_memory_qwen import QWEN25_15B  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="directory to write (save_pretrained: config, safetensors, tokenizer)")
    parser.add_argument("--device", default="cpu", help="where to run the random init (cuda is much faster)")
    args = parser.parse_args()
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tests.tiny_llm import build_tokenizer

    tokenizer = build_tokenizer()
    sizes = dict(QWEN25_15B, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                 eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    torch.manual_seed(0)
    with torch.device(args.device):
        model = Qwen2ForCausalLM(Qwen2Config(**sizes)).to(torch.bfloat16)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"wrote {args.out}: Qwen2.5-1.5B-shaped body, {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B "
          f"parameters, character vocabulary of {len(tokenizer)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
