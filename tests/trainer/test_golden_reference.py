"""The golden runs ``tabular_token_mdp_grpo`` and ``sequence_model_token_mdp_m2po_stale`` re-derived by independent
references: every update of the whole run
(sampling aside: the rollouts the run drew are read through an :class:`~offpolicylab.trainer.UpdateHook`) computed
in NumPy from the papers, importing nothing of the package for the arithmetic, and compared with the golden CSV's
``loss`` and ``grad_norm`` and with the run's weights after every update.

The reference, per update u, from θ_u (a softmax table θ[prompt, position, previous token or BOS, token]):

* log π(y_t) = θ[x, t, c_t, y_t] − logsumexp θ[x, t, c_t, ·], c_0 = BOS, c_t = y_{t−1};
* GRPO's advantage (Shao et al. 2024, arXiv:2402.03300) as verl computes it: A_i = (r_i − r̄_g)/(s_g + 1e-6),
  s_g the Bessel-corrected std of the group; 0 for a group of equal rewards;
* PPO's clipped objective (Schulman et al. 2017, arXiv:1707.06347), ε = 0.2, token mean over the valid tokens:
  L = −(1/N) Σ m_t min(ρ_t A, clip(ρ_t, 1 − ε, 1 + ε) A), ρ_t = exp(log π(y_t) − log π_b(y_t)); its gradient by hand:
  ∂L/∂θ[x, t, c_t, ·] = −(m_t/N)·A·ρ_t·(e_{y_t} − softmax θ[x, t, c_t, ·]) unless the clip binds (A > 0, ρ > 1 + ε or
  A < 0, ρ < 1 − ε);
* global-norm clipping g ← g·min(1, c/(‖g‖ + 1e-6)), c = 1;
* Adam (Kingma & Ba 2014, arXiv:1412.6980): β = (0.9, 0.999), ε = 1e-8, lr 0.05, bias-corrected.

The GRU run (stale_k:3, M2PO at τ = 0.04, Adam at lr 0.01) is re-derived in plain torch (float64, autograd for the
gradient) from its weights: the policy's forward pass as its module docstring states it (:func:`gru_log_probs`),
M2PO's loss (:func:`m2po_loss`), the same clipping and Adam.  Its M2PO mask never binds in this run (M̂2 of the
trust-region tokens stays below τ), so the reference checks the network, the stale batches' ratios, the advantage
and the optimizer there; the mask itself is checked against NumPy in ``tests/objectives/test_m2po.py``.  The
transformer policy's updates are re-derived the same way in ``test_golden_reference_transformer.py``, the ``hf``
policy's (LoRA on a tiny Llama) in ``test_golden_reference_hf.py``.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from offpolicylab.config import TrainConfig
from offpolicylab.trainer import UpdateHook, train
from tests.trainer.golden_runs import GOLDEN_DIR, GOLDEN_RUNS

NAME = "tabular_token_mdp_grpo"
EPS_CLIP, GRAD_CLIP, LR, BETAS, ADAM_EPS = 0.2, 1.0, 0.05, (0.9, 0.999), 1e-8


class Recorder(UpdateHook):
    """The rollout each update consumes and the weights before and after it (read only; float64 copies)."""

    def __init__(self) -> None:
        self.batches: list[dict[str, np.ndarray]] = []
        self.before: list[dict[str, np.ndarray]] = []
        self.after: list[dict[str, np.ndarray]] = []

    def on_batch(self, update: int, stack: Any, rollouts: list[Any]) -> None:
        (rollout,) = rollouts
        self.batches.append({name: getattr(rollout, name).detach().numpy().copy() for name in
                             ("prompt_ids", "prompt_mask", "prompt_index", "response_ids", "response_mask",
                              "behavior_logp", "rewards", "group_ids")})
        self.before.append(weights(stack))

    def on_update(self, update: int, stack: Any, steps: list[Any], rows: list[dict[str, Any]]) -> None:
        self.after.append(weights(stack))


def weights(stack: Any) -> dict[str, np.ndarray]:
    return {name: value.detach().double().numpy().copy() for name, value in stack.policy.state_dict().items()}


def advantages(rewards: np.ndarray, groups: np.ndarray) -> np.ndarray:
    out = np.zeros(len(rewards))
    for g in np.unique(groups):
        r = rewards[groups == g]
        if r.max() > r.min():
            out[groups == g] = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
    return out


def loss_and_gradient(theta: np.ndarray, batch: dict[str, np.ndarray]) -> tuple[float, np.ndarray]:
    vocab = theta.shape[-1]
    adv = advantages(batch["rewards"].astype(np.float64), batch["group_ids"])
    mask = batch["response_mask"].astype(np.float64)
    count = mask.sum()
    loss, grad = 0.0, np.zeros_like(theta)
    for i, (x, tokens) in enumerate(zip(batch["prompt_index"], batch["response_ids"], strict=True)):
        for t, y in enumerate(tokens):
            if mask[i, t] == 0:
                continue
            context = vocab if t == 0 else tokens[t - 1]
            row = theta[x, t, context]
            probs = np.exp(row - row.max())
            probs /= probs.sum()
            ratio = np.exp(np.log(probs[y]) - float(batch["behavior_logp"][i, t]))
            a = adv[i]
            loss -= min(ratio * a, np.clip(ratio, 1 - EPS_CLIP, 1 + EPS_CLIP) * a) / count
            clipped = (a > 0 and ratio > 1 + EPS_CLIP) or (a < 0 and ratio < 1 - EPS_CLIP)
            if not clipped:
                grad[x, t, context] -= a * ratio * (np.eye(vocab)[y] - probs) / count
    return loss, grad


def reference_run(theta: np.ndarray, batches: list[dict[str, np.ndarray]]) -> list[tuple[float, float, np.ndarray]]:
    """(loss, pre-clip gradient norm, θ after) of every update, with Adam's state carried along."""
    first, second = np.zeros_like(theta), np.zeros_like(theta)
    out = []
    for step, batch in enumerate(batches, start=1):
        loss, grad = loss_and_gradient(theta, batch)
        norm = float(np.sqrt((grad**2).sum()))
        grad = grad * min(1.0, GRAD_CLIP / (norm + 1e-6))
        first = BETAS[0] * first + (1 - BETAS[0]) * grad
        second = BETAS[1] * second + (1 - BETAS[1]) * grad**2
        m_hat, v_hat = first / (1 - BETAS[0] ** step), second / (1 - BETAS[1] ** step)
        theta = theta - LR * m_hat / (np.sqrt(v_hat) + ADAM_EPS)
        out.append((loss, norm, theta))
    return out


