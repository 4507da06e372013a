"""The ``hf`` policy's updates (a LoRA adapter on a tiny random Llama, ``tests/tiny_llm.py``) re-derived by an
independent plain-torch reference: a tiny GSM8k run (hidden 16, 2 layers, 4 query and 2 key/value heads, LoRA r = 2
on every linear layer, responses of 3 tokens, 2 prompts × 4 per update, stale by one update, GRPO) is trained by the
package; every update (sampling aside: the rollouts the run drew are read through an
:class:`~offpolicylab.trainer.UpdateHook`) is recomputed in float64 from the saved base weights (``safetensors``)
and the run's starting adapter, importing nothing of the package, transformers or peft for the arithmetic, and
compared with the run's ``loss``, ``grad_norm`` and its adapter after every update.

The reference, per update from the adapter θ_u:

* the Llama forward pass (Touvron et al. 2023, arXiv:2302.13971) over [prompt, y_1 … y_{T−1}]:
  h ← E[s];  per layer h ← h + W_o Attn(RMSNorm(h)),  h ← h + W_down (SiLU(W_gate x) ⊙ W_up x), x = RMSNorm(h);
  logits = W_head RMSNorm(h);  RMSNorm(x) = g·x/√(mean x² + ε) (Zhang & Sennrich 2019, arXiv:1910.07467);
  attention causal over the real tokens with 2 query heads per key/value head (grouped-query attention, Ainslie et
  al. 2023, arXiv:2305.13245), scores q·k/√d_h, rotary positions (Su et al. 2021, arXiv:2104.09864) in the
  half-split layout, positions counting real tokens, base θ from the model's config;
* LoRA (Hu et al. 2021, arXiv:2106.09685) on every linear map but the head: W x + (α/r)·B A x, α = 4, r = 2;
* log π(y_t) = log-softmax (temperature 1) of the logits at y_t;
* GRPO's advantage (verl's Bessel std + 1e-6), PPO's clipped token-mean loss (ε = 0.2), global-norm clipping at 1 and
  Adam (β = (0.9, 0.999), ε = 1e-8, lr 0.02) over the adapter only, as ``test_golden_reference.py`` states them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")
import torch
from safetensors.torch import load_file

from offpolicylab.config import TrainConfig
from offpolicylab.trainer import train
from tests.tiny_llm import build_model, build_tokenizer
from tests.trainer.test_golden_reference import GRAD_CLIP, Recorder, clipped_adam_run, read
from tests.trainer.test_golden_reference_transformer import grpo_loss

pytestmark = pytest.mark.llm

LORA_R, LORA_ALPHA, LR = 2, 4.0, 0.02
PROBLEMS = [(1, 2), (3, 4), (2, 5), (0, 1)]
LINEAR = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
          "mlp.up_proj", "mlp.down_proj")
ADAPTER_PREFIX = "base_model.model."


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps)


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of x [B, H, L, d] at ``positions`` [B, L]: the pair (x_i, x_{i+d/2}) turned by the angle
    p·θ^(−2i/d)."""
    half = x.shape[-1] // 2
    angle = positions[:, None, :, None].double() * theta ** (-torch.arange(half, dtype=torch.float64) * 2 / (2 * half))
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * angle.cos() - second * angle.sin(), second * angle.cos() + first * angle.sin()], -1)


