"""Sweep engine ``ray``: one Ray task per grid cell, each calling :func:`offpolicylab.sweep.run_cell`.

    offpolicylab sweep grid.json --out runs/sweep --engine ray --workers 8     # a local Ray with 8 CPUs
    RAY_ADDRESS=head-node:6379 offpolicylab sweep grid.json --out /shared/sweep --engine ray   # a cluster

Where the cells run (:func:`ray_session`):

* a Ray already initialised in this process is used as it is (and left running);
* an address (the ``address`` argument, else the ``RAY_ADDRESS`` environment variable, Ray's own convention:
  ``host:6379``, ``auto`` or ``ray://host:10001``) connects to that cluster; the driver disconnects at the end and
  the cluster keeps running.  Every node needs offpolicylab installed and the output folder on a shared file system,
  because each cell writes its run directory where it runs;
* otherwise a local Ray is started for the sweep (``workers`` CPUs, no dashboard, usage statistics off unless
  ``RAY_USAGE_STATS_ENABLED`` says otherwise) and shut down when the sweep ends.

Each cell is one task (1 CPU) that runs :func:`~offpolicylab.sweep.run_cell`, so the run-directory layout, the
seeding and the skip / resume rule are exactly the local engine's: with the same seeds the metrics are equal cell by
cell.  A cell whose ``run_cell`` returns status ``failed`` (or whose worker process dies) is run once more
(``max_retries=1``); a second failure is recorded (``summary.json`` status ``failed`` with the error) and the other
cells finish.  Re-running the sweep skips cells that completed or collapsed, resumes interrupted ones and starts
failed ones again.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from offpolicylab.sweep import Cell, register_engine, run_cell

CELL_RETRIES = 1
LOCAL_START_ATTEMPTS = 2
ENGINE_NAME = "ray"


class RayStartError(RuntimeError):
    """A local Ray could not be started for the sweep."""


class CellFailed(RuntimeError):
    """Raised inside a Ray task when ``run_cell`` recorded a failure, so that Ray retries the cell."""

    def __init__(self, summary: dict[str, Any]) -> None:
        super().__init__(str(summary.get("error", "cell failed")))
        self.summary = summary

    def __reduce__(self) -> tuple[Any, ...]:  # pickled across processes with its summary
        return CellFailed, (self.summary,)


def attempt_cell(cell_config: dict[str, Any], out_dir: str) -> dict[str, Any]:
    """One attempt at a cell (the body of the Ray task): ``run_cell``, raising :class:`CellFailed` on failure."""
    summary = run_cell(cell_config, out_dir)
    if summary.get("status") == "failed":
        raise CellFailed(summary)
    return summary


# ============================================================================================ the Ray session
def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ValueError("sweep engine 'ray' needs Ray; install it with `pip install offpolicylab[ray]` "
                         "or use --engine local") from None
    return ray


def init_options(workers: int, address: str | None = None) -> dict[str, Any]:
    """``ray.init`` keyword arguments: connect to ``address`` (else ``$RAY_ADDRESS``) when one is given, otherwise
    start a local Ray with ``workers`` CPUs and no dashboard.  Bad ``workers`` raises ``ValueError``."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers={workers!r} is invalid; valid: an integer >= 1")
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        return {"address": address, "log_to_driver": False}
    return {"address": "local", "num_cpus": workers, "include_dashboard": False, "log_to_driver": False}


@contextlib.contextmanager
def ray_session(workers: int, address: str | None = None, **init_kwargs: Any) -> Iterator[Any]:
    """Yield the ``ray`` module with a connection open; shut down only what this call started or connected.

    ``init_kwargs`` go to ``ray.init`` as well (e.g. ``runtime_env``)."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    options = init_options(workers, address)
    if options["address"] == "local":
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    start_ray(ray, options, init_kwargs)
    try:
        yield ray
    finally:
        ray.shutdown()


def start_ray(ray: Any, options: dict[str, Any], init_kwargs: dict[str, Any]) -> None:
    """``ray.init``.  A local start that fails is tried once more: the raylet gives its Python agents a fixed 15 s
    to report their ports (``WaitForPersistedPort`` in Ray's ``src/ray/util/port_persistence.h``) and aborts the
    node otherwise, which happens on an overloaded machine; a second failure raises :class:`RayStartError`."""
    attempts = LOCAL_START_ATTEMPTS if options["address"] == "local" else 1
    for attempt in range(1, attempts + 1):
        try:
            ray.init(**options, **init_kwargs)
            return
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception on a start-up timeout
            ray.shutdown()
            if attempt == attempts and attempts > 1:
                raise RayStartError(f"could not start a local Ray ({_first_line(exc)}) in {attempts} attempts; "
                                    "on a busy machine start one with `ray start --head --num-cpus N` and set "
                                    "RAY_ADDRESS=auto, or use --engine local") from exc
            if attempt == attempts:
                raise
            warnings.warn(f"local Ray failed to start ({_first_line(exc)}); trying once more", stacklevel=4)


# ============================================================================================ the engine
def run_cells_on_ray(ray: Any, cells: list[Cell], progress: bool) -> list[dict[str, Any]]:
    """Submit every cell as one task (1 CPU, one retry) and collect the summaries in cell order."""
    from tqdm.auto import tqdm

    task = ray.remote(num_cpus=1, max_retries=CELL_RETRIES, retry_exceptions=[CellFailed])(attempt_cell)
    pending = {task.remote(cell.config, cell.out_dir): i for i, cell in enumerate(cells)}
    results: list[dict[str, Any]] = [{} for _ in cells]
    bar = tqdm(total=len(cells), disable=not progress, unit="cell", dynamic_ncols=True)
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            i = pending.pop(ref)
            results[i] = collect(ray, ref, cells[i])
            bar.update(1)
    bar.close()
    return results


def collect(ray: Any, ref: Any, cell: Cell) -> dict[str, Any]:
    """The summary of a finished task; a cell that failed on its last attempt is returned (and recorded) failed."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, CellFailed):
            return exc.cause.summary
        return record_failure(cell, _first_line(exc.cause if exc.cause is not None else exc))
    except ray.exceptions.RayError as exc:  # the worker process died on every attempt, the task was lost, ...
        return record_failure(cell, _first_line(exc))


def record_failure(cell: Cell, error: str) -> dict[str, Any]:
    """Write ``summary.json`` status ``failed`` for a cell that could not record its own failure."""
    from offpolicylab.runs import RunDir

    run = RunDir(cell.out_dir)
    Path(cell.out_dir).mkdir(parents=True, exist_ok=True)
    previous = run.read_summary()
    if previous is not None:  # the cell wrote its own summary before its worker was lost
        return previous
    return run.write_summary("failed", error=error)


def ray_engine(cells: list[Cell], workers: int, progress: bool) -> list[dict[str, Any]]:
    """The ``ray`` sweep engine: :func:`run_cells_on_ray` inside a :func:`ray_session` (see the module text)."""
    with ray_session(workers) as ray:
        return run_cells_on_ray(ray, cells, progress)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


register_engine(ENGINE_NAME, ray_engine)
