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
cell.  Only an infrastructure failure is retried: a cell whose worker process dies (or whose node is lost) is run
once more (``max_retries=1``, Ray's retry of system failures).  A cell that fails by itself (``run_cell`` returns
status ``failed``: an exception in the cell's own code, which is deterministic for its seeded config) is recorded
at once (``summary.json`` status ``failed`` with the error) and the other cells finish.  Re-running the sweep skips
cells that completed or collapsed, resumes interrupted ones and starts failed ones again.

Stopping: an interrupt of the driver (SIGINT, or SIGTERM through the CLI) cancels the pending tasks and force-kills
the running ones; a task on the driver's machine also exits by itself within a second once the driver process is
gone, even after a SIGKILL (:func:`offpolicylab.sweep.exit_with`).  A task on another node cannot watch the driver
and runs its cell to the end; the cell's lock keeps a re-run from writing it meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import socket
import warnings
from collections.abc import Iterator
from typing import Any

from offpolicylab.grid import Cell
from offpolicylab.sweep import exit_with, register_engine, run_cell

CELL_RETRIES = 1
LOCAL_START_ATTEMPTS = 2
ENGINE_NAME = "ray"


class RayStartError(RuntimeError):
    """A local Ray could not be started for the sweep."""


def attempt_cell(cell_config: dict[str, Any], out_dir: str, driver: tuple[str, int] | None = None) -> dict[str, Any]:
    """One attempt at a cell (the body of the Ray task): ``run_cell``.  ``driver`` = (host name, pid) of the
    sweep process: on that host the task exits once the driver is gone."""
    if driver is not None and driver[0] == socket.gethostname():
        exit_with(driver[1])
    return run_cell(cell_config, out_dir)


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

    ``init_kwargs`` go to ``ray.init`` as well (e.g. ``runtime_env``).  A cluster address is checked first
    (:func:`check_address`): one that cannot be reached raises ``ValueError`` within seconds instead of the minutes
    ``ray.init`` spends retrying."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    options = init_options(workers, address)
    if options["address"] == "local":
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    else:
        check_address(options["address"])
    try:
        start_ray(ray, options, init_kwargs)
    except ConnectionError as exc:  # e.g. "auto" with no Ray running on this machine
        raise ValueError(f"Ray address {options['address']!r} cannot be used ({_first_line(exc)}); "
                         f"{ADDRESS_VALID}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


ADDRESS_TIMEOUT = 5.0  # seconds to open a TCP connection to a cluster's address
ADDRESS_VALID = ("valid: the address of a running Ray cluster (HOST:PORT, ray://HOST:PORT or auto; `ray start "
                 "--head` prints it), or no --ray-address / RAY_ADDRESS for a local Ray")


def check_engine(workers: int) -> None:
    """The ``ray`` engine's check before a sweep writes anything: Ray is installed, ``workers`` is valid and a
    cluster address, when one is given, is reachable (:func:`check_address`)."""
    ray = import_ray()
    if ray.is_initialized():
        return
    address = init_options(workers)["address"]
    if address != "local":
        check_address(address)


def check_address(address: str, timeout: float = ADDRESS_TIMEOUT) -> None:
    """``ValueError`` unless ``address`` (``HOST:PORT``, ``ray://HOST:PORT``, or ``auto``: the cluster Ray finds on
    this machine) is well formed and a TCP connection to it opens within ``timeout`` seconds."""
    if address == "auto":
        address = _running_cluster()
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"Ray address {address!r} is malformed; {ADDRESS_VALID}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ValueError(f"Ray address {address!r} cannot be reached within {timeout:g} s ({reason}); "
                         f"{ADDRESS_VALID}") from None


def _running_cluster() -> str:
    """The address ``auto`` stands for (Ray's own lookup of a cluster started on this machine)."""
    from ray._private.services import canonicalize_bootstrap_address

    try:
        found = canonicalize_bootstrap_address("auto")
    except ConnectionError as exc:
        raise ValueError(f"Ray address 'auto' finds no running Ray on this machine ({_first_line(exc)}); "
                         f"{ADDRESS_VALID}") from None
    if not found:
        raise ValueError(f"Ray address 'auto' finds no running Ray on this machine; {ADDRESS_VALID}")
    return str(found)


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
def run_cells_on_ray(ray: Any, cells: list[Cell], progress: bool | str) -> list[dict[str, Any]]:
    """Submit every cell as one task (1 CPU, one retry) and collect the summaries in cell order."""
    from offpolicylab.progress import SweepProgress
    from offpolicylab.sweep import cell_progress

    task = ray.remote(num_cpus=1, max_retries=CELL_RETRIES, retry_exceptions=False)(attempt_cell)
    driver = (socket.gethostname(), os.getpid())
    pending = {task.remote(cell.config, cell.out_dir, driver): i for i, cell in enumerate(cells)}
    results: list[dict[str, Any]] = [{} for _ in cells]
    bar = SweepProgress(len(cells), progress, **cell_progress(cells))
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                i = pending.pop(ref)
                results[i] = collect(ray, ref, cells[i])
                bar.finished([results[i]], running=len(pending))  # submitted, not finished (queued included)
    except BaseException:  # an interrupt: stop every task of this sweep before leaving
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    bar.close()
    return results


def collect(ray: Any, ref: Any, cell: Cell) -> dict[str, Any]:
    """The summary of a finished task; a cell that failed on its last attempt is returned (and recorded) failed."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        return record_failure(cell, _first_line(exc.cause if exc.cause is not None else exc))
    except ray.exceptions.RayError as exc:  # the worker process died on every attempt, the task was lost, ...
        return record_failure(cell, _first_line(exc))


def record_failure(cell: Cell, error: str) -> dict[str, Any]:
    """Write ``summary.json`` status ``failed`` for a cell that could not record its own failure."""
    from offpolicylab.run_dir import RunDir, RunLocked

    run = RunDir(cell.out_dir)
    try:
        with run.locked():
            previous = run.read_summary()
            if previous is not None:  # the cell wrote its own summary before its worker was lost
                return previous
            return run.write_summary("failed", error=error)
    except RunLocked as exc:  # a worker that survived still writes the cell: leave it alone
        return {"status": "failed", "error": f"{error} ({exc})"}


def ray_engine(cells: list[Cell], workers: int, progress: bool) -> list[dict[str, Any]]:
    """The ``ray`` sweep engine: :func:`run_cells_on_ray` inside a :func:`ray_session` (see the module text)."""
    with ray_session(workers) as ray:
        return run_cells_on_ray(ray, cells, progress)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


register_engine(ENGINE_NAME, ray_engine, check=check_engine)
