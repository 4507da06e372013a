"""One member's step of an update (:class:`Step`) and the numbers of its metrics row before evaluation
(:func:`update_rows`): the loss, gradient norm, batch columns, the objective's scalar metrics, the current policy's
own reward and the DAPO shaping columns, moved to the host in one transfer (docs/metrics.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from offpolicylab.contracts import (
    Rollout,
)
from offpolicylab.diagnostics import stats
from offpolicylab.objectives import LossOutput, TokenBatch
from offpolicylab.rollouts import Collected, overlong_penalty, overlong_settings
from offpolicylab.stack import Run
from offpolicylab.staleness import Schedule

__all__ = ["batch_columns", "detector_reward", "own_reward", "scalars", "separate_engine", "shaping_columns", "Step",
           "step_numbers", "update_rows"]


@dataclass
class Step:
    """What one member's update computed before it is recorded: the consumed batch of all members (``joined``, one
    run each) and the member's run in it (``index``), the objective's output, the pre-clip gradient norm, the
    member's collect phase of this update (the rollouts the current policy generated, the dynamic-sampling counts),
    the consumed rollout (its token ids: completions.jsonl of a text policy) and whether the loss and gradient were
    finite."""

    joined: TokenBatch
    index: int
    output: LossOutput
    grad_norm: Tensor
    collected: Collected
    rollout: Rollout
    finite: bool

    @property
    def batch(self) -> TokenBatch:
        """The member's consumed batch: its run's rows of ``joined`` (split for all members when first read)."""
        return self.joined.split()[self.index]


def update_rows(runs: list[Run], update: int, steps: list[Step]) -> list[dict[str, Any]]:
    """The metrics row of each run's update before evaluation: the update, the step's numbers and the current
    policy's own reward (:func:`scalars`, one host transfer for all)."""
    current = [own_reward(step.collected.fresh, update, run.schedule.other_share == 0)
               for run, step in zip(runs, steps, strict=True)]
    engines = [separate_engine(run.policy) for run in runs]
    rows = [{"update": update, **own} for own in scalars(steps, current, engines)]
    for run, step, row in zip(runs, steps, rows, strict=True):
        row.update(shaping_columns(run, step.collected, step))
    return rows


def separate_engine(policy: object) -> bool:
    """Whether ``policy``'s sampler is an engine of its own arithmetic (a reduced ``sampler_precision`` or
    ``trainer_precision``, or old log-probs the trainer recomputes), whose per-token KL to the trainer
    ``sampler_kl`` reports."""
    return (getattr(policy, "sampler_precision", "fp32") != "fp32" or getattr(policy, "trainer_precision", "fp32")
            != "fp32" or bool(getattr(policy, "logp_micro_batch", 0)))


def scalars(steps: list[Step], current: list[Tensor], engines: list[bool] | None = None) -> list[dict[str, float]]:
    """The per-update numbers of each member's step — the loss, pre-clip gradient norm, the batch's reward,
    staleness and length (:func:`batch_columns`), the objective's scalar metrics, the sampler/trainer mismatch (and
    ``sampler_kl`` where ``engines`` says the sampler is a separate engine) — and ``current``
    (``reward_current``), as Python floats, with one host transfer for all."""
    columns = batch_columns(steps[0].joined)
    engines = engines or [False] * len(steps)
    named = [step_numbers(step, reward, engine) for step, reward, engine in zip(steps, current, engines,
                                                                                  strict=True)]
    tensors = [value if value.dim() == 0 else value.reshape(()) for one in named for value in one.values()]
    parts = list(columns.values())
    if len({tensor.dtype for tensor in tensors + parts}) > 1:  # mixed dtypes: widen (float32 → float64 is exact)
        tensors, parts = ([tensor.to(torch.float64) for tensor in group] for group in (tensors, parts))
    values = iter(torch.cat([torch.stack(tensors), *parts]).tolist())
    own = [{key: next(values) for key in one} for one in named]
    shared = {name: [next(values) for _ in steps] for name in columns}
    return [{"loss": one.pop("loss"), "grad_norm": one.pop("grad_norm"),
             **{name: column[index] for name, column in shared.items()}, **one} for index, one in enumerate(own)]


