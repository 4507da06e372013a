"""Grids of runs: a grid file (YAML or JSON, docs/configs.md) → cells → one run directory per cell, on a local process pool (or another engine).

The grid file and its cells: :mod:`offpolicylab.grid`.  Cells run in
worker processes, the cells of a tabular or GRU configuration that differ only in seed and objective together as
one batched task (:func:`seed_groups`; each writes the run directory it writes alone); a failing cell is recorded
(``summary.json`` status ``failed`` with the error) and the others finish.  ``sweep_results.csv`` gets one row per cell: its axis labels, status, peak and final reward / exact
return and the collapse update.

Re-running a sweep into the same folder reuses a cell that completed or collapsed, and resumes an interrupted one,
only when the config it was run with (its ``config.json``) is identical to the config the grid now gives; a cell
whose config changed makes the sweep refuse with one line before anything runs, unless ``rerun_changed``
(``--rerun-changed``) starts such cells again.  Failed cells are started again.  A changed grid file is recorded as
``grid.json`` and the previous one kept as ``grid.previous-N.json``.  Cell directory names are made of the
characters ``A-Z a-z 0-9 . _ = + -`` only (anything else becomes ``-``; a name longer than 200 characters is cut
and ends in a hash), so every cell lies directly under the output folder; a cell is only ever deleted file by file,
and only the files a run writes (:meth:`~offpolicylab.run_dir.RunDir.clear`).

Stopping: SIGINT / SIGTERM to the sweep process terminate its worker processes (whose runs stay resumable), and a
worker whose sweep process died (even by SIGKILL) exits by itself within a second; each run directory is locked by
the one process writing it (:meth:`~offpolicylab.run_dir.RunDir.locked`), so a re-run cannot race with a survivor,
and the output folder by the one sweep process writing it (:func:`sweep_locked`, ``OUT/.sweep.lock``): a second
sweep into the same folder is refused before it writes anything.

Engines live in the :data:`ENGINES` registry: ``local`` (``concurrent.futures.ProcessPoolExecutor``, spawn
context) and ``ray`` (:mod:`offpolicylab.sweep_ray`, registered when first asked for).  An engine is
``fn(cells: list[Cell], workers: int, progress) -> list[dict]`` that calls :func:`run_cell` on each cell; ``progress``
is ``"bar"`` (a terminal), ``"lines"`` (from the first second: updates done with an ETA, read from the cells'
metrics.csv, and ``sweep: 3/12 cells done, 2 running, 1 failed`` as cells finish) or False
(:class:`~offpolicylab.progress.SweepProgress`, given the cells by :func:`cell_progress`).
"""

from __future__ import annotations

import concurrent.futures as futures
import contextlib
import importlib
import json
import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from offpolicylab.batched import MEMBER_FIELDS, train_together
from offpolicylab.config import TrainConfig, upgrade_config
from offpolicylab.grid import Cell, expand_grid
from offpolicylab.lifecycle import resolve_config
from offpolicylab.locations import output_folder, process_alive
from offpolicylab.policies import policy_ability
from offpolicylab.registry import Registry
from offpolicylab.resume import config_changes
from offpolicylab.run_dir import RunDir, RunError, RunLocked, take_lock, write_grid, write_sweep_results
from offpolicylab.trainer import train

#: sweep_results.csv's columns after the cell's axes: the summary.json keys of the same names (docs/metrics.md)
RESULT_KEYS = ("status", "updates_done", "peak_reward", "final_reward", "peak_reward_mean", "final_reward_mean",
               "peak_exact_return", "final_exact_return", "optimal_return", "peak_eval_reward_sampled",
               "final_eval_reward_sampled", "collapse_update", "error")
_DONE = ("completed", "collapsed")
EXIT_ORPHANED = 3  # exit status of a worker whose sweep process is gone


