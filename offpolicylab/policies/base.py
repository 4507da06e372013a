"""The policy contract every backend implements (DESIGN §2.3).

Data flow: a task gives :class:`Prompts`; a policy *samples* a :class:`Rollout` (recording ``behavior_logp`` of
each generated token at the sampling temperature); the task scores rewards; later the trainer asks the policy to
*score* the same token ids (``logp``, ``entropy`` with grad) to build a ``TokenBatch``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor


@dataclass
class Prompts:
    """``ids`` [N, P] prompt token ids (right-aligned: left padding), ``mask`` [N, P] (1 = real token),
    ``index`` [N] the task's id of each prompt (used by the task to compute rewards); ``meta`` is task-specific."""

    ids: Tensor
    mask: Tensor
    index: Tensor
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.ids.shape[0])


@dataclass
class Rollout:
    """Sampled responses, ``B = N · G`` rows (each prompt repeated ``G`` times, consecutive).

    ``response_ids`` [B, T] (padding after EOS), ``response_mask`` [B, T] float (1 = generated token, EOS included),
    ``behavior_logp`` [B, T] detached log-prob of each token under the generating policy at the sampling temperature,
    ``sampler_logp`` [B, T] optional log-prob as reported by a (noisy) sampling engine, ``group_ids`` [B] the prompt
    row each response belongs to, ``prompt_index`` [B] the task's prompt id, ``version`` [B] the policy version that
    generated it (filled by the trainer), ``rewards`` [B] (filled by the task)."""

    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    response_mask: Tensor
    behavior_logp: Tensor
    group_ids: Tensor
    prompt_index: Tensor
    sampler_logp: Tensor | None = None
    rewards: Tensor | None = None
    version: Tensor | None = None
    temperature: float = 1.0

    def __len__(self) -> int:
        return int(self.response_ids.shape[0])

    def with_(self, **changes: Any) -> Rollout:
        return replace(self, **changes)

    def select(self, rows: Tensor) -> Rollout:
        """The rows ``rows`` (a LongTensor of indices) of every [B, ...] field."""
        changes = {}
        for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "behavior_logp", "group_ids",
                     "prompt_index", "sampler_logp", "rewards", "version"):
            value = getattr(self, name)
            changes[name] = None if value is None else value[rows]
        return replace(self, **changes)

    @staticmethod
    def concat(parts: list[Rollout]) -> Rollout:
        """Stack rollouts row-wise (responses right-padded to the longest); group ids are kept distinct."""
        width = max(p.response_ids.shape[1] for p in parts)
        pwidth = max(p.prompt_ids.shape[1] for p in parts)
        offset = 0
        fields_: dict[str, list[Tensor]] = {}
        for part in parts:
            values = {
                "prompt_ids": _left_pad(part.prompt_ids, pwidth, 0),
                "prompt_mask": _left_pad(part.prompt_mask, pwidth, 0),
                "response_ids": _right_pad(part.response_ids, width, 0),
                "response_mask": _right_pad(part.response_mask, width, 0),
                "behavior_logp": _right_pad(part.behavior_logp, width, 0),
                "group_ids": part.group_ids + offset,
                "prompt_index": part.prompt_index,
            }
            for name in ("sampler_logp",):
                if getattr(part, name) is not None:
                    values[name] = _right_pad(getattr(part, name), width, 0)
            for name in ("rewards", "version"):
                if getattr(part, name) is not None:
                    values[name] = getattr(part, name)
            offset += int(part.group_ids.max()) + 1 if len(part) else 0
            for key, value in values.items():
                fields_.setdefault(key, []).append(value)
        stacked = {key: torch.cat(values) for key, values in fields_.items() if len(values) == len(parts)}
        return Rollout(temperature=parts[0].temperature, **stacked)


def _right_pad(x: Tensor, width: int, value: float) -> Tensor:
    if x.shape[1] == width:
        return x
    return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)


def _left_pad(x: Tensor, width: int, value: float) -> Tensor:
    if x.shape[1] == width:
        return x
    return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)


@runtime_checkable
class Policy(Protocol):
    """What the trainer needs of a policy.

    - ``sample(prompts, group_size, temperature, generator)`` → :class:`Rollout` without rewards, under
      ``torch.no_grad``; ``behavior_logp`` = log softmax(logits / temperature) at each sampled token.
    - ``score(rollout)`` → (``logp`` [B, T], ``entropy`` [B, T]) with grad, at ``rollout.temperature``, on the same
      token ids; padded positions may hold anything (the mask removes them).
    - ``trainable_parameters()`` → the parameters the optimizer updates.
    - ``state_dict()`` / ``load_state_dict()`` of the trainable state (used for checkpoints and for the few
      schedules that keep a second policy).
    """

    def sample(
        self, prompts: Prompts, group_size: int, temperature: float, generator: torch.Generator
    ) -> Rollout: ...

    def score(self, rollout: Rollout) -> tuple[Tensor, Tensor]: ...

    def trainable_parameters(self) -> list[torch.nn.Parameter]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...
