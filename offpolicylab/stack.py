"""A run, and a stack of runs: what the one update loop (:func:`offpolicylab.trainer.run_updates`) trains.

As in vectorised RL libraries (Stable-Baselines3's ``VecEnv``, CleanRL's vector environments: one environment is a
vector of one), a single run is a stack of one.  A stack of S > 1 runs of one configuration (differing only in seed
and objective) has one stacked policy answering row block s of a batch with member s (a policy kind declares its
stacked class in its registry entry, ``stack=``) and one optimizer over the stacked parameters; a stack of one uses
the run's own policy and optimizer.  Each member keeps its own generator (prompts, sampling, rewards: the draws its
separate run makes), objective, collapse detector, schedule buffer and run directory.  Per update, with θ_s the
slice of member s:

    loss = Σ_s loss_s(θ_s)            one backward: ∂loss/∂θ_s = ∂loss_s/∂θ_s (no parameter is shared)
    g_s ← g_s · min(1, c / (‖g_s‖ + 1e-6))   the global-norm clipping of each separate run, per slice
    θ ← optimizer step on the stack   Adam / AdamW / SGD act element by element, so slice s takes its own step
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from offpolicylab.config import TrainConfig
from offpolicylab.contracts import Policy, Rollout, World
from offpolicylab.diagnostics.collapse import CollapseDetector
from offpolicylab.diagnostics.warning import Detector, default_warning
from offpolicylab.objectives import Objective
from offpolicylab.policies import POLICIES, policy_ability
from offpolicylab.run_dir import RunDir
from offpolicylab.staleness import Schedule

__all__ = ["check_stackable", "make_optimizer", "member_state", "Run", "Stack", "stack_policies", "stackable",
           "stacked_state"]


@dataclass
class Run:
    """Everything one run is made of, built (and validated) from a :class:`TrainConfig` before any file is written
    (:func:`offpolicylab.build.build`)."""

    config: TrainConfig
    world: World
    policy: Policy
    objective: Objective
    schedule: Schedule
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    collapse_detector: CollapseDetector  # decides a collapse (the run's status; stop_on_collapse stops it)
    advantage: str = "std"  # the advantage estimator used (objectives.advantages.ESTIMATORS), config.advantage resolved
    initial: Policy | None = None  # π₀, frozen: mixture / offline data, the KL penalty's reference, KL(π‖π₀)
    enumerable: bool = False  # the world can enumerate its responses (exact return and KL at evaluation)
    memory_plan: str | None = None  # the policy's own memory plan (hf: how it scores), printed at the start
    buffer: dict[int, Rollout] = field(default_factory=dict)  # rollouts generated, not yet consumed
    early_warning: Detector = field(default_factory=default_warning)  # warns before a collapse (fed the rows)
    last_warning: tuple[int, str] | None = None  # the early warning's latest: (update, reason)
    initial_logprobs: Tensor | None = None  # cache of log π₀(y|x) over an enumerable world's responses


def make_optimizer(config: TrainConfig, params: Any) -> torch.optim.Optimizer:
    """The configured optimizer (``adam``, ``adamw`` or ``sgd`` at ``config.lr``) over ``params``."""
    params = list(params)
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=config.lr)
    return torch.optim.SGD(params, lr=config.lr)


def stack_policies(kind: str, policies: Sequence[Policy]) -> Policy:
    """One policy answering block s of a batch with ``policies[s]`` (the kind's registry entry ``stack``);
    ``ValueError`` for kinds that do not stack."""
    stacked = policy_ability(kind, "stack")
    if stacked is None:
        raise ValueError(f"policy {kind} cannot train seeds as one computation; valid: {', '.join(stackable())}")
    return stacked(policies)


def check_stackable(config: TrainConfig) -> None:
    """``ValueError`` unless runs of ``config`` can train as one stacked computation: DAPO's dynamic sampling samples
    as many rounds as each run needs, which one stacked policy sampling every member's rows at once cannot do (a
    stack of one, :meth:`Stack.one`, runs it)."""
    if config.dynamic_sampling:
        raise ValueError("runs with dynamic_sampling cannot train together (each samples as often as it needs); "
                         "valid: train them one after another (run --seeds and a sweep do)")


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
    """Runs trained as one computation, its members: ``members[s]`` writes ``directories[s]``; ``policy`` and ``initial`` answer
    every member's rows (a stacked policy and the stack of the members' frozen π₀ copies when ``stacked``, else the
    one member's own); ``optimizer`` steps ``policy``'s parameters; ``rng_states[s]`` is the global RNG state
    member s's separate run would checkpoint (a stack of one checkpoints the current one)."""

    members: list[Run]
    directories: list[RunDir | None]
    policy: Policy
    initial: Policy | None
    optimizer: torch.optim.Optimizer
    rng_states: list[Tensor]
    stacked: bool = True  # parameters carry a leading member dimension

    @classmethod
    def one(cls, run: Run, directory: RunDir | None = None) -> Stack:
        """A single run as a stack of one: its own policy, frozen π₀ and optimizer (``directory`` None: a stack
        that collects, trains or evaluates but records nothing, e.g. for a calibration measurement)."""
        return cls([run], [directory], run.policy, run.initial, run.optimizer, [], stacked=False)

    @classmethod
    def of(cls, runs: list[Run], directories: list[RunDir], optimizer_states: list[dict[str, Any]],
           rng_states: list[Tensor]) -> Stack:
        """Stack the runs' policies, frozen copies and optimizer states (fresh or restored); each member's policy is
        a view of its slice of the stack afterwards; ``ValueError`` for runs that cannot stack
        (:func:`check_stackable`)."""
        check_stackable(runs[0].config)
        kind = runs[0].config.policy
        policy = stack_policies(kind, [run.policy for run in runs])
        initial = stack_policies(kind, [run.initial for run in runs]) if runs[0].initial else None
        optimizer = make_optimizer(runs[0].config, policy.trainable_parameters())
        if optimizer_states[0]["state"]:
            optimizer.load_state_dict(stacked_state(optimizer_states))
        return cls(runs, directories, policy, initial, optimizer, rng_states)

    def __len__(self) -> int:
        return len(self.members)

    @property
    def config(self) -> TrainConfig:
        """The configuration the members share (they differ only in seed and objective)."""
        return self.members[0].config

    def generators(self, generators: list[torch.Generator]) -> torch.Generator | list[torch.Generator]:
        """What the stack's policy samples with: one generator per row block, or the one member's generator."""
        return generators if self.stacked else generators[0]

    def member_optimizer(self, index: int) -> dict[str, Any]:
        """Member ``index``'s optimizer state dict, as its separate run's optimizer would hold it."""
        state = self.optimizer.state_dict()
        return member_state(state, index) if self.stacked else state

    def rng_state(self, index: int) -> Tensor | None:
        """The global RNG state member ``index``'s checkpoint records (None: the current one)."""
        return self.rng_states[index] if self.stacked else None

    def keep(self, indices: list[int]) -> Stack:
        """The stack of the members ``indices`` (the others stopped): their policies and optimizer state restacked."""
        states = [self.member_optimizer(i) for i in indices]
        return Stack.of([self.members[i] for i in indices], [self.directories[i] for i in indices], states,
                        [self.rng_states[i] for i in indices])

    def split(self, value: Tensor) -> list[Tensor]:
        """The members' row blocks of a ``[S·B, ...]`` tensor."""
        return list(value.split(value.shape[0] // len(self)))

    def clip_gradients(self, max_norm: float) -> list[Tensor]:
        """Each member's pre-clip global gradient norm ‖g_s‖ = ‖(‖g_s,p‖₂)_p‖₂ over the parameters p (as
        ``torch.nn.utils.get_total_norm`` of its slices), its gradient scaled by min(1, max_norm / (‖g_s‖ + 1e-6)) as
        ``clip_grad_norm_`` scales a separate run's — all members in one pass per parameter."""
        params = list(self.policy.trainable_parameters())
        if not self.stacked:
            return [torch.nn.utils.clip_grad_norm_(params, max_norm)]
        grads = [p.grad for p in params if p.grad is not None]
        members = len(self)
        per_param = torch.stack([torch.linalg.vector_norm(g.reshape(members, -1), dim=1) for g in grads], dim=1)
        norms = torch.linalg.vector_norm(per_param, dim=1)
        scale = torch.clamp(float(max_norm) / (norms + 1e-6), max=1.0)
        for g in grads:
            g.mul_(scale.reshape(members, *([1] * (g.dim() - 1))))
        return list(norms.unbind())
