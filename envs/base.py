"""The task contract every world implements (DESIGN §2.3): prompts → responses → verifiable rewards."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from offpolicylab.policies.base import Prompts


@runtime_checkable
class Task(Protocol):
    """A batched world.

    - ``vocab_size``, ``max_response_len`` (T), ``eos_id`` (or None when responses have a fixed length).
    - ``sample_prompts(n, generator)`` → :class:`Prompts` for training; ``eval_prompts()`` → a fixed set for
      evaluation.
    - ``reward(prompt_index, response_ids, response_mask)`` → [B] float rewards (verifiable, deterministic given the
      ids, except for Bernoulli bandits which take ``generator``).
    - Toy worlds small enough to enumerate also provide ``exact_return(policy)`` and ``optimal_return()``.
    """

    vocab_size: int
    max_response_len: int
    eos_id: int | None

    def sample_prompts(self, n: int, generator: torch.Generator) -> Prompts: ...

    def eval_prompts(self) -> Prompts: ...

    def reward(
        self, prompt_index: Tensor, response_ids: Tensor, response_mask: Tensor,
        generator: torch.Generator | None = None,
    ) -> Tensor: ...


class FixedPrompts:
    """Worlds with a fixed table ``prompt_tokens`` [N_all, P] (no padding) whose first ``num_prompts`` rows are the
    training prompts: uniform draws with replacement, and :class:`Prompts` for any list of rows."""

    prompt_tokens: Tensor
    num_prompts: int

    def sample_prompts(self, n: int, generator: torch.Generator | None = None) -> Prompts:
        """``n`` training prompts drawn uniformly with replacement."""
        if n < 1:
            raise ValueError(f"number of prompts must be >= 1, got {n}")
        return self._prompts(torch.randint(self.num_prompts, (n,), generator=generator))

    def _prompts(self, index: Tensor) -> Prompts:
        ids = self.prompt_tokens[index]
        return Prompts(ids=ids, mask=torch.ones(ids.shape), index=index)
