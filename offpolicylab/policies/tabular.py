"""Tabular softmax policy: one logits vector per (prompt, position, previous token).

    π_θ(y_t = v | x, y_{<t}) = softmax(θ[x, t, c_t])_v,   c_t = y_{t−1} (c_0 = BOS = V)   (context="prev_token")
                                                          c_t = 0                        (context="none")

A K-arm bandit is the case ``num_prompts = 1, response_len = 1, vocab_size = K, context = "none"``: the table is
``[1, 1, 1, K]`` and :meth:`TabularSoftmaxPolicy.bandit_logits` views it as ``[K]``.

Why (prompt, position, previous token) rather than the full prefix: the table stays ``P·T·(V+1)·V`` instead of
``P·V^T``, and every deterministic response (hence the optimum of any toy world here) is representable; a
prev-token context also lets the policy learn EOS-then-stop and "filler follows token" structure.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from offpolicylab.policies.autoregressive import AutoregressivePolicy
from offpolicylab.policies.precision import sampler_weights

CONTEXTS = ("prev_token", "none")


class TabularSoftmaxPolicy(AutoregressivePolicy):
    """Softmax over a logits table ``θ`` of shape ``[num_prompts, response_len, C, vocab_size]``, C = V + 1
    (``context="prev_token"``) or 1 (``context="none"``).  Prompts are looked up by ``prompt_index``."""

    def __init__(self, num_prompts: int, vocab_size: int, response_len: int = 1, eos_id: int | None = None,
                 context: str = "prev_token", init_logits: Tensor | None = None, sampler_noise_std: float = 0.0,
                 dtype: torch.dtype = torch.float32, sampler_precision: str = "fp32") -> None:
        self._init_common(vocab_size, response_len, eos_id, sampler_noise_std, sampler_precision)
        if context not in CONTEXTS:
            raise ValueError(f"context must be one of {', '.join(CONTEXTS)}, got {context!r}")
        if num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
        self.num_prompts = int(num_prompts)
        self.context = context
        contexts = self.vocab_size + 1 if context == "prev_token" else 1
        shape = (self.num_prompts, self.response_len, contexts, self.vocab_size)
        if init_logits is None:
            table = torch.zeros(shape, dtype=dtype)
        else:
            init_logits = torch.as_tensor(init_logits, dtype=dtype)
            try:
                table = init_logits.expand(shape).clone()
            except RuntimeError:
                raise ValueError(f"init_logits of shape {tuple(init_logits.shape)} does not broadcast to the table "
                                 f"shape {list(shape)} [num_prompts, response_len, contexts, vocab_size]") from None
            if not torch.isfinite(table).all():
                raise ValueError("init_logits must be finite")
        self.logits = torch.nn.Parameter(table)

    @classmethod
    def from_probs(cls, probs: Sequence[float] | Tensor, **kwargs: Any) -> TabularSoftmaxPolicy:
        """A bandit policy with π = ``probs`` ([K], positive, summing to 1): θ = log π.  Extra ``kwargs`` go to the
        constructor (e.g. ``sampler_noise_std``)."""
        p = torch.as_tensor(probs, dtype=torch.float64)
        if p.dim() != 1 or p.numel() < 2:
            raise ValueError(f"probs must be a 1-D vector of K >= 2 probabilities, got shape {tuple(p.shape)}")
        if not (torch.all(p > 0) and torch.isclose(p.sum(), torch.tensor(1.0, dtype=torch.float64), atol=1e-6)):
            raise ValueError(f"probs must be positive and sum to 1, got {p.tolist()}")
        kwargs.setdefault("context", "none")
        return cls(num_prompts=1, vocab_size=p.numel(), response_len=1, init_logits=p.log().float(), **kwargs)

    # ------------------------------------------------------------------------------------------ protocol
    def response_logits(self, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor,
                        response_ids: Tensor) -> Tensor:
        """θ[x, t, c_t] for every row and position: one gather, no Python loop over rows."""
        return self.logits[self._cells(prompt_index, response_ids)]

    def next_logits(self, state: Any, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor,
                    response_ids: Tensor, t: int) -> Tensor:
        """θ[x, t, c_t] of position ``t`` alone (the column ``t`` of :meth:`response_logits`, one small gather)."""
        return self.logits[self._cells_at(prompt_index, response_ids, t)]

    def sampler_engine(self) -> contextlib.AbstractContextManager[None]:
        """The sampling engine's table: θ stored in ``sampler_precision`` (FP8: one scale per logits vector θ[x, t, c])."""
        return sampler_weights(None, self.sampler_precision, tables=[self.logits])

    def prefix_tree_logits(self, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor) -> Tensor:
        """Logits [N, K, V] after every response prefix (see ``AutoregressivePolicy.prefix_tree_log_probs``): node
        k of depth t reads θ[x, t, c], c the prefix's last token (BOS at t = 0; 0 for ``context="none"``), so the
        tree is one gather of K table rows per prompt — the same values as the teacher-forced default, which reads
        T rows for each of the V^(T−1) leaves."""
        positions, contexts = self._tree_cells()
        return self.logits[prompt_index[:, None], positions, contexts]

    def _tree_cells(self) -> tuple[Tensor, Tensor]:
        """(position t, context c) [K] of every prefix-tree node, depth by depth in base-V order: the last token of
        the prefix with code k at depth t ≥ 1 is k mod V."""
        vocab, depths = self.vocab_size, range(self.response_len)
        positions = torch.cat([torch.full((vocab ** t,), t) for t in depths])
        if self.context == "none":
            return positions, torch.zeros_like(positions)
        contexts = [torch.full((1,), vocab)] + [torch.arange(vocab ** t) % vocab for t in depths[1:]]
        return positions, torch.cat(contexts)

    def _cells_at(self, prompt_index: Tensor, response_ids: Tensor, t: int) -> tuple[Tensor, int, Tensor]:
        """The (prompt, position, context) index [B] of the table row read at response position ``t``."""
        if self.context == "prev_token":
            context = (torch.full_like(prompt_index, self.vocab_size) if t == 0 else response_ids[:, t - 1])
        else:
            context = torch.zeros_like(prompt_index)
        return prompt_index, t, context

    def _cells(self, prompt_index: Tensor, response_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The (prompt, position, context) index [B, T] of the table row read at every response position."""
        batch, width = response_ids.shape
        if width != self.response_len:
            raise ValueError(f"response_ids has {width} positions, the policy has response_len {self.response_len}")
        if self.context == "prev_token":
            bos = torch.full((batch, 1), self.vocab_size, dtype=torch.long)
            context = torch.cat([bos, response_ids[:, :-1]], dim=1)
        else:
            context = torch.zeros_like(response_ids)
        positions = torch.arange(width)[None, :].expand(batch, width)
        return prompt_index[:, None].expand(batch, width), positions, context

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [self.logits]

    def state_dict(self) -> dict[str, Any]:
        return {"logits": self.logits.detach().clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"logits"} or tuple(state["logits"].shape) != tuple(self.logits.shape):
            raise ValueError(f"tabular state must be {{'logits': tensor of shape {list(self.logits.shape)}}}, "
                             f"got keys {sorted(state)}")
        with torch.no_grad():
            self.logits.copy_(state["logits"])

    # ------------------------------------------------------------------------------------------ helpers
    def bandit_logits(self) -> Tensor:
        """The ``[K]`` logits of a bandit policy (a view that keeps grad)."""
        if self.logits.shape[:3] != (1, 1, 1):
            raise ValueError(f"bandit_logits needs a [1, 1, 1, K] table, got {list(self.logits.shape)}")
        return self.logits[0, 0, 0]

    def bandit_probs(self, temperature: float = 1.0) -> Tensor:
        """π = softmax(θ / τ) of a bandit policy, detached."""
        return torch.softmax(self.bandit_logits().detach() / temperature, -1)


class StackedTabularPolicy(TabularSoftmaxPolicy):
    """S tabular policies of one shape as one table θ [S, P, T, C, V] (batched seeds).

    A batch holds S equal consecutive row blocks and block s is answered by table s:

        π(y_t = v | x, y_<t; row in block s) = softmax(θ[s, x, t, c_t])_v

    so one gather scores every member and one optimizer step updates every member; no table entry is shared, so
    the gradient of Σ_s loss_s restricted to θ[s] is the gradient of loss_s.  Each member's ``logits`` becomes a
    view of its slice (no copy): what the optimizer does to the stack is what the member sees when it is evaluated
    or checkpointed on its own."""

    def __init__(self, members: Sequence[TabularSoftmaxPolicy]) -> None:
        first = members[0]
        for other in members[1:]:
            if (other.logits.shape, other.context, other.eos_id, other.sampler_noise_std, other.sampler_precision) != (
                    first.logits.shape, first.context, first.eos_id, first.sampler_noise_std, first.sampler_precision):
                raise ValueError("stacked tabular policies must share table shape, context, eos_id, sampler noise and "
                                 "sampler precision")
        self._init_common(first.vocab_size, first.response_len, first.eos_id, first.sampler_noise_std,
                          first.sampler_precision)
        self.num_prompts, self.context, self.size = first.num_prompts, first.context, len(members)
        self.logits = torch.nn.Parameter(torch.stack([member.logits.detach() for member in members]))
        for index, member in enumerate(members):
            member.logits = self.logits.detach()[index]
        self._members: dict[int, Tensor] = {}  # batch size -> the member of every row (read only)

    def members_of(self, batch: int) -> Tensor:
        """[batch] the member s of every row (S equal consecutive blocks), built once per batch size."""
        if batch not in self._members:
            self._members[batch] = torch.arange(self.size).repeat_interleave(batch // self.size)
        return self._members[batch]

    def response_logits(self, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor,
                        response_ids: Tensor) -> Tensor:
        """θ[s, x, t, c_t] for every row (s its block) and position: one gather over all members."""
        batch, width = response_ids.shape
        member = self.members_of(batch)[:, None].expand(batch, width)
        return self.logits[(member, *self._cells(prompt_index, response_ids))]

    def next_logits(self, state: Any, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor,
                    response_ids: Tensor, t: int) -> Tensor:
        """θ[s, x, t, c_t] of position ``t`` alone, every member at once."""
        member = self.members_of(response_ids.shape[0])
        return self.logits[(member, *self._cells_at(prompt_index, response_ids, t))]

    def prefix_tree_logits(self, prompt_ids: Tensor, prompt_mask: Tensor, prompt_index: Tensor) -> Tensor:
        """θ[s, x, t, c] of every prefix-tree node (see :meth:`TabularSoftmaxPolicy.prefix_tree_logits`), the rows
        of block s from table s."""
        positions, contexts = self._tree_cells()
        return self.logits[self.members_of(prompt_index.shape[0])[:, None], prompt_index[:, None], positions, contexts]

    def state_dict(self) -> dict[str, Any]:
        raise TypeError("a stacked policy has no state of its own: checkpoint its members")
