"""K-arm softmax bandits as a :class:`~offpolicylab.contracts.World`: one dummy prompt token, a response of one token (the arm),
no EOS, and the 3-arm pitfall of REC (Yao et al. 2025, arXiv:2509.24203).

    reward(a) = r_a                    (fixed rewards)
    reward(a) ~ Bernoulli(r_a)         (``bernoulli=True``; r_a ∈ [0, 1] is then the success probability)
    J(π) = Σ_a π(a) r_a,   J* = max_a r_a

The 3-arm pitfall (REC, "Rethinking the off-policy ..."): r = [0, 0.8, 1] and fixed behaviour data from
π_b = [0.3, 0.6, 0.1].  REINFORCE without importance weights on that data ascends Σ_a π_b(a)(r_a − r̄)∇log π_θ(a),
whose fixed point puts its mass on the 0.8 arm (the most frequent positive-advantage arm), not the optimum.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from offpolicylab.contracts import Prompts
from offpolicylab.worlds.exact import EnumerableWorld

PITFALL_REWARDS = (0.0, 0.8, 1.0)
PITFALL_BEHAVIOR = (0.3, 0.6, 0.1)


class SoftmaxBandit(EnumerableWorld):
    """A K-arm bandit world.  ``behavior_probs`` (optional, [K]) is the world's suggested initial / behaviour
    policy: :func:`offpolicylab.policies.make_policy` ("tabular", init="world") starts from it."""

    num_prompts = 1
    prompt_vocab_size = 1
    max_response_len = 1
    eos_id: int | None = None

    def __init__(self, rewards: Sequence[float], bernoulli: bool = False,
                 behavior_probs: Sequence[float] | None = None, name: str = "bandit") -> None:
        r = torch.as_tensor(rewards, dtype=torch.float32)
        if r.dim() != 1 or r.numel() < 2 or not torch.isfinite(r).all():
            raise ValueError(f"rewards must be a list of K >= 2 finite numbers, got {list(rewards)}")
        if bernoulli and not bool(((r >= 0) & (r <= 1)).all()):
            raise ValueError(f"Bernoulli rewards are success probabilities and must lie in [0, 1], got {r.tolist()}")
        self.rewards = r
        self.bernoulli = bool(bernoulli)
        self.vocab_size = int(r.numel())
        self.name = name
        self.behavior_probs: Tensor | None = None
        if behavior_probs is not None:
            p = torch.as_tensor(behavior_probs, dtype=torch.float32)
            if p.shape != r.shape or not bool((p > 0).all()) or abs(float(p.sum()) - 1.0) > 1e-6:
                raise ValueError(f"behavior_probs must be {self.vocab_size} positive numbers summing to 1, "
                                 f"got {list(behavior_probs)}")
            self.behavior_probs = p

    # ------------------------------------------------------------------------------------------ World
    def sample_prompts(self, n: int, generator: torch.Generator | None = None) -> Prompts:
        """``n`` copies of the single dummy prompt (token 0, index 0)."""
        if n < 1:
            raise ValueError(f"number of prompts must be >= 1, got {n}")
        return Prompts(ids=torch.zeros(n, 1, dtype=torch.long), mask=torch.ones(n, 1),
                       index=torch.zeros(n, dtype=torch.long))

    def eval_prompts(self) -> Prompts:
        return self.sample_prompts(1)

    def expected_reward(self, prompt_index: Tensor, response_ids: Tensor, response_mask: Tensor) -> Tensor:
        """E[reward | arm] = r_a, [B]."""
        _check_arms(response_ids, self.vocab_size)
        return self.rewards[response_ids[:, 0]]

    def reward(self, prompt_index: Tensor, response_ids: Tensor, response_mask: Tensor,
               generator: torch.Generator | None = None) -> Tensor:
        """r_a, or a Bernoulli(r_a) draw from ``generator`` (torch's default generator when None), [B]."""
        mean = self.expected_reward(prompt_index, response_ids, response_mask)
        if not self.bernoulli:
            return mean
        return torch.bernoulli(mean, generator=generator)

    # ------------------------------------------------------------------------------------------ exact
    def initial_logits(self) -> Tensor | None:
        """log π_b when the world has a behaviour policy (the pitfall), else None (uniform start)."""
        return None if self.behavior_probs is None else self.behavior_probs.log()

    def optimal_return(self) -> float:
        """J* = max_a r_a."""
        return float(self.rewards.max())

    def exact_gradient(self, policy: Any, objective: Any, behavior_probs: Tensor | Sequence[float] | None = None,
                       *, normalize_std: bool = False, temperature: float = 1.0) -> Tensor:
        """E_{a~π_b}[∇_θ L({a})] = Σ_a π_b(a) ∇_θ L(batch of the single action a), with A_a = r_a − r̄,
        r̄ = Σ_a π_b(a) r_a (÷ σ_b when ``normalize_std``) and behavior_logp = log π_b(a).  Flat over
        ``policy.trainable_parameters()`` ([K] for a tabular bandit).  ``behavior_probs`` defaults to the
        world's π_b.  Bernoulli arms use r_a = E[reward]."""
        probs = self.behavior_probs if behavior_probs is None else torch.as_tensor(behavior_probs)
        if probs is None:
            raise ValueError("this bandit has no behavior_probs; pass behavior_probs=[...] (K probabilities)")
        return self.enumeration.expected_gradient(policy, objective, probs.reshape(1, -1),
                                                  normalize_std=normalize_std, temperature=temperature)


def _check_arms(response_ids: Tensor, k: int) -> None:
    if response_ids.dim() != 2 or response_ids.shape[1] < 1:
        raise ValueError(f"response_ids must be [B, 1] arm ids, got shape {tuple(response_ids.shape)}")
    if response_ids.numel() and (int(response_ids[:, 0].min()) < 0 or int(response_ids[:, 0].max()) >= k):
        raise ValueError(f"arm ids must lie in [0, {k - 1}]")


def three_arm_pitfall() -> SoftmaxBandit:
    """r = [0, 0.8, 1], π_b = [0.3, 0.6, 0.1] (REC, Yao et al. 2025): fixed behaviour data, no IS → the 0.8 arm."""
    return SoftmaxBandit(PITFALL_REWARDS, behavior_probs=PITFALL_BEHAVIOR, name="three_arm_pitfall")


def random_bandit(num_arms: int = 5, bernoulli: bool = False, seed: int = 0) -> SoftmaxBandit:
    """A bandit with rewards r_a ~ U[0, 1] drawn from ``seed``."""
    if num_arms < 2:
        raise ValueError(f"num_arms must be >= 2, got {num_arms}")
    g = torch.Generator().manual_seed(seed)
    return SoftmaxBandit(torch.rand(num_arms, generator=g).tolist(), bernoulli=bernoulli)
