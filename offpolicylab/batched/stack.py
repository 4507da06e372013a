"""A stack of runs: S runs of one configuration (differing only in seed and objective) whose policies are stacked
into one (docs/design.md, "Batched seeds").

The stacked policy answers row block s of a batch with member s (a policy kind declares its stacked class in its
registry entry, ``stack=``); one optimizer steps the stacked parameters.  Each member keeps its own generator
(prompts, sampling, rewards: the draws its separate run makes), objective, collapse detector, schedule buffer and
run directory.  Per update, with θ_s the slice of member s:

    loss = Σ_s loss_s(θ_s)            one backward: ∂loss/∂θ_s = ∂loss_s/∂θ_s (no parameter is shared)
    g_s ← g_s · min(1, c / (‖g_s‖ + 1e-6))   the global-norm clipping of each separate run, per slice
    θ ← optimizer step on the stack   Adam / AdamW / SGD act element by element, so slice s takes its own step
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from offpolicylab.contracts import Policy, Prompts, Rollout
from offpolicylab.policies import POLICIES, policy_ability
from offpolicylab.profiling import Stopwatch
from offpolicylab.runs import RunDir
from offpolicylab.trainer import Run, batch_sources, make_optimizer, sample, stamped, with_rewards


def stack_policies(kind: str, policies: Sequence[Policy]) -> Policy:
    """One policy answering block s of a batch with ``policies[s]`` (the kind's registry entry ``stack``);
    ``ValueError`` for kinds that do not stack."""
    stacked = policy_ability(kind, "stack")
    if stacked is None:
        raise ValueError(f"policy {kind} cannot train seeds as one computation; valid: {', '.join(stackable())}")
    return stacked(policies)


def stackable() -> list[str]:
    """The policy kinds whose runs stack."""
    return [name for name in POLICIES.names() if policy_ability(name, "stack") is not None]


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


# ============================================================================================ the stack
@dataclass
class Stack:
    """Runs trained as one computation: ``runs[s]`` writes ``directories[s]``; ``policy`` and ``reference`` are
    the stacks of the members' policies and frozen π_0 copies; ``optimizer`` steps ``policy``'s parameters (a
    member's own optimizer only carried its restored state in); ``rng_states[s]`` is the global RNG state member s's
    separate run would checkpoint."""

    runs: list[Run]
    directories: list[RunDir]
    policy: Policy
    reference: Policy | None
    optimizer: torch.optim.Optimizer
    rng_states: list[Tensor]

    @classmethod
    def of(cls, runs: list[Run], directories: list[RunDir], optimizer_states: list[dict[str, Any]],
           rng_states: list[Tensor]) -> Stack:
        """Stack the runs' policies, frozen copies and optimizer states (fresh or restored); each member's policy is
        a view of its slice of the stack afterwards."""
        kind = runs[0].config.policy
        policy = stack_policies(kind, [run.policy for run in runs])
        reference = stack_policies(kind, [run.reference for run in runs]) if runs[0].reference else None
        optimizer = make_optimizer(runs[0].config, policy.trainable_parameters())
        if optimizer_states[0]["state"]:
            optimizer.load_state_dict(stacked_state(optimizer_states))
        return cls(runs, directories, policy, reference, optimizer, rng_states)

    def __len__(self) -> int:
        return len(self.runs)

    def member_optimizer(self, index: int) -> dict[str, Any]:
        """Member ``index``'s optimizer state dict, as its separate run's optimizer would hold it."""
        return member_state(self.optimizer.state_dict(), index)

    def keep(self, indices: list[int]) -> Stack:
        """The stack of the members ``indices`` (the others stopped): their policies and optimizer state restacked."""
        states = [self.member_optimizer(i) for i in indices]
        return Stack.of([self.runs[i] for i in indices], [self.directories[i] for i in indices], states,
                        [self.rng_states[i] for i in indices])

    def split(self, value: Tensor) -> list[Tensor]:
        """The members' row blocks of a ``[S·B, ...]`` tensor."""
        return list(value.split(value.shape[0] // len(self)))

    def generate(self, version: int, watch: Stopwatch) -> list[Rollout]:
        """One batch per member (:func:`offpolicylab.trainer.generate` of each), sampled by the stacked policy with
        each member's prompts and generator: each member draws what its separate run draws, in the same order."""
        pieces: list[list[Rollout]] = [[] for _ in self.runs]
        generators = [run.generator for run in self.runs]
        for is_reference, count, tag in batch_sources(self.runs[0], version):
            prompts = Prompts.concat([run.world.sample_prompts(count, run.generator) for run in self.runs])
            policy = self.reference if is_reference else self.policy
            with watch("policy_forward"):
                rollout = sample(policy, prompts, self.runs[0].config, generators)
            for own, block in zip(pieces, stamped(rollout, tag).split(len(self)), strict=True):
                own.append(block)
        with watch("other"):
            return [with_rewards(run, Rollout.concat(own))
                    for run, own in zip(self.runs, pieces, strict=True)]

    def clip_gradients(self, max_norm: float) -> list[Tensor]:
        """Each member's pre-clip global gradient norm (``torch.nn.utils.get_total_norm`` of its slices), its
        gradient scaled by min(1, max_norm / (norm + 1e-6)) as ``clip_grad_norm_`` scales a separate run's."""
        grads = [p.grad for p in self.policy.trainable_parameters() if p.grad is not None]
        norms = []
        for index in range(len(self)):
            own = [g[index] for g in grads]
            norm = torch.nn.utils.get_total_norm(own)
            scale = torch.clamp(float(max_norm) / (norm + 1e-6), max=1.0)
            for g in own:
                g.mul_(scale)
            norms.append(norm)
        return norms
