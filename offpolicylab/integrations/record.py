"""The token batches a verl or TRL run fed our objective, recorded into an offpolicylab run directory (docs/diagnosing.md,
"Recording a real run"), so that ``offpolicylab plot``, ``analyze`` and ``replay`` work on that run.

Opt in with ``OFFPOLICYLAB_RECORD=DIR`` (and ``OFFPOLICYLAB_RECORD_EVERY=N``, default 1) in verl or TRL, or
``OffPolicyLabGRPOTrainer(record_dir=DIR, record_every=N)``.  Update ``u`` is the engine's ``u``-th optimizer step
(0-based; TRL logs it as step ``u + 1``).  For every micro-batch the objective scored in that step the recorder keeps

    Δ = log π_θ − log π_behaviour  (before any cap: the log-ratio the objective saw),  A,  response mask,
    kept (the tokens that carried gradient),  entropy (TRL; verl's loss does not see it),
    log π_behaviour − log π_sampler  (when the engine passes the sampler's log-probs),
    staleness (optimizer steps since the batch was generated; −1 where the engine does not say),

and writes, into the run directory (:class:`~offpolicylab.run_dir.RunDir`, the one owner of run directories):

- ``metrics.csv``: one row per update — the objective's metrics averaged over the step's micro-batches (as verl and
  TRL average theirs), the loss, and what the engine knows besides (TRL: ``reward_mean``, ``staleness_mean``);
- ``samples/update_XXXXXX.npz`` every N updates: the histogram arrays our own runs write (``log_ratio``,
  ``advantage``, ``entropy``, ``kept``, ``seq_log_ratio``, ``staleness``) plus the whole batch, ``batch_*`` ``[B, T]``
  arrays and ``micro_batch`` ``[B]`` (which micro-batch each row was scored in), which ``offpolicylab replay`` scores
  again micro-batch by micro-batch, exactly as the run did.

Several processes (data parallel) record into ``DIR/rank=R``.  A directory that already holds a run is refused.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from offpolicylab.objectives import LossOutput, Objective, TokenBatch
from offpolicylab.run_dir import RunDir
from offpolicylab.samples import batch_part, record_arrays

RECORD_ENV = "OFFPOLICYLAB_RECORD"
EVERY_ENV = "OFFPOLICYLAB_RECORD_EVERY"


class Recorder:
    """Collects the micro-batches of one optimizer step (:meth:`add`) and writes them when the step ends
    (:meth:`end_step`); :meth:`close` writes summary.json and releases the directory."""

    def __init__(self, path: str | Path, config: Mapping[str, Any], every: int = 1) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"record every={every!r} is invalid; valid: an integer ≥ 1 (updates between samples)")
        self.every = every
        self.update = 0
        self.run = RunDir(path)
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(self.run.locked())
        try:
            self.run.create({**config, "record_every": every})
        except BaseException:
            self._stack.close()
            raise
        self._parts: list[dict[str, np.ndarray]] = []
        self._metrics: list[dict[str, float]] = []

    @classmethod
    def from_env(cls, config: Mapping[str, Any]) -> Recorder | None:
        """A recorder into ``$OFFPOLICYLAB_RECORD`` (``/rank=R`` under data parallelism), or None when unset."""
        folder = os.environ.get(RECORD_ENV, "").strip()
        if not folder:
            return None
        text = os.environ.get(EVERY_ENV, "1").strip()
        if not text.isdigit():
            raise ValueError(f"{EVERY_ENV}={text!r} is invalid; valid: an integer ≥ 1")
        return cls(rank_folder(folder), config, int(text))

    # ------------------------------------------------------------------------------------------- collecting
    def add(self, batch: TokenBatch, out: LossOutput, staleness: float | None = None) -> None:
        """One micro-batch the objective scored (``out`` = its output on ``batch``); ``staleness`` in optimizer steps
        when the engine knows it (else ``batch.staleness``, else unknown)."""
        self._parts.append(batch_part(batch, out.token_mask, staleness))
        self._metrics.append({key: float(value) for key, value in out.metrics.items() if value.numel() == 1}
                             | {"loss": float(out.loss.detach())})

    def end_step(self, **extra: float) -> None:
        """Close the current optimizer step: its metrics row, and its batch every ``every`` updates.  ``extra``
        adds columns the engine knows (``reward_mean``, ...).  A step with no micro-batch writes nothing."""
        if not self._parts:
            return
        row: dict[str, Any] = {"update": self.update, **mean_metrics(self._metrics), **extra}
        staleness = np.concatenate([p["staleness"] for p in self._parts if "staleness" in p] or [np.zeros(0)])
        if staleness.size and (staleness >= 0).all():
            row["staleness_mean"] = float(staleness.mean())
        self.run.append_metrics(row)
        if self.update % self.every == 0:
            self.run.write_samples(self.update, record_arrays(self._parts, self.update))
        self._parts, self._metrics = [], []
        self.update += 1

    def close(self, status: str = "completed") -> None:
        """End the record: the last step (if any), summary.json, the directory's lock released."""
        try:
            self.end_step()
            self.run.close()
            if self.run.metrics_path.exists():
                self.run.write_summary(status, source="recorded", updates_recorded=self.update)
        finally:
            self._stack.close()


def rank_folder(folder: str | Path) -> Path:
    """``folder``, or ``folder/rank=R`` when several processes train (``torch.distributed`` or ``$WORLD_SIZE``)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    else:
        rank, size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    return Path(folder) / f"rank={rank}" if size > 1 else Path(folder)


def mean_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    """The mean over micro-batches of each metric (over the micro-batches that report it)."""
    names = dict.fromkeys(name for row in rows for name in row)
    return {name: float(np.mean([row[name] for row in rows if name in row])) for name in names}


def objective_config(engine: str, objective: Objective, **extra: Any) -> dict[str, Any]:
    """config.json of a recorded run: the engine, the objective and its parameters (what ``plot`` labels runs by)."""
    return {"engine": engine, "objective": objective.name, "objective_params": dict(objective.config), **extra}