def linear(x: torch.Tensor, base: dict[str, torch.Tensor], adapter: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """W x + (α/r)·B A x."""
    lora_a, lora_b = adapter[f"{ADAPTER_PREFIX}{name}.lora_A.weight"], adapter[f"{ADAPTER_PREFIX}{name}.lora_B.weight"]
    return x @ base[f"{name}.weight"].T + (LORA_ALPHA / LORA_R) * (x @ lora_a.T) @ lora_b.T


def llama_log_probs(base: dict[str, torch.Tensor], adapter: dict[str, torch.Tensor], config: dict,
                    batch: dict[str, np.ndarray]) -> torch.Tensor:
    """log π(y_t) [B, T] of the LoRA-adapted Llama (module docstring), float64."""
    responses = torch.as_tensor(batch["response_ids"]).long()
    tokens = torch.cat([torch.as_tensor(batch["prompt_ids"]).long(), responses[:, :-1]], dim=1)
    real = torch.cat([torch.as_tensor(batch["prompt_mask"]) > 0, torch.ones_like(responses[:, :-1], dtype=torch.bool)],
                     dim=1)
    positions = (real.long().cumsum(1) - 1).clamp_min(0)
    batch_size, length = tokens.shape
    heads, kv_heads, eps = config["num_attention_heads"], config["num_key_value_heads"], config["rms_norm_eps"]
    d_head = config["hidden_size"] // heads
    theta = config.get("rope_parameters", {}).get("rope_theta", config.get("rope_theta", 10000.0))
    allowed = torch.ones(length, length, dtype=torch.bool).tril()[None] & real[:, None, :]
    h = base["model.embed_tokens.weight"][tokens]
    for layer in range(config["num_hidden_layers"]):
        name = f"model.layers.{layer}."
        x = rms_norm(h, base[name + "input_layernorm.weight"], eps)
        q, k, v = (linear(x, base, adapter, name + f"self_attn.{p}_proj").reshape(batch_size, length, -1, d_head)
                   .transpose(1, 2) for p in "qkv")
        q, k = rotate(q, positions, theta), rotate(k, positions, theta)
        k, v = (z.repeat_interleave(heads // kv_heads, dim=1) for z in (k, v))  # key/value head j serves j·2, j·2+1
        scores = (q @ k.transpose(-1, -2) / math.sqrt(d_head)).masked_fill(~allowed[:, None], -math.inf)
        mixed = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(batch_size, length, -1)
        h = h + linear(mixed, base, adapter, name + "self_attn.o_proj")
        x = rms_norm(h, base[name + "post_attention_layernorm.weight"], eps)
        gate = linear(x, base, adapter, name + "mlp.gate_proj")
        h = h + linear(gate * torch.sigmoid(gate) * linear(x, base, adapter, name + "mlp.up_proj"), base, adapter,
                       name + "mlp.down_proj")
    logits = rms_norm(h, base["model.norm.weight"], eps) @ base["lm_head.weight"].T
    logits = logits[:, batch["prompt_ids"].shape[1] - 1:]
    return torch.log_softmax(logits, -1).gather(-1, responses[..., None]).squeeze(-1)


def reference_run(base: dict[str, torch.Tensor], start: dict[str, np.ndarray], config: dict,
                  batches: list[dict[str, np.ndarray]]) -> list[tuple[float, float, dict[str, np.ndarray]]]:
    """(loss, pre-clip gradient norm, adapter after) of every update, Adam's moments carried along."""
    return clipped_adam_run(start, batches, LR, lambda w, batch: grpo_loss(llama_log_probs(base, w, config, batch), batch))


def test_hf_lora_grpo_updates_equal_the_reference(tmp_path: Path) -> None:
    tokenizer = build_tokenizer([f"#### {d}" for d in range(8)])  # one-token answers: rewards 0, 0.1 and 1 occur
    build_model(len(tokenizer), seed=0, hidden=16).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    (tmp_path / "data").mkdir()
    rows = "".join(json.dumps({"question": f"{a}+{b}?", "answer": f"#### {a + b}"}) + "\n" for a, b in PROBLEMS)
    for split in ("train", "test"):
        (tmp_path / "data" / f"{split}.jsonl").write_text(rows)
    config = TrainConfig(world="gsm8k", world_params={"model": str(tmp_path / "model"), "data": str(tmp_path / "data"),
                                                      "max_response_len": 3, "n_eval": 2},
                         policy="hf", policy_params={"lora_r": LORA_R, "lora_alpha": LORA_ALPHA}, objective="grpo",
                         schedule="stale_k:2", updates=3, prompts_per_update=2, group_size=4, lr=LR, eval_every=3,
                         eval_samples=1, sample_every=0, checkpoint_every=100, seed=0)
    assert (config.optimizer, config.grad_clip, config.temperature, config.objective_params) == ("adam", GRAD_CLIP,
                                                                                                 1.0, {})
    recorder = Recorder()
    train(config, tmp_path / "run", hooks=[recorder])
    base = {k: v.double() for k, v in load_file(tmp_path / "model" / "model.safetensors").items()}
    model_config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert len(recorder.before[0]) == 2 * len(LINEAR) * model_config["num_hidden_layers"]  # LoRA on all-linear
    steps = reference_run(base, recorder.before[0], model_config, recorder.batches)
    metrics = read(tmp_path / "run" / "metrics.csv")
    assert len(metrics) == config.updates == len(steps)
    for (loss, norm, _), row in zip(steps, metrics, strict=True):
        assert abs(float(row["loss"]) - loss) <= 1e-6 + 1e-4 * abs(loss), (row["update"], row["loss"], loss)
        assert abs(float(row["grad_norm"]) - norm) <= 1e-6 + 1e-4 * norm, (row["update"], row["grad_norm"], norm)
    for update, ((_, _, reference), after) in enumerate(zip(steps, recorder.after, strict=True)):
        for name, value in reference.items():
            np.testing.assert_allclose(after[name], value, rtol=1e-4, atol=1e-5, err_msg=f"{name} after {update}")
    # teeth: the adapter moves far beyond the tolerance and a gradient norm exceeds the clip bound
    assert max(np.abs(steps[-1][2][k] - recorder.before[0][k]).max() for k in recorder.before[0]) > 0.01
    assert max(norm for _, norm, _ in steps) > GRAD_CLIP