def read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_golden_tabular_grpo_equals_the_reference(tmp_path: Path) -> None:
    config = TrainConfig(**GOLDEN_RUNS[NAME])
    assert (config.optimizer, config.lr, config.grad_clip, config.advantage) == ("adam", LR, GRAD_CLIP, "auto")
    assert config.objective == "grpo"  # whose paper's advantage, "auto", is the std one
    recorder = Recorder()
    train(config, tmp_path / "run", hooks=[recorder])
    steps = reference_run(recorder.before[0]["logits"], recorder.batches)
    assert len(steps) == config.updates
    for rows in (read(GOLDEN_DIR / f"{NAME}.csv"), read(tmp_path / "run" / "metrics.csv")):  # the golden, the run
        assert len(rows) == config.updates
        for (loss, norm, _), row in zip(steps, rows, strict=True):
            assert abs(float(row["loss"]) - loss) <= 1e-6 + 1e-4 * abs(loss), (row["update"], row["loss"], loss)
            assert abs(float(row["grad_norm"]) - norm) <= 1e-6 + 1e-4 * norm, (row["update"], row["grad_norm"], norm)
    for (_, _, theta), after in zip(steps, recorder.after, strict=True):  # Adam: nearly blind to a gradient's scale
        np.testing.assert_allclose(after["logits"], theta, rtol=1e-4, atol=1e-5)
    # on-policy, ρ = 1 and Σ_group A = 0 with equal lengths make L ≈ 0: the gradient and the weights carry the check
    assert min(norm for _, norm, _ in steps) > 1e-3
    assert np.abs(steps[-1][2] - recorder.before[0]["logits"]).max() > 0.1


