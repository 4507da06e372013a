"""The transformer policy's updates re-derived by an independent plain-torch reference: a tiny run (1 layer,
d_model 8, 2 heads, 8 tokens with EOS, responses of 3, 2 prompts × 4 per update, stale by one update, GRPO) is
trained by the package; every update (sampling aside: the rollouts the run drew are read through an
:class:`~offpolicylab.trainer.UpdateHook`) is recomputed in float64 from the run's starting weights, importing
nothing of the package for the arithmetic, and compared with the run's ``loss``, ``grad_norm`` and its weights after
every update.

The reference (:func:`transformer_log_probs`, :func:`grpo_loss`, :func:`reference_run`), per update from θ_u:

* the forward pass of a GPT-2-style pre-LayerNorm causal transformer (Vaswani et al. 2017, arXiv:1706.03762;
  Radford et al. 2019, GPT-2) over s = [prompt, y_1 … y_{T−1}], positions 0 … L−1:
  h⁰ = E[s] + P[0 … L−1];  h ← h + W_o Attn(LN₁ h) + b_o with Attn = concat_heads softmax(q kᵀ/√d_h + causal) v,
  [q k v] = W_qkv LN₁ h + b_qkv;  h ← h + W₂ GELU(W₁ LN₂ h + b₁) + b₂ (GELU(x) = x·Φ(x));  logits = W LN(h) + b,
  LN(x) = γ (x − mean)/√(var + 1e-5) + β (biased var); the last prompt position predicts y_1.  From our code only
  its architecture choices (one fused qkv map, the mlp ratio 4, exact GELU, a final LayerNorm, no BOS symbol) and
  its weights by ``state_dict`` name;
* log π(y_t) = log-softmax of the logits at y_t;
* GRPO's advantage as verl's ``compute_grpo_outcome_advantage``: (r − r̄_g)/(s_g + 1e-6), s_g Bessel-corrected;
* PPO's clipped surrogate (Schulman et al. 2017, arXiv:1707.06347), ε = 0.2, token mean over the valid tokens:
  L = −(1/N) Σ m_t min(ρ_t A, clip(ρ_t, 1 − ε, 1 + ε) A), ρ_t = exp(log π(y_t) − log π_b(y_t));
* the gradient by autograd (float64), clipped at the global norm: g ← g·min(1, c/(‖g‖ + 1e-6)), c = 1;
* Adam (Kingma & Ba 2014, arXiv:1412.6980): β = (0.9, 0.999), ε = 1e-8, bias-corrected, lr 0.05.

Every weight is compared elementwise except the attention's key biases, whose gradient is exactly 0 (softmax ignores
the shift q·b_k) and whose float32 rounding noise Adam amplifies: they are compared through the log-probs of every
recorded response under the run's and the reference's weights (:func:`key_bias_gradient`).

The run's prompts have no padding (the world's prompts are of one length), so the padding path of the package's
forward is not exercised here (``tests/policies/`` checks that padding changes no logit).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from offpolicylab.config import TrainConfig
from offpolicylab.trainer import train
from tests.trainer.test_golden_reference import (
    EPS_CLIP,
    GRAD_CLIP,
    Recorder,
    advantages,
    clipped_adam_run,
    read,
)

TRANSFORMER_RUN = dict(
    world="token_mdp", world_params={"vocab_size": 8, "length": 3, "num_prompts": 4, "eos": True},
    policy="transformer",
    policy_params={"init": "random", "d_model": 8, "num_layers": 1, "num_heads": 2, "max_prompt_len": 4},
    objective="grpo", schedule="stale_k:2", updates=3, prompts_per_update=2, group_size=4, eval_every=3,
    sample_every=0, checkpoint_every=100, seed=7)
HEADS, LR, LN_EPS = 2, 0.05, 1e-5


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """γ (x − mean)/√(var + 1e-5) + β over the last axis, var the biased variance (Ba et al. 2016, arXiv:1607.06450)."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + LN_EPS) * weight + bias


