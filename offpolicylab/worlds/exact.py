"""Exact quantities of enumerable worlds (V^T ≤ 10^5 responses per prompt), by batching every response through
``policy.score`` (log-probs alone: through ``policy.prefix_tree_log_probs``, one next-token distribution per
distinct prefix, Σ_{t<T} V^t instead of T·V^T positions, when the policy has it).

Responses are enumerated in *canonical* form: after the first EOS every position holds the EOS id (the padding the
policies write), so each distinct response appears once and Σ_y π(y|x) = 1.  With prompts x ~ uniform over the
world's evaluation prompts:

    J(π)        = E_x Σ_y π(y|x) R(x, y)                          (exact return)
    J*          = E_x max_y R(x, y)                               (optimal return)
    KL(π‖q)     = E_x Σ_y π(y|x) [log π(y|x) − log q(y|x)]
    χ²(π‖q)     = E_x [Σ_y π(y|x)² / q(y|x) − 1] = E_x E_{y~q}[w²] − 1,  w = π/q  (second moment of the IS ratio)

The exact expected gradient of an objective under a behaviour distribution q is

    g = Σ_x (1/N) Σ_y q(y|x) ∇_θ L({(x, y)}),   A(x, y) = R(x, y) − Σ_y' q(y'|x) R(x, y')  [÷ σ_q(x) if asked]

i.e. the expectation of the gradient of a *batch of one* response drawn from q, with the infinite-group
(G → ∞) GRPO baseline.  For token-wise objectives this equals the large-batch expected gradient; for objectives that
use batch statistics (P3O's ESS, M2PO's masking, RED-Drop's balancing) it is the B = 1 estimator's expectation.
It is computed with one ``policy.score`` call over all responses, one objective call per response and one backward.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch import Tensor

from offpolicylab.contracts import PrefixTreePolicy, Prompts, Rollout

MAX_ENUMERATION = 100_000


def enumerate_responses(vocab_size: int, length: int, eos_id: int | None = None) -> tuple[Tensor, Tensor]:
    """All canonical responses: ``ids`` [M, T] (long) and ``mask`` [M, T] (float, EOS included).

    M = V^T without EOS; with EOS, M = Σ_{k=0}^{T−1} (V−1)^k + (V−1)^T (EOS at position k+1, or no EOS).
    Raises ``ValueError`` when V^T > 10^5."""
    if vocab_size ** length > MAX_ENUMERATION:
        raise ValueError(f"cannot enumerate V^T = {vocab_size}^{length} > {MAX_ENUMERATION} responses; "
                         "use a smaller vocab_size or length")
    ids = torch.tensor(list(itertools.product(range(vocab_size), repeat=length)), dtype=torch.long)
    ids = ids.reshape(-1, length)
    if eos_id is None:
        return ids, torch.ones(ids.shape)
    is_eos = ids == eos_id
    before_eos = torch.cumsum(is_eos.long(), dim=1) - is_eos.long() == 0  # no EOS strictly before t
    mask = before_eos.float()
    canonical = torch.where(before_eos, torch.ones_like(is_eos), is_eos).all(dim=1)
    return ids[canonical], mask[canonical]


def kl_divergence(logp: Tensor, logq: Tensor) -> float:
    """KL(π‖q) = E_x Σ_y π(y|x)(log π(y|x) − log q(y|x)) from log-probability tables [N, M]."""
    return float((logp.exp() * (logp - logq)).sum(1).mean())


def _all_pairs(prompts: Prompts, ids: Tensor, mask: Tensor, temperature: float) -> Rollout:
    n, m = len(prompts), ids.shape[0]
    rows = torch.arange(n).repeat_interleave(m)
    return Rollout(
        prompt_ids=prompts.ids[rows], prompt_mask=prompts.mask[rows], response_ids=ids.repeat(n, 1),
        response_mask=mask.repeat(n, 1), behavior_logp=torch.zeros(n * m, ids.shape[1]), group_ids=rows,
        prompt_index=prompts.index[rows], temperature=temperature,
    )


def prefix_tree_nodes(ids: Tensor, vocab_size: int) -> Tensor:
    """Node ``[M, T]`` of y_{<t} in a policy's ``prefix_tree_log_probs`` table, for every enumerated response y:

        node_t(y) = Σ_{s<t} V^s + Σ_{s<t} y_s V^(t−1−s)      (depth offset + base-V code of the prefix)"""
    nodes = torch.zeros_like(ids)
    code, offset = torch.zeros(ids.shape[0], dtype=ids.dtype), 0
    for t in range(ids.shape[1]):
        nodes[:, t] = offset + code
        code, offset = code * vocab_size + ids[:, t], offset + vocab_size ** t
    return nodes


def sequence_logprobs(policy: Any, prompts: Prompts, ids: Tensor, mask: Tensor, temperature: float = 1.0,
                      vocab_size: int | None = None) -> Tensor:
    """log π(y|x) [N, M] (float64) for every prompt × enumerated response (no grad): Σ_t mask_t · logp_t.

    With ``vocab_size`` given and a policy that has ``prefix_tree_log_probs`` (the autoregressive toy policies),
    π(· | x, y_{<t}) is computed once per distinct prefix and logp_t is read off at :func:`prefix_tree_nodes`;
    otherwise ``policy.score`` runs on all N·M pairs."""
    n, m = len(prompts), ids.shape[0]
    with torch.no_grad():
        if vocab_size is None or not isinstance(policy, PrefixTreePolicy):
            token_logp = policy.score(_all_pairs(prompts, ids, mask, temperature))[0].reshape(n, m, -1)
        else:
            table = policy.prefix_tree_log_probs(prompts, temperature)  # [N, K, V]
            flat = (prefix_tree_nodes(ids, vocab_size) * table.shape[-1] + ids).reshape(-1)  # entry (node, y_t)
            token_logp = table.reshape(n, -1).index_select(1, flat).reshape(n, *ids.shape)  # [N, M, T]
    return (token_logp * mask).sum(-1).double()


def reward_table(world: Any, prompts: Prompts, ids: Tensor, mask: Tensor) -> Tensor:
    """R(x, y) [N, M] (expected reward for stochastic worlds, via ``world.expected_reward`` when it exists)."""
    n, m = len(prompts), ids.shape[0]
    fn = getattr(world, "expected_reward", None) or world.reward
    rewards = fn(prompts.index.repeat_interleave(m), ids.repeat(n, 1), mask.repeat(n, 1))
    return rewards.reshape(n, m).double()


class Enumeration:
    """Every (prompt, response) pair of a world's evaluation prompts, with rewards, built once and reused."""

    def __init__(self, world: Any, prompts: Prompts | None = None) -> None:
        self.world = world
        self.prompts = world.eval_prompts() if prompts is None else prompts
        self.ids, self.mask = enumerate_responses(world.vocab_size, world.max_response_len, world.eos_id)
        self.rewards = reward_table(world, self.prompts, self.ids, self.mask)

    def logprobs(self, policy: Any, temperature: float = 1.0) -> Tensor:
        """log π(y|x) [N, M] (float64, no grad) of every evaluation prompt × canonical response."""
        return sequence_logprobs(policy, self.prompts, self.ids, self.mask, temperature, self.world.vocab_size)

    def expected_return(self, policy: Any, temperature: float = 1.0) -> float:
        """J(π) = E_x Σ_y π(y|x) R(x, y)."""
        return self.return_of(self.logprobs(policy, temperature))

    def return_of(self, logp: Tensor) -> float:
        """J(π) = E_x Σ_y π(y|x) R(x, y) from log π(y|x) [N, M] (as :meth:`logprobs` gives it)."""
        return float((logp.exp() * self.rewards).sum(1).mean())

    def optimal_return(self) -> float:
        """J* = E_x max_y R(x, y)."""
        return float(self.rewards.max(1).values.mean())

    def kl(self, policy: Any, other: Any, temperature: float = 1.0) -> float:
        """KL(π‖q) = E_x Σ_y π(y|x)(log π − log q)."""
        return kl_divergence(self.logprobs(policy, temperature), self.logprobs(other, temperature))

    def chi2(self, policy: Any, other: Any, temperature: float = 1.0) -> float:
        """χ²(π‖q) = E_x [Σ_y π(y|x)² / q(y|x) − 1]."""
        logp, logq = self.logprobs(policy, temperature), self.logprobs(other, temperature)
        return float((torch.exp(2 * logp - logq).sum(1) - 1.0).mean())

    def expected_gradient(self, policy: Any, objective: Any, behavior: Any, *, normalize_std: bool = False,
                          temperature: float = 1.0) -> Tensor:
        """g = E_x Σ_y q(y|x) ∇_θ L({(x, y)}) as one flat vector over ``policy.trainable_parameters()``.

        ``behavior`` is a policy (scored here) or, for one-step worlds, a probability tensor broadcastable to
        [N, M] (e.g. the bandit's π_b of shape [K]).  See the module docstring for the advantage used."""
        n, m = self.rewards.shape
        if isinstance(behavior, Tensor):
            q = behavior.double().expand(n, m)
            if self.ids.shape[1] != 1:
                raise ValueError("a probability-vector behaviour needs a one-step world; pass a policy instead")
            token_blogp = q.log().reshape(n * m, 1)
        else:
            pairs = _all_pairs(self.prompts, self.ids, self.mask, temperature)
            with torch.no_grad():
                token_blogp = behavior.score(pairs)[0].double()
            q = (token_blogp * pairs.response_mask).sum(-1).reshape(n, m).exp()
        if not torch.allclose(q.sum(1), torch.ones(n, dtype=q.dtype), atol=1e-5):
            raise ValueError(f"behaviour probabilities must sum to 1 per prompt, got {q.sum(1).tolist()}")
        baseline = (q * self.rewards).sum(1, keepdim=True)
        advantages = self.rewards - baseline
        if normalize_std:
            advantages = advantages / ((q * advantages ** 2).sum(1, keepdim=True).sqrt() + 1e-6)
        return _weighted_single_gradients(policy, objective, self.prompts, self.ids, self.mask, token_blogp,
                                          self.rewards, advantages, q, temperature)


