"""The golden run ``tabular_token_mdp_grpo`` re-derived by an independent reference: every update of the whole run
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
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from offpolicylab.config import TrainConfig
from offpolicylab.trainer import UpdateHook, train
from tests.trainer.golden_runs import GOLDEN_DIR, GOLDEN_RUNS

NAME = "tabular_token_mdp_grpo"
EPS_CLIP, GRAD_CLIP, LR, BETAS, ADAM_EPS = 0.2, 1.0, 0.05, (0.9, 0.999), 1e-8


class Recorder(UpdateHook):
    """The rollout each update consumes and the weights before and after it (read only)."""

    def __init__(self) -> None:
        self.batches: list[dict[str, np.ndarray]] = []
        self.before: list[np.ndarray] = []
        self.after: list[np.ndarray] = []

    def on_batch(self, update: int, stack: Any, rollouts: list[Any]) -> None:
        (rollout,) = rollouts
        self.batches.append({name: getattr(rollout, name).detach().numpy().copy() for name in
                             ("prompt_index", "response_ids", "response_mask", "behavior_logp", "rewards",
                              "group_ids")})
        self.before.append(stack.policy.state_dict()["logits"].double().numpy())

    def on_update(self, update: int, stack: Any, steps: list[Any], rows: list[dict[str, Any]]) -> None:
        self.after.append(stack.policy.state_dict()["logits"].double().numpy())


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
    steps = reference_run(recorder.before[0], recorder.batches)
    assert len(steps) == config.updates
    for rows in (read(GOLDEN_DIR / f"{NAME}.csv"), read(tmp_path / "run" / "metrics.csv")):  # the golden, the run
        assert len(rows) == config.updates
        for (loss, norm, _), row in zip(steps, rows, strict=True):
            assert abs(float(row["loss"]) - loss) <= 1e-6 + 1e-4 * abs(loss), (row["update"], row["loss"], loss)
            assert abs(float(row["grad_norm"]) - norm) <= 1e-6 + 1e-4 * norm, (row["update"], row["grad_norm"], norm)
    for (_, _, theta), after in zip(steps, recorder.after, strict=True):  # Adam: nearly blind to a gradient's scale
        np.testing.assert_allclose(after, theta, rtol=1e-4, atol=1e-5)
    # on-policy, ρ = 1 and Σ_group A = 0 with equal lengths make L ≈ 0: the gradient and the weights carry the check
    assert min(norm for _, norm, _ in steps) > 1e-3
    assert np.abs(steps[-1][2] - recorder.before[0]).max() > 0.1
