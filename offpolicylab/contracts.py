"""The data types and contracts shared by worlds, policies and the trainer (docs/design.md, "Contracts").

Data flow: a :class:`World` gives :class:`Prompts`; a :class:`Policy` *samples* a :class:`Rollout` (recording
``behavior_logp`` of each generated token at the sampling temperature); the world scores rewards; later the trainer
asks the policy to *score* the same token ids (``logp``, ``entropy`` with grad) to build a ``TokenBatch``.

Optional abilities are runtime-checkable protocols of their own (``isinstance(world, ExactWorld)``):
:class:`ExactWorld`, :class:`InitialLogitsWorld`, :class:`PretrainedWorld`, :class:`GreedyPolicy`,
:class:`ClonablePolicy`, :class:`PrefixTreePolicy`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor


@dataclass
class Prompts:
    """``ids`` [N, P] prompt token ids (right-aligned: left padding), ``mask`` [N, P] (1 = real token),
    ``index`` [N] the world's id of each prompt (used by the world to compute rewards); ``meta`` is world-specific."""

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
    row each response belongs to, ``prompt_index`` [B] the world's prompt id, ``version`` [B] the policy version that
    generated it (filled by the trainer), ``rewards`` [B] (filled by the world)."""

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


@runtime_checkable
class GreedyPolicy(Protocol):
    """A policy that can answer greedily: ``greedy(prompts)`` → :class:`Rollout` of the arg-max tokens."""

    def greedy(self, prompts: Prompts) -> Rollout: ...


@runtime_checkable
class ClonablePolicy(Protocol):
    """A policy that copies itself cheaply (frozen weights, shared read-only parts); others are deep-copied."""

    def clone(self) -> Any: ...


@runtime_checkable
class PrefixTreePolicy(Protocol):
    """A policy that gives π(· | x, y_{<t}) once per distinct prefix of an enumerable world: ``[N, K, V]`` with
    K = Σ_{t<T} V^t nodes (see :func:`offpolicylab.worlds.exact.prefix_tree_nodes`)."""

    def prefix_tree_log_probs(self, prompts: Prompts, temperature: float) -> Tensor: ...


@runtime_checkable
class World(Protocol):
    """A batched world: prompts → responses → verifiable rewards.

    - ``vocab_size``, ``max_response_len`` (T), ``eos_id`` (or None when responses have a fixed length).
    - ``sample_prompts(n, generator)`` → :class:`Prompts` for training; ``eval_prompts()`` → a fixed set for
      evaluation.
    - ``reward(prompt_index, response_ids, response_mask)`` → [B] float rewards (verifiable, deterministic given the
      ids, except for Bernoulli bandits which take ``generator``).
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


@runtime_checkable
class ExactWorld(Protocol):
    """A world small enough to list every response (V^T ≤ :data:`~offpolicylab.worlds.exact.MAX_ENUMERATION`):
    ``enumeration`` (an :class:`~offpolicylab.worlds.exact.Enumeration`), ``exact_return(policy)`` and
    ``optimal_return()``."""

    enumeration: Any

    def exact_return(self, policy: Any, temperature: float = 1.0) -> float: ...

    def optimal_return(self) -> float: ...


@runtime_checkable
class InitialLogitsWorld(Protocol):
    """A world that suggests the tabular policy's starting logits (e.g. π_b of the 3-arm pitfall), or None."""

    def initial_logits(self) -> Tensor | None: ...


@runtime_checkable
class PretrainedWorld(Protocol):
    """A world that ships its own pretrained policy π₀ (the synthetic LM's distilled transformer)."""

    def pretrained_policy(self) -> Any: ...