def _weighted_single_gradients(policy: Any, objective: Any, prompts: Prompts, ids: Tensor, mask: Tensor,
                               token_blogp: Tensor, rewards: Tensor, advantages: Tensor, weights: Tensor,
                               temperature: float) -> Tensor:
    """∇ Σ_i w_i L(batch of row i) / N over the N·M enumerated rows (rows with w_i = 0 skipped)."""
    from offpolicylab.objectives import TokenBatch

    n, m = weights.shape
    pairs = _all_pairs(prompts, ids, mask, temperature)
    logp, entropy = policy.score(pairs)
    dtype = logp.dtype
    blogp = token_blogp.to(dtype)
    adv = advantages.reshape(-1).to(dtype)
    rewards = rewards.reshape(-1).to(dtype)
    flat_w = weights.reshape(-1) / n
    total = logp.new_zeros(())
    for row in torch.nonzero(flat_w > 0).flatten().tolist():
        sl = slice(row, row + 1)
        batch = TokenBatch(logp=logp[sl], behavior_logp=blogp[sl], advantages=adv[sl], mask=pairs.response_mask[sl],
                           rewards=rewards[sl], group_ids=torch.zeros(1, dtype=torch.long), entropy=entropy[sl])
        total = total + flat_w[row].to(dtype) * objective(batch).loss
    params = list(policy.trainable_parameters())
    grads = torch.autograd.grad(total, params, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params, strict=True)])


class EnumerableWorld:
    """Exact quantities of a world whose responses can all be listed (V^T ≤ MAX_ENUMERATION), through one lazily
    built :class:`Enumeration`.  Mixed into the bandits and the token MDPs."""

    _enumeration: Enumeration | None = None

    @property
    def enumeration(self) -> Enumeration:
        if self._enumeration is None:
            self._enumeration = Enumeration(self)
        return self._enumeration

    def exact_return(self, policy: Any, temperature: float = 1.0) -> float:
        """J(π) = E_x Σ_y π(y|x) R(x, y) over all prompts (a bandit: Σ_a π(a) r_a)."""
        return self.enumeration.expected_return(policy, temperature)

    def exact_kl(self, policy: Any, other: Any, temperature: float = 1.0) -> float:
        """KL(π‖q) = E_x Σ_y π(y|x) log(π(y|x)/q(y|x))."""
        return self.enumeration.kl(policy, other, temperature)

    def exact_chi2(self, policy: Any, other: Any, temperature: float = 1.0) -> float:
        """χ²(π‖q) = E_x Σ_y π(y|x)²/q(y|x) − 1."""
        return self.enumeration.chi2(policy, other, temperature)
