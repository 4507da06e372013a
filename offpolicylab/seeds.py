"""Seeds batched together: runs of one configuration that differ only in their seed, trained as one computation
(docs/design.md, "Batched seeds").

A :class:`SeedGroup` holds S members (the :class:`~offpolicylab.trainer.Parts` each seed's separate run would
build) and what they share: one stacked policy whose batch is the members' row blocks (block s answered by member
s, :class:`~offpolicylab.policies.tabular.StackedTabularPolicy`) and one optimizer over its stacked parameters.
Each member keeps its own generator (prompts, sampling, rewards: the draws its separate run makes), objective,
collapse detector, schedule buffer and run directory.  Per update, with θ_s the slice of member s:

    loss = Σ_s loss_s(θ_s)            one backward: ∂loss/∂θ_s = ∂loss_s/∂θ_s (no parameter is shared)
    g_s ← g_s · min(1, c / (‖g_s‖ + 1e-6))   the global-norm clipping of each separate run, per slice
    θ ← optimizer step on the stack   Adam / AdamW / SGD act element by element, so slice s takes its own step

A group of one member is a plain run (its own policy, generator and optimizer, unchanged).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from offpolicylab.contracts import Policy, Prompts, Rollout
from offpolicylab.diagnostics import stats
from offpolicylab.objectives.batch import TokenBatch
from offpolicylab.policies.sequence_model import SequenceModelPolicy, StackedSequenceModelPolicy
from offpolicylab.policies.tabular import StackedTabularPolicy, TabularSoftmaxPolicy
from offpolicylab.policies.transformer import TransformerPolicy
from offpolicylab.policies.transformer_stack import StackedTransformerPolicy

if TYPE_CHECKING:
    from offpolicylab.runs import RunDir
    from offpolicylab.trainer import Parts

_ROW_FIELDS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "behavior_logp", "group_ids",
               "prompt_index", "sampler_logp", "rewards", "version")  # the [B, ...] fields of a Rollout
STACKABLE_POLICIES = ("tabular", "sequence_model", "transformer")  # kinds whose seeds can train as one computation
SWEEP_BATCHED_POLICIES = ("tabular", "sequence_model")
"""The kinds whose runs a sweep trains together: batching them saves time (3 seeds ≈ 1.6–1.7 × one).  The
transformer's batched seeds cost what separate runs cost (≈ 3 ×, its work grows with the rows; benchmarks/README.md),
so a sweep keeps its cells as separate tasks, spread over the workers in the grid's order."""


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` → [0, 1, 2]: distinct integers in 0 … 2³² − 1; anything else raises ``ValueError``."""
    from offpolicylab.config import MAX_SEED

    items = [item.strip() for item in str(text).split(",")]
    valid = f"valid: comma-separated distinct integers in 0..{MAX_SEED}, e.g. 0,1,2"
    if not all(item.isdigit() for item in items):
        raise ValueError(f"--seeds {text!r} is malformed; {valid}")
    seeds = [int(item) for item in items]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {text!r} has a repeated seed; {valid}")
    if max(seeds) > MAX_SEED:
        raise ValueError(f"--seeds {text!r} has a seed out of range; {valid}")
    return seeds


def stack_policies(policies: Sequence[Policy]) -> Policy:
    """One policy answering block s of a batch with ``policies[s]``; ``ValueError`` for kinds that do not stack."""
    if all(type(p) is TabularSoftmaxPolicy for p in policies):
        return StackedTabularPolicy(policies)  # type: ignore[arg-type]
    if all(type(p) is SequenceModelPolicy for p in policies):
        return StackedSequenceModelPolicy(policies)  # type: ignore[arg-type]
    if all(type(p) is TransformerPolicy for p in policies):
        return StackedTransformerPolicy(policies)  # type: ignore[arg-type]
    kinds = sorted({type(p).__name__ for p in policies})
    raise ValueError(f"{', '.join(kinds)} cannot be stacked; batched seeds support the policies "
                     f"{', '.join(STACKABLE_POLICIES)}")


# ============================================================================================ optimizer state
def member_state(stacked: dict[str, Any], index: int) -> dict[str, Any]:
    """The optimizer state dict of member ``index`` (what its separate run's optimizer would hold) from the
    stacked optimizer's: every per-parameter tensor with a leading member dimension sliced, scalars (``step``) kept."""
    state = {key: {name: _slice(value, index) for name, value in per_param.items()}
             for key, per_param in stacked["state"].items()}
    return {"state": state, "param_groups": stacked["param_groups"]}


def stacked_state(members: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The inverse of :func:`member_state`: the members' optimizer states stacked (their scalar entries, such as
    Adam's ``step``, must agree)."""
    first = members[0]
    state = {}
    for key, per_param in first["state"].items():
        state[key] = {}
        for name, value in per_param.items():
            values = [m["state"][key][name] for m in members]
            if isinstance(value, Tensor) and value.dim() > 0:
                state[key][name] = torch.stack(values)
            elif any(not _equal(v, value) for v in values):
                raise ValueError(f"the seeds' optimizer states differ in {name!r}; resume them separately (--seed)")
            else:
                state[key][name] = value
    return {"state": state, "param_groups": first["param_groups"]}


def _slice(value: Any, index: int) -> Any:
    return value[index].clone() if isinstance(value, Tensor) and value.dim() > 0 else value


def _equal(a: Any, b: Any) -> bool:
    return bool(torch.equal(a, b)) if isinstance(a, Tensor) else a == b


class MemberOptimizer:
    """A member's view of the group's optimizer: its checkpoint state (:func:`member_state`); stepping happens on
    the group."""

    def __init__(self, group: SeedGroup, index: int) -> None:
        self.group, self.index = group, index

    def state_dict(self) -> dict[str, Any]:
        return member_state(self.group.optimizer.state_dict(), self.index)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise TypeError("restore a member's optimizer before it joins a seed group")


# ============================================================================================ the group
@dataclass
class SeedGroup:
    """Members (``Parts`` of one configuration, one seed each) and their run directories, trained together."""

    members: list[Parts]
    runs: list[RunDir]
    policy: Policy  # members[0].policy for one member, else their stack
    frozen: Policy | None  # the same for the frozen initial policies (mixture / offline data)
    optimizer: torch.optim.Optimizer
    _params: list[Tensor] | None = None  # the policy's trainable parameters, listed once
    #: id of a block's first row block → (weak references to the blocks, the rollout they were split from)
    _split: dict[int, tuple[list[weakref.ref[Rollout]], Rollout]] = field(default_factory=dict)

    @classmethod
    def single(cls, parts: Parts, run: RunDir) -> SeedGroup:
        return cls([parts], [run], parts.policy, parts.frozen_initial, parts.optimizer)

    @classmethod
    def stack(cls, members: list[Parts], runs: list[RunDir]) -> SeedGroup:
        """Stack the members' policies (and frozen initial policies) and their optimizer states (fresh, or restored
        from checkpoints); afterwards each member's policy is a view of its slice of the stack."""
        from offpolicylab.trainer import make_optimizer

        states = [m.optimizer.state_dict() for m in members]
        policy = stack_policies([m.policy for m in members])
        frozen = members[0].frozen_initial and stack_policies([m.frozen_initial for m in members])
        optimizer = make_optimizer(members[0].config, policy.trainable_parameters())
        if states[0]["state"]:
            optimizer.load_state_dict(stacked_state(states))
        group = cls(members, runs, policy, frozen, optimizer)
        for index, member in enumerate(members):
            member.optimizer = MemberOptimizer(group, index)  # type: ignore[assignment]
        return group

    def __len__(self) -> int:
        return len(self.members)

    @property
    def generators(self) -> torch.Generator | list[torch.Generator]:
        """The generator of a single member, else the members' generators (one per row block)."""
        return self.members[0].generator if len(self) == 1 else [m.generator for m in self.members]

    def keep(self, indices: list[int]) -> SeedGroup:
        """The group of the members ``indices`` (the others stopped): their policies and optimizer state restacked
        (a stack of one when one is left)."""
        optimizer = self.optimizer.state_dict()
        members = [self.members[i] for i in indices]
        for index, member in zip(indices, members, strict=True):
            member.optimizer = _Held(member_state(optimizer, index))  # type: ignore[assignment]
        return SeedGroup.stack(members, [self.runs[i] for i in indices])

    # ---------------------------------------------------------------------------------------- batches
    def join_prompts(self, prompts: list[Prompts]) -> Prompts:
        if len(prompts) == 1:
            return prompts[0]
        if any(p.meta for p in prompts):
            raise ValueError("batched seeds need prompts without metadata; run the seeds separately (--seed)")
        return Prompts(ids=torch.cat([p.ids for p in prompts]), mask=torch.cat([p.mask for p in prompts]),
                       index=torch.cat([p.index for p in prompts]))

    def join_rollouts(self, rollouts: list[Rollout]) -> Rollout:
        """The members' rollouts as row blocks of one (:meth:`Rollout.concat`, group ids kept apart); when they are
        the very blocks :meth:`split_rollout` made of one rollout, that rollout itself (the same numbers)."""
        if len(rollouts) == 1:
            return rollouts[0]
        entry = self._split.get(id(rollouts[0]))
        if entry is not None and len(entry[0]) == len(rollouts) and all(
                ref() is rollout for ref, rollout in zip(entry[0], rollouts, strict=True)):
            return entry[1]
        return Rollout.concat(rollouts)

    def split_rollout(self, rollout: Rollout) -> list[Rollout]:
        """Block s of the rows of ``rollout`` for member s, group ids counted from 0 within each block."""
        if len(self) == 1:
            return [rollout]
        rows = len(rollout) // len(self)
        groups = int(rollout.group_ids[rows - 1]) + 1  # the groups of one block (rows of a prompt are consecutive)
        fields = {name: value for name in _ROW_FIELDS if (value := getattr(rollout, name)) is not None}
        blocks = []
        for index in range(len(self)):
            part = slice(index * rows, (index + 1) * rows)
            block = {name: value[part] for name, value in fields.items()}
            block["group_ids"] = block["group_ids"] - index * groups
            blocks.append(replace(rollout, **block))
        self._remember(blocks, rollout)
        return blocks

    def _remember(self, blocks: list[Rollout], rollout: Rollout) -> None:
        """Note that ``blocks`` were split from ``rollout`` (for :meth:`join_rollouts`), for as long as the first
        block lives (weak references: the note goes when the blocks are dropped, e.g. released from the buffers)."""
        key, split = id(blocks[0]), self._split
        first = weakref.ref(blocks[0], lambda _: split.pop(key, None))
        split[key] = ([first, *(weakref.ref(block) for block in blocks[1:])], rollout)

    def split(self, value: Tensor) -> list[Tensor]:
        """The members' row blocks of a ``[S·B, ...]`` tensor."""
        return [value] if len(self) == 1 else list(value.split(value.shape[0] // len(self)))

    def token_batches(self, joined: TokenBatch, rollouts: list[Rollout], metrics: bool) -> list[TokenBatch]:
        """The members' row blocks of the group's ``joined`` batch, each with its own rollout's group ids (and,
        when ``metrics``, its ratio statistics computed for all members in one pass)."""
        if len(self) == 1:
            return [joined]
        return joined.split_rows(len(self), [r.group_ids for r in rollouts], summarize=metrics)

    def objective_runs(self, batches: list[TokenBatch], metrics: bool) -> list[tuple[int, int]]:
        """The members as consecutive runs ``[start, stop)`` that one objective call can score together: members
        whose objectives are of one row-wise, stateless kind with equal parameters, whose blocks hold at most
        ``stats.ROW_LIMIT`` tokens (so each block's sums are its own, bit for bit) and, with ``metrics``, come with
        their ratio summaries; every other member is a run of one."""
        objectives = [member.objective for member in self.members]
        joinable = [getattr(o, "rowwise", False) and not o.stateful and b.logp.numel() <= stats.ROW_LIMIT
                    and (not metrics or b._summary is not None) for o, b in zip(objectives, batches, strict=True)]
        runs: list[tuple[int, int]] = []
        for index, objective in enumerate(objectives):
            start = runs[-1][0] if runs else index
            first = objectives[start]
            if runs and joinable[start] and joinable[index] and type(objective) is type(first) \
                    and objective.config == first.config:
                runs[-1] = (start, index + 1)
            else:
                runs.append((index, index + 1))
        return runs

    # ---------------------------------------------------------------------------------------- the step
    def clip_gradients(self, max_norm: float) -> list[Tensor]:
        """Each member's pre-clip global gradient norm, its gradient scaled by min(1, max_norm / (norm + 1e-6)) as
        ``torch.nn.utils.clip_grad_norm_`` does for a separate run."""
        if self._params is None:
            self._params = list(self.policy.trainable_parameters())
        params = self._params
        if len(self) == 1:
            return [torch.nn.utils.clip_grad_norm_(params, max_norm)]
        grads = [p.grad for p in params if p.grad is not None]
        size = len(self)
        if any(g[0].numel() > stats.ROW_LIMIT for g in grads):  # rows whose norm may split over threads: one by one
            return [self._clip_member([g[index] for g in grads], max_norm) for index in range(size)]
        # ‖g_s‖ of every member at once: per parameter the norm of each slice, then the norm of those norms (what
        # ``get_total_norm`` computes for one member; a row of up to stats.ROW_LIMIT values reduces as it does alone)
        per_param = [torch.linalg.vector_norm(g.reshape(size, -1), dim=1) for g in grads]
        totals = torch.linalg.vector_norm(torch.stack(per_param, dim=1), dim=1)
        scales = torch.clamp(float(max_norm) / (totals + 1e-6), max=1.0)
        for g in grads:
            g.mul_(scales.reshape(size, *[1] * (g.dim() - 1)))
        return list(totals.unbind())

    @staticmethod
    def _clip_member(grads: list[Tensor], max_norm: float) -> Tensor:
        """One member's global norm, its gradient ``grads`` scaled as ``clip_grad_norm_`` scales it."""
        total = torch.nn.utils.get_total_norm(grads)
        scale = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(scale)
        return total


class _Held:
    """A member's optimizer state, held while its group is restacked."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state
