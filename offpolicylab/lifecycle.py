"""A run's life in its run directory (:class:`~offpolicylab.run_dir.RunDir`): open it (fresh, or resumed after the
resume checks, :func:`checked_resume`), the checkpoint state written and restored, the policy's adapter, the
completions of a text policy, and the end — the summary, or the failure recorded in every directory
(:func:`guarded`).
"""

from __future__ import annotations

import contextlib
import cProfile
import json
import time
from typing import Any

import numpy as np
import torch
from torch import Tensor

from offpolicylab.build import advantage_used
from offpolicylab.config import TrainConfig, upgrade_config
from offpolicylab.contracts import (
    AdapterPolicy,
    ExactWorld,
    Policy,
    Rollout,
    TextPolicy,
    World,
)
from offpolicylab.objectives import Objective, TokenBatch, get_objective
from offpolicylab.policies import POLICIES
from offpolicylab.profiling import LoopProfile, Stopwatch
from offpolicylab.progress import log
from offpolicylab.resume import check_extension, config_changes
from offpolicylab.run_dir import RunDir, RunError
from offpolicylab.stack import Run
from offpolicylab.staleness import parse_schedule
from offpolicylab.tracking import Tracker, open_tracker
from offpolicylab.worlds import WORLDS

__all__ = ["checked_next_update", "checked_resume", "checkpoint_state", "completions", "current_key",
           "exact_optimum", "guarded", "OLD_CHECKPOINT_KEYS", "open_run", "open_trackers", "Opening",
           "policy_device", "record_failure", "replay_warning", "resolve_config", "restore_state",
           "save_adapter", "TrainingFailed", "write_summary"]


class TrainingFailed(RuntimeError):
    """Training raised after the run directory was created (summary.json then says ``failed``)."""


Opening = tuple[Tracker | None, dict[str, Any] | None]
"""What :func:`open_trackers` found for a run: its opened tracker and, for a resume, the checked checkpoint state."""


def open_run(directory: RunDir, run: Run, resume: bool, opening: Opening | None = None) -> int:
    """Create the run directory (fresh run) or restore the checkpoint (resume); returns the first update to do.
    The resume checks and the run's trackers (``--report-to``) come first, before any file is written, once:
    ``opening`` is what :func:`open_trackers` found (done here when not given)."""
    tracker, state = opening or open_trackers([directory], [run], resume)[0]
    resolved = resolve_config(run.config, run.objective)
    if not resume:
        directory.create(resolved)
        directory.tracker = tracker
        return 0
    stored = directory.read_config()
    start = 0 if state is None else int(state["next_update"])
    if state is None:  # killed before the first checkpoint: start over
        directory.truncate_metrics(0)
    else:
        restore_state(run, state)
        directory.truncate_metrics(start, state)
        replay_warning(run, directory.read_metrics())
    if directory.read_summary() is not None:  # a failed run goes on from its last checkpoint, an extended one too
        directory.summary_path.unlink()
    extended = stored["updates"] != resolved["updates"]
    if stored != resolved:  # another --updates (an extension) or --report-to: config.json says what runs now
        directory.write_config(resolved, directory.read_environment())
    directory.event("extend" if extended else "resume", start,
                    **({} if state else {"note": "no checkpoint yet, restarting"}),
                    **({"updates_before": stored["updates"]} if extended else {}))
    directory.tracker = tracker
    return start


def open_trackers(directories: list[RunDir], runs: list[Run], resume: bool) -> list[Opening]:
    """Each run's :data:`Opening`: the checks that refuse a fresh run in a folder that holds one, or a resume
    (:func:`checked_resume`, its checkpoint state kept for :func:`open_run`), then the run's trackers
    (``--report-to``), opened before any run file is written so that a tracker that cannot be opened leaves every
    run directory as it was (one line, :class:`~offpolicylab.tracking.TrackerError`).  On a failure the trackers
    already opened are closed."""
    openings: list[Opening] = []
    try:
        for directory, run in zip(directories, runs, strict=True):
            resolved = resolve_config(run.config, run.objective)
            state = None
            if resume:
                state = checked_resume(directory, resolved, run.config)
            elif directory.holds_run():
                directory.create(resolved)  # refuses it, naming --resume
            start = 0 if state is None else int(state["next_update"])
            openings.append((open_tracker(run.config.report_to, directory.path, resolved, start), state))
    except BaseException:
        for opened, _ in openings:
            if opened is not None:
                with contextlib.suppress(Exception):
                    opened.close({"status": "failed"})
        raise
    return openings