# ------------------------------------------------------------------ the GRU policy with M2PO, plain torch
GRU_NAME = "sequence_model_token_mdp_m2po_stale"
TAU, GRU_LR, LOGIT_SCALE = 0.04, 0.01, 0.4


def gru_log_probs(w: dict[str, torch.Tensor], batch: dict[str, np.ndarray], pad: int, bos: int) -> torch.Tensor:
    """log π(y_t) [B, T] of the prompt-conditioned GRU policy, from its weights ``w`` (float64, with grad):
    c = (1/√P) Σ_p C[p·V_in + x_p] over the real prompt tokens, p counted from the right; h_0 = tanh(W_0 c + b_0);
    the GRU (Cho et al. 2014, arXiv:1406.1078, PyTorch's gate order r, z, n) over the inputs [E y_{t−1}; Q_t; c],
    y_{−1} = BOS; logits = s·(W LayerNorm([h_t; c; Q_t; c ⊙ S_t]) + b), s = 0.4/√(feature dim)."""
    symbols = w["token.weight"].shape[0]
    mask = torch.as_tensor(batch["prompt_mask"], dtype=torch.float64)
    prompt = torch.where(mask > 0, torch.as_tensor(batch["prompt_ids"]).long(), pad)
    width = prompt.shape[1]
    codes = w["prompt_code.weight"][torch.arange(width - 1, -1, -1)[None, :] * symbols + prompt]
    code = (codes * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1.0).sqrt()
    responses = torch.as_tensor(batch["response_ids"]).long()
    batch_size, length = responses.shape
    inputs = torch.cat([torch.full((batch_size, 1), bos), responses[:, :-1]], dim=1)
    hidden = torch.tanh(code @ w["initial_state.weight"].T + w["initial_state.bias"])
    log_probs = []
    for t in range(length):
        x = torch.cat([w["token.weight"][inputs[:, t]], w["position.weight"][t].expand(batch_size, -1), code], -1)
        i_r, i_z, i_n = (x @ w["gru.weight_ih_l0"].T + w["gru.bias_ih_l0"]).chunk(3, -1)
        h_r, h_z, h_n = (hidden @ w["gru.weight_hh_l0"].T + w["gru.bias_hh_l0"]).chunk(3, -1)
        r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
        hidden = (1 - z) * torch.tanh(i_n + r * h_n) + z * hidden
        features = torch.cat([hidden, code, w["position.weight"][t].expand(batch_size, -1),
                              code * w["pair_position.weight"][t]], -1)
        normed = (features - features.mean(-1, keepdim=True)) / (features.var(-1, unbiased=False, keepdim=True)
                                                                  + 1e-5).sqrt()
        normed = normed * w["norm.weight"] + w["norm.bias"]
        logits = (normed @ w["head.weight"].T + w["head.bias"]) * LOGIT_SCALE / math.sqrt(features.shape[-1])
        log_probs.append(torch.log_softmax(logits, -1).gather(-1, responses[:, t:t + 1]).squeeze(-1))
    return torch.stack(log_probs, 1)


def m2po_loss(log_probs: torch.Tensor, batch: dict[str, np.ndarray]) -> torch.Tensor:
    """M2PO (Zheng et al. 2025, "Prosperity before Collapse", mask variant): Δ = log π − log π_b; among the tokens a
    PPO clip could act on (A > 0, Δ > 0 or A < 0, Δ < 0) mask those of largest Δ² until the mean Δ² of the rest is
    ≤ τ; L = −(1/N) Σ_{valid, not masked} A·exp(Δ)."""
    adv = torch.as_tensor(advantages(batch["rewards"].astype(np.float64), batch["group_ids"]))[:, None]
    mask = torch.as_tensor(batch["response_mask"], dtype=torch.float64)
    delta = log_probs - torch.as_tensor(batch["behavior_logp"], dtype=torch.float64)
    d = delta.detach().numpy()
    region = (mask.numpy() > 0) & (((adv.numpy() > 0) & (d > 0)) | ((adv.numpy() < 0) & (d < 0)))
    squares = np.sort(d[region] ** 2)
    means = np.cumsum(squares) / np.arange(1, squares.size + 1)
    kept_count = int((means <= TAU).sum())  # the prefix means grow: keep the k smallest with mean ≤ τ
    masked = region & (d**2 > squares[kept_count - 1]) if kept_count < squares.size else np.zeros_like(region)
    if kept_count == 0:
        masked = region
    keep = mask * torch.as_tensor(~masked, dtype=torch.float64)
    return -(keep * adv * torch.exp(delta)).sum() / mask.sum()


