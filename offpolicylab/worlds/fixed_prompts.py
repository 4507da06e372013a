"""A world mixin for fixed prompt tables."""

from __future__ import annotations

import torch
from torch import Tensor

from offpolicylab.contracts import Prompts


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
