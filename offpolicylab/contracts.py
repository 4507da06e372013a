"""The data types and contracts shared by worlds, policies and the trainer (docs/design.md, "Contracts").

Data flow: a :class:`World` gives :class:`Prompts`; a :class:`Policy` *samples* a :class:`Rollout` (recording
``behavior_logp`` of each generated token at the sampling temperature); the world scores rewards; later the trainer
asks the policy to *score* the same token ids (``logp``, ``entropy`` with grad) to build a ``TokenBatch``.

Optional abilities are runtime-checkable protocols of their own (``isinstance(world, ExactWorld)``):
:class:`ExactWorld`, :class:`InitialLogitsWorld`, :class:`PretrainedWorld`, :class:`GreedyPolicy`,
:class:`ClonablePolicy`, :class:`PrefixTreePolicy`, :class:`MemoryPlanningPolicy`.  A policy kind whose runs can be
stacked (batched seeds) says so in its registry entry (``stack=``, see :mod:`offpolicylab.policies`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields, replace
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

    @staticmethod
    def concat(parts: list[Prompts]) -> Prompts:
        """Prompts of several sources row-wise (equal widths); world metadata cannot be joined.  One part is
        returned as it is."""
        if len(parts) == 1:
            return parts[0]
        if any(part.meta for part in parts):
            raise ValueError("prompts with metadata cannot be joined; run the seeds separately (--seed)")
        return Prompts(ids=torch.cat([p.ids for p in parts]), mask=torch.cat([p.mask for p in parts]),
                       index=torch.cat([p.index for p in parts]))


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
        """A copy with the fields ``changes`` replaced (``dataclasses.replace`` without its per-call overhead: the
        trainer makes several per member and update)."""
        unknown = set(changes) - _FIELD_NAMES
        if unknown:
            raise TypeError(f"Rollout has no field {sorted(unknown)[0]!r}")
        out = copy.copy(self)
        for name, value in changes.items():
            setattr(out, name, value)
        return out

    def select(self, rows: Tensor) -> Rollout:
        """The rows ``rows`` (a LongTensor of indices) of every [B, ...] field."""
        return replace(self, **{name: None if (value := getattr(self, name)) is None else value[rows]
                                for name in ROW_FIELDS})

    def split(self, count: int) -> list[Rollout]:
        """The ``count`` equal consecutive row blocks (block s: rows s·B/count … (s+1)·B/count − 1), each with its
        group ids counted from 0; the inverse of :meth:`concat` of equal-sized rollouts.  One block is the rollout
        itself."""
        if count == 1:
            return [self]
        rows = len(self) // count
        if rows * count != len(self):
            raise ValueError(f"a rollout of {len(self)} rows does not split into {count} equal blocks")
        blocks = []
        for index in range(count):
            part = slice(index * rows, (index + 1) * rows)
            block = self.with_(**{name: None if (value := getattr(self, name)) is None else value[part]
                                  for name in ROW_FIELDS})
            block.group_ids = block.group_ids - block.group_ids.min()
            blocks.append(block)
        return blocks

    @staticmethod
    def concat(parts: list[Rollout]) -> Rollout:
        """Stack rollouts row-wise (prompts left-padded and responses right-padded to the longest); group ids are
        kept distinct (each part's counted on from the previous part's largest).  One part is returned as it is."""
        if len(parts) == 1:
            return parts[0]
        width = max(p.response_ids.shape[1] for p in parts)
        pwidth = max(p.prompt_ids.shape[1] for p in parts)
        offsets = [0]
        for part in parts[:-1]:
            offsets.append(offsets[-1] + (int(part.group_ids.max()) + 1 if len(part) else 0))
        stacked: dict[str, Tensor] = {}
        for name in ROW_FIELDS:
            values = [getattr(part, name) for part in parts]
            if any(value is None for value in values):
                continue
            if name == "group_ids":
                values = [value + offset for value, offset in zip(values, offsets, strict=True)]
            stacked[name] = torch.cat([_padded(name, value, pwidth, width) for value in values])
        return Rollout(temperature=parts[0].temperature, **stacked)

    @staticmethod
    def pack(rollouts: dict[int, Rollout]) -> dict[str, Tensor]:
        """Keyed rollouts (a schedule's buffer) as one tensor per field (``torch.save`` pays a fixed cost per
        tensor); :meth:`unpack` inverts it exactly."""
        if not rollouts:
            return {}
        parts = list(rollouts.values())
        packed = {
            "keys": torch.tensor(list(rollouts), dtype=torch.long),
            "rows": torch.tensor([len(r) for r in parts], dtype=torch.long),
            "prompt_width": torch.tensor([r.prompt_ids.shape[1] for r in parts], dtype=torch.long),
            "response_width": torch.tensor([r.response_ids.shape[1] for r in parts], dtype=torch.long),
            "temperature": torch.tensor([r.temperature for r in parts], dtype=torch.float64),
        }
        pwidth = max(r.prompt_ids.shape[1] for r in parts)
        width = max(r.response_ids.shape[1] for r in parts)
        for name in ROW_FIELDS:
            values = [getattr(r, name) for r in parts]
            if all(value is not None for value in values):
                packed[name] = torch.cat([_padded(name, value, pwidth, width) for value in values])
        return packed

    @staticmethod
    def unpack(packed: dict[str, Tensor], device: torch.device | str = "cpu") -> dict[int, Rollout]:
        """The keyed rollouts :meth:`pack` packed, each field copied to ``device``."""
        rollouts: dict[int, Rollout] = {}
        start = 0
        for index, key in enumerate(packed["keys"].tolist() if packed else []):
            stop = start + int(packed["rows"][index])
            pwidth, width = int(packed["prompt_width"][index]), int(packed["response_width"][index])
            fields_: dict[str, Any] = {}
            for name in ROW_FIELDS:
                if name in packed:
                    value = packed[name][start:stop]
                    if name in PROMPT_FIELDS:
                        value = value[:, value.shape[1] - pwidth:]
                    elif name in RESPONSE_FIELDS:
                        value = value[:, :width]
                    fields_[name] = value.to(device, copy=True)
            rollouts[int(key)] = Rollout(temperature=float(packed["temperature"][index]), **fields_)
            start = stop
        return rollouts


PROMPT_FIELDS = ("prompt_ids", "prompt_mask")  # [B, P], left-padded
RESPONSE_FIELDS = ("response_ids", "response_mask", "behavior_logp", "sampler_logp")  # [B, T], right-padded
_FIELD_NAMES = frozenset(f.name for f in fields(Rollout))

ROW_FIELDS = (*PROMPT_FIELDS, *RESPONSE_FIELDS, "group_ids", "prompt_index", "rewards", "version")
"""Every [B, ...] field of a :class:`Rollout`, the one list that selecting, splitting, joining and packing read."""


def _padded(name: str, value: Tensor, prompt_width: int, response_width: int) -> Tensor:
    """``value`` of field ``name`` padded with zeros to the joined width (prompts on the left, responses on the
    right); row fields unchanged."""
    if name in PROMPT_FIELDS:
        return _left_pad(value, prompt_width, 0)
    if name in RESPONSE_FIELDS:
        return _right_pad(value, response_width, 0)
    return value


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
class AdapterPolicy(Protocol):
    """A policy whose trained part is an adapter a library loads on its own: ``save_adapter(directory)`` writes it
    there (hf: peft's ``adapter_config.json`` + ``adapter_model.safetensors``, loaded by ``PeftModel.from_pretrained``
    on the base model)."""

    def save_adapter(self, directory: Any) -> Any: ...


@runtime_checkable
class TextPolicy(Protocol):
    """A policy over text: ``decode(ids, mask)`` → one string per row of token ids (the tokens where mask is 1)."""

    def decode(self, ids: Tensor, mask: Tensor) -> list[str]: ...


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


def rewards_of(world: World, rollout: Rollout, generator: torch.Generator | None = None) -> Tensor:
    """The world's rewards [B] of ``rollout``'s responses as float32 (``generator`` serves worlds whose rewards are
    random): the one reward call — training batches, evaluation and calibration."""
    rewards = world.reward(rollout.prompt_index, rollout.response_ids, rollout.response_mask, generator=generator)
    return rewards.to(torch.float32)


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


@runtime_checkable
class MemoryPlanningPolicy(Protocol):
    """A policy that plans its own scoring memory: ``plan_scoring(rows, prompt_tokens)`` → a plan whose
    ``params()`` are the policy options it fills in (recorded in config.json so a resume scores the same way) and
    whose ``describe()`` is printed at the start; it raises ``ValueError`` for a batch that cannot fit."""

    def plan_scoring(self, rows: int, prompt_tokens: int) -> Any: ...