def clipped_adam_run(start: dict[str, np.ndarray], batches: list[dict[str, np.ndarray]], lr: float,
                     loss_of: Callable[[dict[str, torch.Tensor], dict[str, np.ndarray]], torch.Tensor],
                     ) -> list[tuple[float, float, dict[str, np.ndarray]]]:
    """(loss, pre-clip gradient norm, weights after) of every update in float64: the gradient clipped to global
    norm ``GRAD_CLIP`` (× min(1, c / (‖g‖ + 1e-6)), as ``clip_grad_norm_``), then one Adam step (Kingma & Ba 2015,
    arXiv:1412.6980: m ← β₁m + (1 − β₁)g, v ← β₂v + (1 − β₂)g², θ ← θ − lr·m̂ / (√v̂ + ε)), the moments carried
    along.  ``loss_of(weights, batch)`` is the policy's own reference loss."""
    w = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in start.items()}
    moments = {k: (torch.zeros_like(v), torch.zeros_like(v)) for k, v in w.items()}
    out = []
    for step, batch in enumerate(batches, start=1):
        loss = loss_of(w, batch)
        grads = torch.autograd.grad(loss, list(w.values()))
        norm = float(torch.sqrt(sum((g**2).sum() for g in grads)))
        scale = min(1.0, GRAD_CLIP / (norm + 1e-6))
        with torch.no_grad():
            for (name, value), grad in zip(w.items(), grads, strict=True):
                grad = grad * scale
                first, second = moments[name]
                first.mul_(BETAS[0]).add_((1 - BETAS[0]) * grad)
                second.mul_(BETAS[1]).add_((1 - BETAS[1]) * grad**2)
                value -= lr * (first / (1 - BETAS[0] ** step)) / ((second / (1 - BETAS[1] ** step)).sqrt()
                                                                   + ADAM_EPS)
        out.append((float(loss.detach()), norm, {k: v.detach().numpy().copy() for k, v in w.items()}))
    return out


def gru_reference(start: dict[str, np.ndarray], batches: list[dict[str, np.ndarray]], pad: int,
                  bos: int) -> list[tuple[float, float, dict[str, np.ndarray]]]:
    return clipped_adam_run(start, batches, GRU_LR, lambda w, batch: m2po_loss(gru_log_probs(w, batch, pad, bos), batch))


def test_golden_gru_m2po_stale_equals_the_reference(tmp_path: Path) -> None:
    config = TrainConfig(**GOLDEN_RUNS[GRU_NAME])
    assert (config.objective, config.objective_params, config.lr) == ("m2po", {"tau": TAU}, GRU_LR)
    recorder = Recorder()
    train(config, tmp_path / "run", hooks=[recorder])
    symbols = recorder.before[0]["token.weight"].shape[0]  # the policy's vocabulary, then PAD, then BOS
    steps = gru_reference(recorder.before[0], recorder.batches, pad=symbols - 2, bos=symbols - 1)
    for rows in (read(GOLDEN_DIR / f"{GRU_NAME}.csv"), read(tmp_path / "run" / "metrics.csv")):  # the golden, the run
        assert len(rows) == config.updates == len(steps)
        for (loss, norm, _), row in zip(steps, rows, strict=True):
            assert abs(float(row["loss"]) - loss) <= 1e-6 + 1e-4 * abs(loss), (row["update"], row["loss"], loss)
            assert abs(float(row["grad_norm"]) - norm) <= 1e-6 + 1e-4 * norm, (row["update"], row["grad_norm"], norm)
    for (_, _, reference), after in zip(steps, recorder.after, strict=True):
        for name, value in reference.items():
            np.testing.assert_allclose(after[name], value, rtol=1e-3, atol=1e-5, err_msg=name)
    assert min(norm for _, norm, _ in steps) > 1e-4