def batch_columns(batch: TokenBatch) -> dict[str, Tensor]:
    """[runs] each, for every run of ``batch`` at once: reward mean and (population) std, staleness mean and max,
    mean response length — each run's value as its rows alone give it."""
    rewards, staleness = batch.rewards.reshape(batch.runs, -1), batch.staleness.reshape(batch.runs, -1)
    return {"reward_mean": rewards.mean(-1),
            "reward_std": torch.stack([row.std(unbiased=False) for row in rewards]),  # std(-1) may round otherwise
            "staleness_mean": staleness.mean(-1), "staleness_max": staleness.amax(-1),
            "response_len": batch.mask.sum(-1).reshape(batch.runs, -1).mean(-1)}


def step_numbers(step: Step, current: Tensor, engine: bool = False) -> dict[str, Tensor]:
    """The numbers :func:`scalars` reports of one member's update other than :func:`batch_columns`, as tensors;
    ``engine``: the k1 KL ``sampler_kl`` too (:func:`separate_engine`)."""
    named = {"loss": step.output.loss.detach(), "grad_norm": step.grad_norm.detach(),
             **{key: value for key, value in step.output.metrics.items() if value.numel() == 1}}
    if step.joined.sampler_logp is not None:  # trainer vs sampler numbers of the same tokens (not staleness)
        batch = step.batch
        mismatch = (batch.behavior_logp - batch.sampler_logp).abs()
        named["sampler_log_ratio_abs_mean"] = stats.masked_mean(mismatch, batch.mask)
        named["sampler_log_ratio_abs_max"] = stats.masked_max(mismatch, batch.mask)
        if engine:  # k1 estimate of KL(μ‖π) on the sampler μ's tokens (Qi et al. 2025, arXiv:2510.26788)
            named["sampler_kl"] = stats.masked_mean(batch.sampler_logp - batch.behavior_logp, batch.mask)
    named["reward_current"] = current
    return named


def own_reward(fresh: list[Rollout], update: int, all_current: bool = False) -> Tensor:
    """Mean reward of the responses the current policy (version ``update``) generated at this update — its own
    reward (``reward_current``), whatever batch the update consumes; NaN when it generated none (between stages,
    offline data); a 0-d tensor (no host sync).  ``all_current``: every fresh row is the current policy's (no share
    answered by π₀), so none is filtered."""
    rewards = [r.rewards if all_current else r.rewards[r.version == update] for r in fresh]
    rewards = torch.cat(rewards) if len(rewards) > 1 else rewards[0] if rewards else torch.zeros(0)
    return rewards.mean() if rewards.numel() else torch.full((), math.nan, dtype=rewards.dtype)


def shaping_columns(run: Run, collected: Collected, step: Step | None = None) -> dict[str, float]:
    """The columns of the DAPO options that are on: ``overlong_penalty`` (mean punishment in the consumed batch's
    rewards; only this column reads the ``step``'s batch), ``dynamic_rounds`` (batches sampled at this update,
    ``collected``) and ``dynamic_kept_frac`` (share of their groups with rewards not all equal; NaN when none was
    sampled)."""
    cfg, out = run.config, {}
    if cfg.overlong_buffer:
        lengths = step.batch.mask.sum(-1)
        out["overlong_penalty"] = float(overlong_penalty(lengths, *overlong_settings(run)).mean())
    if cfg.dynamic_sampling:
        out["dynamic_rounds"] = float(collected.rounds)
        out["dynamic_kept_frac"] = collected.kept / collected.groups if collected.groups else math.nan
    return out


def detector_reward(row: dict[str, float], schedule: Schedule) -> float | None:
    """The reward the collapse detector observes: the current policy's (``reward_current``); None (hold) at updates
    where it generated nothing; the consumed batch's reward for the offline schedules, whose data never come from
    the current policy."""
    if schedule.kind == "offline":
        return row["reward_mean"]
    return row["reward_current"] if math.isfinite(row["reward_current"]) else None