def checked_resume(directory: RunDir, resolved: dict[str, Any], config: TrainConfig) -> dict[str, Any] | None:
    """The checkpoint a resume of ``directory`` continues from (None: killed before the first one), after checking
    everything that can refuse it — the stored configuration (which may differ in ``report_to``, and in ``updates``
    when the run can be extended: :mod:`offpolicylab.resume`), the summary, the update counter — without writing."""
    stored = upgrade_config(directory.read_config())  # earlier versions' keys renamed (behavior_logp)
    directory.check_adapter()
    changed = config_changes(stored, resolved)
    extending = changed == ["updates"]
    if changed and not extending:
        raise RunError(f"--resume with a different configuration ({', '.join(changed)} differ from "
                       f"{directory.config_path}); valid: the same options as the original run, or another "
                       "--updates")
    previous = directory.read_summary()
    if previous is not None and previous.get("status") != "failed" and not extending:
        raise RunError(f"run {directory.path} already finished with status {previous.get('status')!r}; valid: "
                       f"--updates N (more than {stored['updates']}) to extend it")
    state = None
    if directory.checkpoint_path.exists():
        state = directory.load_checkpoint()
        state["next_update"] = checked_next_update(directory, state, config, stored["updates"])
    if extending:
        recorded = len(directory.read_metrics()) if directory.metrics_path.exists() else 0
        if config.updates < recorded:  # judged against the rows recorded, not the checkpoint: nothing is dropped
            ended = (f" (it ended {previous['status']} there)" if previous is not None
                     and previous.get("status") in ("collapsed", "failed") else "")
            raise RunError(f"--updates {config.updates} is below the {recorded} updates {directory.metrics_path} "
                           f"already records{ended}; valid: --updates {recorded} or more")
        buffered = state["buffer"].get("keys", torch.zeros(0)).tolist() if state else []
        check_extension(parse_schedule(config.schedule), stored["updates"], config.updates,
                        0 if state is None else state["next_update"], config.collapse_tail, set(buffered))
    return state


def checked_next_update(directory: RunDir, state: dict[str, Any], config: TrainConfig,
                        planned: int | None = None) -> int:
    """The checkpoint's update counter, which must be an integer in 1 … updates at a checkpoint boundary
    (a multiple of ``checkpoint_every``, or ``updates``, or the ``planned`` updates of a run being extended)."""
    value = state["next_update"]
    value = int(value) if isinstance(value, torch.Tensor) and value.numel() == 1 else value
    at_boundary = isinstance(value, int) and (value % config.checkpoint_every == 0 or value in (config.updates, planned))
    last = max(config.updates, planned or 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= last or not at_boundary:
        raise RunError(f"corrupt checkpoint {directory.checkpoint_path} (update counter {value!r}; valid: a multiple "
                       f"of checkpoint_every={config.checkpoint_every} in 1..{last})")
    return value


def resolve_config(config: TrainConfig, objective: Objective | None = None) -> dict[str, Any]:
    """config.json of a run of ``config``: its fields, with the objective's parameters (defaults included) filled in
    from ``objective`` (built from the config when not given), ``advantage`` resolved to the estimator used, and the
    world's and the policy's given parameters as their validated values; a bad name or parameter raises
    ``ValueError``."""
    objective = objective or get_objective(config.objective, **config.objective_params)
    config, _ = config.with_defaults()
    resolved = config.to_dict()
    resolved["objective_params"] = dict(objective.config)
    resolved["advantage"] = advantage_used(config, objective)
    resolved["world_params"] = WORLDS.resolve(config.world, config.world_params, fill_defaults=False)
    resolved["policy_params"] = POLICIES.resolve(config.policy, config.policy_params, fill_defaults=False)
    return json.loads(json.dumps(resolved))


def checkpoint_state(run: Run, next_update: int, optimizer: dict[str, Any] | None = None,
                     torch_rng: Tensor | None = None) -> dict[str, Any]:
    """Everything needed to continue bit for bit: weights, optimizer (``optimizer``: its state dict when the run's
    optimizer is shared), objective state, RNGs (``torch_rng``: the global RNG state to record, default the
    current one), the buffer of pending rollouts, collapse detector and the update counter (tensors and plain
    containers only)."""
    return {
        "next_update": next_update,
        "policy": run.policy.state_dict(),
        "optimizer": run.optimizer.state_dict() if optimizer is None else optimizer,
        "objective": run.objective.state_dict(),
        "generator": run.generator.get_state(),
        "torch_rng": torch.get_rng_state() if torch_rng is None else torch_rng,
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],  # dropout on a GPU
        "buffer": Rollout.pack(run.buffer),
        "collapse_detector": run.collapse_detector.state_dict(),
    }


def replay_warning(run: Run, rows: list[dict[str, str]]) -> None:
    """Bring the live warning to where it was at the checkpoint: it is a function of the metrics rows recorded,
    so feeding them again (silently) restores it."""
    for row in rows:
        run.early_warning.observe(int(row["update"]), row)


#: Checkpoint keys of earlier versions, by today's key: a checkpoint written before a rename still restores.
OLD_CHECKPOINT_KEYS = {"collapse_detector": "detector"}


