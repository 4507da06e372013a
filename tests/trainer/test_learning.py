"""Learning tests (Stable-Baselines3 style): on-policy ``grpo`` through :func:`offpolicylab.trainer.train`
reaches ≥ 90 % of the exact optimal return J* on every token-MDP family within a fixed budget.

Budget (each family, each policy: the tabular softmax with prev-token context and ``init="world"``, and the small
torch ``sequence_model`` with its default size): Adam lr 0.1, grad-norm clip 1,
``BUDGET_UPDATES`` = 80 on-policy updates of 4 prompts × G = 8 responses (2,560 sampled responses in all), seed 0,
world V = 4, T = 5, 4 prompts, partial credit.

For the tabular policy the final return is checked twice: by the trainer's own exact evaluation (``summary.json``) and by an independent
NumPy enumeration of all V^T responses from the final checkpoint's logits table, with the reward re-derived from the
world's hidden targets:

    J(π) = (1/N) Σ_x Σ_y Π_t softmax(θ[x, t, y_{t−1}])_{y_t} · R(x, y),
    R = (1/T) Σ_t 1[y_t = y*_t]                                  (target, arithmetic: y* = spelling of a + b)
    R = [(1/|F|) Σ_{t∈F} 1[y_t = y*_t]] · (1/|F^c|) Σ_{t∉F} 1[y_t = y*_t]   (forking)

J* = 1 in every family (the target response is always reachable).

Both group-relative advantage estimators are tested: ``mean`` (r − r̄, the estimator the budget was calibrated on)
and ``std`` ((r − r̄)/σ, GRPO's own and the ``grpo`` default).  One case is a measured negative result, kept as a
strict xfail: the sequence model on the forking family with ``std`` plateaus at J = 0.875 from update 30 to 119
(seed 0; ``mean`` reaches 0.998 by update 40 with the same budget).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from offpolicylab.config import TrainConfig
from offpolicylab.run_dir import RunDir
from offpolicylab.trainer import train
from offpolicylab.worlds.token_mdp import TokenMDP
from tests.small_runs import read_rows

BUDGET_UPDATES = 80
WORLD = {"vocab_size": 4, "length": 5, "num_prompts": 4}
SHARE_OF_OPTIMUM = 0.9


def learning_config(family: str, policy: str, advantage: str) -> TrainConfig:
    """The stated budget: on-policy grpo (ε = 0.2), BUDGET_UPDATES updates of 4 prompts × 8 responses."""
    return TrainConfig(world="token_mdp", world_params={"family": family, **WORLD}, objective="grpo",
                       advantage=advantage,
                       policy=policy, schedule="on_policy", updates=BUDGET_UPDATES, prompts_per_update=4,
                       group_size=8, lr=0.1, seed=0, eval_every=BUDGET_UPDATES, sample_every=0,
                       checkpoint_every=BUDGET_UPDATES)


def numpy_exact_return(logits: np.ndarray, world: TokenMDP) -> float:
    """J(π) by enumerating every response y ∈ V^T (module docstring); ``logits`` is the tabular table
    [N, T, V + 1, V] (context V = BOS)."""
    n, length, _, vocab = logits.shape
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    targets = world.targets.numpy()
    forks = world.fork_mask.numpy()
    total = 0.0
    for prompt in range(n):
        for response in itertools.product(range(vocab), repeat=length):
            contexts = (vocab, *response[:-1])
            log_p = sum(log_probs[prompt, t, contexts[t], response[t]] for t in range(length))
            correct = np.asarray(response) == targets[prompt]
            if world.family == "forking":
                reward = correct[forks].mean() * correct[~forks].mean()
            else:
                reward = correct.mean()
            total += np.exp(log_p) * reward
    return total / n


STD_PLATEAU = pytest.mark.xfail(strict=True, reason="measured: sequence_model on forking with std-normalised "
                                                    "advantages plateaus at J = 0.875 (update 30 to 119, seed 0)")


@pytest.mark.parametrize("family", ["target", "arithmetic", "forking"])
@pytest.mark.parametrize("policy", ["tabular", "sequence_model"])
@pytest.mark.parametrize("advantage", ["mean", "std"])
def test_on_policy_grpo_reaches_90_percent_of_optimum(advantage: str, policy: str, family: str, tmp_path: Path,
                                                      request: pytest.FixtureRequest) -> None:
    if (advantage, policy, family) == ("std", "sequence_model", "forking"):
        request.applymarker(STD_PLATEAU)
    config = learning_config(family, policy, advantage)
    summary = train(config, tmp_path)
    assert summary["status"] == "completed"
    assert summary["optimal_return"] == pytest.approx(1.0)
    initial = float(read_rows(tmp_path)[0]["exact_return"])  # evaluated after the first update
    assert initial < SHARE_OF_OPTIMUM * summary["optimal_return"] - 0.3, "the world must start far from the optimum"
    assert summary["final_exact_return"] >= SHARE_OF_OPTIMUM * summary["optimal_return"]
    if policy != "tabular":
        return

    world = TokenMDP(family=family, **WORLD)
    logits = RunDir(tmp_path).load_checkpoint()["policy"]["logits"].to(torch.float64).numpy()
    independent = numpy_exact_return(logits, world)
    assert summary["final_exact_return"] == pytest.approx(independent, abs=1e-5)
    assert independent >= SHARE_OF_OPTIMUM * summary["optimal_return"]