def attention(x: torch.Tensor, w: dict[str, torch.Tensor], layer: str) -> torch.Tensor:
    """Causal multi-head self-attention of x [B, L, d]: concat_h softmax(q_h k_hᵀ/√d_h, future masked) v_h, then W_o."""
    batch, length, d = x.shape
    qkv = x @ w[f"{layer}.qkv.weight"].T + w[f"{layer}.qkv.bias"]
    q, k, v = (qkv[..., i * d:(i + 1) * d].reshape(batch, length, HEADS, d // HEADS).transpose(1, 2)
               for i in range(3))
    scores = q @ k.transpose(-1, -2) / math.sqrt(d // HEADS)
    future = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
    weights = torch.softmax(scores.masked_fill(future, -math.inf), dim=-1)
    mixed = (weights @ v).transpose(1, 2).reshape(batch, length, d)
    return mixed @ w[f"{layer}.out.weight"].T + w[f"{layer}.out.bias"]


def gelu(x: torch.Tensor) -> torch.Tensor:
    """x·Φ(x), Φ the standard normal CDF (Hendrycks & Gimpel 2016, arXiv:1606.08415)."""
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def transformer_log_probs(w: dict[str, torch.Tensor], batch: dict[str, np.ndarray]) -> torch.Tensor:
    """log π(y_t) [B, T] from the weights ``w`` (float64): the pre-LN forward of the module docstring."""
    assert (batch["prompt_mask"] > 0).all(), "the reference takes unpadded prompts"
    prompt = torch.as_tensor(batch["prompt_ids"]).long()
    responses = torch.as_tensor(batch["response_ids"]).long()
    tokens = torch.cat([prompt, responses[:, :-1]], dim=1)
    h = w["token.weight"][tokens] + w["position.weight"][: tokens.shape[1]]
    layers = sorted({key.split(".")[1] for key in w if key.startswith("blocks.")})
    for index in layers:
        layer = f"blocks.{index}"
        h = h + attention(layer_norm(h, w[f"{layer}.norm1.weight"], w[f"{layer}.norm1.bias"]), w, layer)
        inner = layer_norm(h, w[f"{layer}.norm2.weight"], w[f"{layer}.norm2.bias"])
        inner = gelu(inner @ w[f"{layer}.mlp.0.weight"].T + w[f"{layer}.mlp.0.bias"])
        h = h + inner @ w[f"{layer}.mlp.2.weight"].T + w[f"{layer}.mlp.2.bias"]
    logits = layer_norm(h, w["norm.weight"], w["norm.bias"]) @ w["head.weight"].T + w["head.bias"]
    logits = logits[:, prompt.shape[1] - 1:]
    return torch.log_softmax(logits, -1).gather(-1, responses[..., None]).squeeze(-1)


def grpo_loss(log_probs: torch.Tensor, batch: dict[str, np.ndarray]) -> torch.Tensor:
    """−(1/N) Σ m_t min(ρ_t A, clip(ρ_t, 1 − ε, 1 + ε) A) over the valid tokens (token mean)."""
    adv = torch.as_tensor(advantages(batch["rewards"].astype(np.float64), batch["group_ids"]))[:, None]
    mask = torch.as_tensor(batch["response_mask"], dtype=torch.float64)
    ratio = torch.exp(log_probs - torch.as_tensor(batch["behavior_logp"], dtype=torch.float64))
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - EPS_CLIP, 1 + EPS_CLIP) * adv)
    return -(mask * surrogate).sum() / mask.sum()


def reference_run(start: dict[str, np.ndarray], batches: list[dict[str, np.ndarray]]
                  ) -> list[tuple[float, float, dict[str, np.ndarray]]]:
    """(loss, pre-clip gradient norm, weights after) of every update, Adam's moments carried along."""
    return clipped_adam_run(start, batches, LR, lambda w, batch: grpo_loss(transformer_log_probs(w, batch), batch))


def log_probs_of(weights: dict[str, np.ndarray], batch: dict[str, np.ndarray]) -> np.ndarray:
    w = {name: torch.tensor(value, dtype=torch.float64) for name, value in weights.items()}
    return transformer_log_probs(w, batch).numpy() * batch["response_mask"]