def current_key(state: dict[str, Any], key: str) -> str:
    """``key``, or the name an earlier version wrote it under (:data:`OLD_CHECKPOINT_KEYS`) when only that is in
    the checkpoint ``state``."""
    old = OLD_CHECKPOINT_KEYS.get(key)
    return old if key not in state and old in state else key


def restore_state(run: Run, state: dict[str, Any]) -> None:
    """Continue ``run`` from the checkpoint ``state`` (:func:`checkpoint_state`; a checkpoint of an earlier version
    too, :data:`OLD_CHECKPOINT_KEYS`); ``RunError`` when it does not match the run."""
    try:
        run.policy.load_state_dict(state["policy"])
        run.optimizer.load_state_dict(state["optimizer"])
        run.objective.load_state_dict(state["objective"])
        run.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        if state.get("cuda_rng") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        run.buffer = Rollout.unpack(state["buffer"], device=policy_device(run.policy))
        run.collapse_detector.load_state_dict(state[current_key(state, "collapse_detector")])
    except (KeyError, RuntimeError, ValueError, TypeError) as exc:
        raise RunError(f"corrupt checkpoint: it does not match this run ({type(exc).__name__}: "
                       f"{str(exc).splitlines()[0][:120] if str(exc) else ''})") from None


def policy_device(policy: Policy) -> torch.device:
    """Where the policy's parameters live (checkpoints are loaded on the CPU)."""
    params = list(policy.trainable_parameters())
    return params[0].device if params else torch.device("cpu")


def save_adapter(run: Run, directory: RunDir) -> None:
    """``RUN/adapter``: the policy's adapter in its library's own format (hf: a peft folder), replaced whole at
    every checkpoint and when the run ends (:meth:`RunDir.save_adapter`); nothing for other policies."""
    if isinstance(run.policy, AdapterPolicy):
        directory.save_adapter(run.policy.save_adapter)


def completions(policy: TextPolicy, rollout: Rollout, batch: TokenBatch) -> list[dict[str, Any]]:
    """One record per response of the consumed batch: prompt and response text, reward, advantage, staleness (updates
    since its policy generated it), the generating version and its group (prompt row)."""
    prompts = policy.decode(rollout.prompt_ids, rollout.prompt_mask)
    responses = policy.decode(rollout.response_ids, rollout.response_mask)
    advantages = batch.advantages if batch.advantages.dim() == 1 else batch.advantages[:, 0]
    numbers = zip(rollout.rewards.tolist(), advantages.detach().tolist(), batch.staleness.tolist(),
                  rollout.version.tolist(), rollout.group_ids.tolist(), strict=True)
    return [{"prompt": prompt, "response": response, "reward": short(reward), "advantage": short(advantage),
             "staleness": int(staleness), "version": version, "group": group}
            for prompt, response, (reward, advantage, staleness, version, group) in zip(prompts, responses, numbers,
                                                                                       strict=True)]


def short(value: float) -> float:
    """A float32 number as the shortest decimal that reads back as the same float32 (0.1, not 0.10000000149)."""
    return float(str(np.float32(value)))


def guarded(directories: list[RunDir], profile: bool, updates: Any, watch: Stopwatch, start: int) -> list[str]:
    """``updates()`` (the statuses of a loop over the runs writing ``directories``), profiled when asked; a
    failure is recorded in every directory and raised as :class:`TrainingFailed`; the directories are closed."""
    try:
        if not profile:
            return updates()
        profiler, clock = cProfile.Profile(), time.perf_counter()
        profiler.enable()
        try:
            statuses = updates()
        finally:
            profiler.disable()
        done = len(directories[0].read_metrics()) - start
        loop = LoopProfile(done, time.perf_counter() - clock, dict(watch.seconds), profiler)
        for directory in directories:
            directory.write_profile(loop.report(), loop.stats_bytes())
        log(loop.short() + f"\n(full profile: {', '.join(str(d.profile_path) for d in directories)})")
        return statuses
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        for directory in directories:
            record_failure(directory, error)
        raise TrainingFailed(f"run {', '.join(str(d.path) for d in directories)} failed: {error}") from exc
    finally:
        for directory in directories:
            with contextlib.suppress(OSError):  # closing flushes; a full disk already failed the run
                directory.close()


def write_summary(directory: RunDir, run: Run, status: str) -> dict[str, Any]:
    return directory.write_summary(status, collapse_update=run.collapse_detector.collapsed_at, **exact_optimum(run.world))


def record_failure(directory: RunDir, error: str) -> None:
    """The ``failed`` event and summary, as far as they can be written (on a full disk they may not be)."""
    with contextlib.suppress(OSError):
        directory.event("failed", -1, error=error)
    with contextlib.suppress(OSError):
        directory.write_summary("failed", error=error)


def exact_optimum(world: World) -> dict[str, float]:
    return {"optimal_return": float(world.optimal_return())} if isinstance(world, ExactWorld) else {}