# ============================================================================================ one cell
def run_cell(cell_config: dict[str, Any], out_dir: str) -> dict[str, Any]:
    """Run (or skip, or resume) one cell; never raises: a failure is recorded and returned as status ``failed``.
    A cell that another process is writing is left alone (returned ``failed`` with the reason)."""
    import torch


    torch.set_num_threads(1)
    run = RunDir(out_dir)
    previous = run.read_summary()
    if previous is not None and previous.get("status") in _DONE:
        return {**previous, "skipped": True}
    try:
        with run.locked():
            return _run_locked(run, cell_config, train)
    except RunLocked as exc:  # a survivor of an earlier sweep still writes this cell: touch nothing
        return {"status": "failed", "error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - a cell failure must not stop the sweep
        return {"status": "failed", "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}


def _run_locked(run: Any, cell_config: dict[str, Any], train: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """The body of :func:`run_cell`, holding the cell's lock: start a failed cell again, else run or resume."""
    try:
        if run.read_summary() is not None:  # a failed cell: start again from scratch
            run.clear()
        config = TrainConfig.from_dict(cell_config)
        return train(config, run.path, resume=run.holds_run())
    except Exception as exc:  # noqa: BLE001 - a cell failure must not stop the sweep
        error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if run.read_summary() is None:
            run.write_summary("failed", error=error)
        (run.path / "error.txt").write_text(traceback.format_exc())
        return {**(run.read_summary() or {}), "status": "failed", "error": error}


def changed_cells(cells: list[Cell]) -> dict[str, str]:
    """{cell name: what differs} for cells whose directory holds a run (not a failed one) of another config than
    the cell's resolved config."""
    changed = {}
    for cell in cells:
        run = RunDir(cell.out_dir)
        summary = run.read_summary()
        if not run.config_path.exists() or (summary is not None and summary.get("status") == "failed"):
            continue
        try:
            stored = upgrade_config(run.read_config())  # earlier versions' keys renamed
        except RunError:
            changed[cell.name] = "config.json unreadable"
            continue
        try:
            resolved = resolve_config(TrainConfig.from_dict(cell.config))
        except ValueError:  # a bad objective fails the cell when it runs
            changed[cell.name] = "the config is invalid now"
            continue
        keys = config_changes(stored, resolved)  # a changed report_to is no other config
        if keys:
            changed[cell.name] = ", ".join(keys) + " differ"
    return changed


def seed_groups(cells: list[Cell]) -> list[list[int]]:
    """Indices of the cells that train together: cells of a policy that batches runs
    (registry metadata ``stack_in_sweeps``) share a group with the cells of their configuration that differ only in
    :data:`~offpolicylab.batched.MEMBER_FIELDS` (seed, objective and its parameters); every other cell is a
    group of its own.  Groups keep the cells' order."""
    groups: dict[str, list[int]] = {}
    for index, cell in enumerate(cells):
        config = TrainConfig.from_dict(cell.config)
        stackable = policy_ability(config.policy, "stack_in_sweeps", False) and not config.dynamic_sampling
        rest = {key: value for key, value in cell.config.items() if key not in MEMBER_FIELDS}
        key = json.dumps(rest, sort_keys=True, default=str) if stackable else f"cell {index}"
        groups.setdefault(key, []).append(index)
    return list(groups.values())


def run_seed_group(cells: list[Cell]) -> list[dict[str, Any]]:
    """The cells of one :func:`seed_groups` group: cells already done are skipped; when every other cell is new,
    they train together (:func:`offpolicylab.batched.train_together`: each writes the run directory it writes
    alone); otherwise (a cell to resume or to start again, or configurations that cannot be built) each runs on its
    own (:func:`run_cell`).  Never raises."""
    import torch


    results: list[dict[str, Any] | None] = [None] * len(cells)
    todo = []
    for index, cell in enumerate(cells):
        previous = RunDir(cell.out_dir).read_summary()
        if previous is not None and previous.get("status") in _DONE:
            results[index] = {**previous, "skipped": True}
        else:
            todo.append(index)
    if len(todo) > 1 and not any(RunDir(cells[i].out_dir).holds_run() for i in todo):
        torch.set_num_threads(1)
        try:
            configs = [TrainConfig.from_dict(cells[i].config) for i in todo]
            summaries = train_together(configs, [cells[i].out_dir for i in todo])
        except Exception:  # noqa: BLE001 - a cell failure must not stop the sweep
            summaries = [RunDir(cells[i].out_dir).read_summary() for i in todo]  # "failed" once training began
        for index, summary in zip(todo, summaries, strict=True):
            results[index] = summary
        todo = [i for i in todo if results[i] is None]  # refused before writing: each cell records why alone
    for index in todo:
        results[index] = run_cell(cells[index].config, cells[index].out_dir)
    return [r or {"status": "failed", "error": "no result"} for r in results]


# ============================================================================================ engines
Engine = Callable[[list[Cell], int, bool], list[dict[str, Any]]]
#: Engines that live in a module of their own, imported when first asked for (the module registers itself).
_ENGINE_MODULES = {"ray": "offpolicylab.sweep_ray"}


def _import_engine(name: str) -> None:
    if name in _ENGINE_MODULES:
        importlib.import_module(_ENGINE_MODULES[name])


ENGINES: Registry[Engine] = Registry("sweep engine", on_missing=_import_engine)


def register_engine(name: str, engine: Engine, check: Callable[[int], None] | None = None) -> None:
    """Add a sweep engine; a duplicate name raises ``ValueError``.  ``check(workers)``, when given, raises
    ``ValueError`` when the engine cannot run (e.g. an unreachable cluster); the sweep calls it before it writes
    anything."""
    ENGINES.register(name, engine, {}, check=check)


def check_engine(name: str, workers: int) -> Engine:
    """The engine ``name``, after its own check (:func:`register_engine`) for ``workers`` workers."""
    entry = ENGINES.get(name)
    if entry.meta.get("check") is not None:
        entry.meta["check"](workers)
    return entry.builder


def get_engine(name: str) -> Engine:
    """The engine ``name``; an unknown name raises ``ValueError`` naming the valid ones."""
    return ENGINES.get(name).builder


def local_engine(cells: list[Cell], workers: int, progress: bool | str) -> list[dict[str, Any]]:
    """Cells on a ``ProcessPoolExecutor`` (spawn context, one torch thread per worker); results in cell order.
    The cells that differ only in seed and objective form one task (:func:`seed_groups`, :func:`run_seed_group`).
    An interrupt (SIGINT, or SIGTERM turned into one by the CLI) terminates the workers before it propagates."""
    from offpolicylab.progress import SweepProgress

    results: list[dict[str, Any] | None] = [None] * len(cells)
    bar = SweepProgress(len(cells), progress, **cell_progress(cells))
    groups = seed_groups(cells)
    if workers <= 1:
        for index, group in enumerate(groups):
            for i, result in zip(group, run_seed_group([cells[i] for i in group]), strict=True):
                results[i] = result
            bar.finished([results[i] for i in group], running=len(groups[index + 1]) if index + 1 < len(groups)
                         else 0)
    else:
        context = multiprocessing.get_context("spawn")
        pool = futures.ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_worker_init,
                                           initargs=(os.getpid(),))
        try:
            pending = {pool.submit(run_seed_group, [cells[i] for i in group]): group for group in groups}
            for future in futures.as_completed(pending):
                group = pending[future]
                try:
                    for i, result in zip(group, future.result(), strict=True):
                        results[i] = result
                except Exception as exc:  # noqa: BLE001 - a crashed worker process
                    for i in group:
                        results[i] = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
                running = sum(len(pending[f]) for f in pending if f.running() and not f.done())
                bar.finished([results[i] for i in group], running=running)
        except BaseException:
            stop_pool(pool)
            raise
        stop_pool(pool)  # every result is in and the workers are idle: end them rather than wait for their teardown
    bar.close()
    return [r or {"status": "failed", "error": "no result"} for r in results]


def cell_progress(cells: list[Cell]) -> dict[str, Any]:
    """What :class:`~offpolicylab.progress.SweepProgress` watches for updates done: the cells' run directories and
    update counts (a cell whose config cannot be built counts 1 update)."""
    updates = []
    for cell in cells:
        try:
            updates.append(TrainConfig.from_dict(cell.config).updates)
        except ValueError:
            updates.append(1)
    return {"run_dirs": [cell.out_dir for cell in cells], "updates": updates}


def stop_pool(pool: futures.ProcessPoolExecutor) -> None:
    """Terminate a pool's worker processes and wait for them (their runs stay resumable: checkpoints are atomic
    and each run's lock dies with its process).  The executor has no public handle on its processes."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        process.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.join(timeout=10)


def _worker_init(driver: int) -> None:
    """A pool worker: ignore SIGINT (a terminal's Ctrl-C reaches the whole group; the driver stops the pool) and
    exit when the driver is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with(driver)


def exit_with(pid: int, period: float = 0.5) -> threading.Thread:
    """Start a daemon thread that ends this process (``os._exit(EXIT_ORPHANED)``) once process ``pid`` on this
    machine has ended, however it ended (SIGKILL included): a worker must not outlive the sweep that started it.
    When ``pid`` has already ended, this process ends at once, before the caller touches anything."""

    def watch() -> None:
        while _alive(pid):
            time.sleep(period)
        os._exit(EXIT_ORPHANED)

    if not _alive(pid):  # already gone (e.g. a retry started after the sweep was killed): touch nothing
        os._exit(EXIT_ORPHANED)

    thread = threading.Thread(target=watch, name="exit-with-driver", daemon=True)
    thread.start()
    return thread


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie counts as ended); this worker's parent always does."""
    return os.getppid() == pid or process_alive(pid)


register_engine("local", local_engine)


# ============================================================================================ the sweep
def run_sweep(grid: dict[str, Any], out_dir: str | Path, *, workers: int = 1, engine: str = "local",
              progress: bool | str = False, rerun_changed: bool = False) -> list[dict[str, Any]]:
    """Expand ``grid``, run every cell with ``engine``, write ``out_dir/sweep_results.csv``; returns its rows.

    Cells whose stored config differs from the grid's raise ``ValueError`` before anything runs, unless
    ``rerun_changed`` (they are then cleared and run again)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers={workers!r} is invalid; valid: an integer >= 1")
    run_engine = check_engine(engine, workers)
    out = output_folder(out_dir)
    cells = expand_grid(grid, out)
    check_sweep_free(out)
    changed = changed_cells(cells)
    if changed and not rerun_changed:
        name, why = next(iter(changed.items()))
        raise ValueError(f"{len(changed)} cell(s) in {out} were run with another config than the grid now gives "
                         f"({name}: {why}); pass --rerun-changed to run them again, or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    with sweep_locked(out):  # one sweep per folder: grid.json and sweep_results.csv describe the same grid
        write_grid(out, grid)
        for cell in cells:
            if cell.name in changed:
                run = RunDir(cell.out_dir)
                with run.locked():
                    run.clear()
        summaries = run_engine(cells, workers, progress)
        rows = [result_row(cell, summary) for cell, summary in zip(cells, summaries, strict=True)]
        write_sweep_results(out, rows)
    return rows


SWEEP_LOCK = ".sweep.lock"


class SweepLocked(RunError):
    """Another process runs a sweep into the same folder."""


def check_sweep_free(out: Path) -> None:
    """Refuse, without creating anything, a folder another sweep holds (what :func:`sweep_locked` would refuse)."""
    if (out / SWEEP_LOCK).is_file():
        with sweep_locked(out):
            pass


@contextlib.contextmanager
def sweep_locked(out: Path) -> Iterator[None]:
    """Hold ``out/.sweep.lock`` (``fcntl.flock``; the OS drops it when the process ends, however it ends): a second
    sweep into ``out`` gets :class:`SweepLocked` at once, before it writes anything."""
    fd = os.open(out / SWEEP_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        take_lock(fd, SweepLocked, f"sweep folder {out} is in use by another sweep")
        yield
    finally:
        os.close(fd)  # releases the lock




def result_row(cell: Cell, summary: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"cell": cell.name, **cell.labels}
    for key in RESULT_KEYS:
        row[key] = summary.get(key, "")
    if row["collapse_update"] in (-1, None):  # no collapse (-1: a summary of an earlier version)
        row["collapse_update"] = ""
    return row