def key_bias_gradient(weights: dict[str, np.ndarray], batch: dict[str, np.ndarray]) -> float:
    """max |∂L/∂b_k| of the key biases: exactly 0, since q·(k + b_k) adds q·b_k to every score of a query's row and
    softmax ignores a shift.  In float32 the package's gradient there is rounding noise (≈ 1e-9), which Adam's
    m/(√v + 1e-8) turns into steps of up to ≈ lr/10 of either sign: those weights are compared through the policy's
    log-probs (which they cannot change), not elementwise."""
    w = {name: torch.tensor(value, dtype=torch.float64, requires_grad=name.endswith("qkv.bias"))
         for name, value in weights.items()}
    biases = [value for name, value in w.items() if name.endswith("qkv.bias")]
    grads = torch.autograd.grad(grpo_loss(transformer_log_probs(w, batch), batch), biases)
    d = weights["norm.weight"].shape[0]
    return max(float(g[d:2 * d].abs().max()) for g in grads)


def test_transformer_grpo_updates_equal_the_reference(tmp_path: Path) -> None:
    config = TrainConfig(**TRANSFORMER_RUN)
    assert (config.optimizer, config.lr, config.grad_clip, config.advantage) == ("adam", LR, GRAD_CLIP, "auto")
    assert config.objective_params in ({}, {"eps_low": EPS_CLIP, "eps_high": EPS_CLIP})
    recorder = Recorder()
    train(config, tmp_path / "run", hooks=[recorder])
    assert len(recorder.batches) == config.updates
    steps = reference_run(recorder.before[0], recorder.batches)
    rows = read(tmp_path / "run" / "metrics.csv")
    assert len(rows) == config.updates == len(steps)
    for (loss, norm, _), row in zip(steps, rows, strict=True):
        assert abs(float(row["loss"]) - loss) <= 1e-6 + 1e-4 * abs(loss), (row["update"], row["loss"], loss)
        assert abs(float(row["grad_norm"]) - norm) <= 1e-6 + 1e-4 * norm, (row["update"], row["grad_norm"], norm)
    d = recorder.before[0]["norm.weight"].shape[0]
    for update, ((_, _, reference), before, after) in enumerate(zip(steps, recorder.before,
                                                                    recorder.after, strict=True)):
        for name, value in reference.items():
            got, want = after[name], value
            if name.endswith("qkv.bias"):  # the key bias: see key_bias_gradient; compared through the log-probs
                got, want = np.delete(got, np.s_[d:2 * d]), np.delete(want, np.s_[d:2 * d])
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"{name} after update {update}")
        if update:  # the run's weights carry over from update to update, as the reference's do
            for name, value in before.items():
                np.testing.assert_array_equal(value, recorder.after[update - 1][name], err_msg=name)
        for batch in recorder.batches:  # the policy itself, key bias included: log π of every recorded response
            np.testing.assert_allclose(log_probs_of(after, batch), log_probs_of(reference, batch), rtol=0, atol=1e-5)
    starts = [recorder.before[0], *(weights for _, _, weights in steps[:-1])]  # the reference's, per update
    ratios = []
    for weights, batch in zip(starts, recorder.batches, strict=True):
        assert key_bias_gradient(weights, batch) < 1e-12
        ratios.append(np.exp(log_probs_of(weights, batch) - batch["behavior_logp"])[batch["response_mask"] > 0])
    # the check has teeth: the weights move by far more than the tolerance, the stale batches are off-policy enough
    # for PPO's clip to bind, and one update's gradient norm exceeds the clip bound (a clipped step is compared)
    assert np.abs(np.concatenate(ratios) - 1).max() > EPS_CLIP
    assert max(np.abs(steps[-1][2][k] - recorder.before[0][k]).max() for k in recorder.before[0]) > 0.1
    assert max(norm for _, norm, _ in steps) > GRAD_CLIP > min(norm for _, norm, _ in steps)
