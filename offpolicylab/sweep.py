"""Grids of runs: a JSON grid file → cells → one run directory per cell, on a local process pool (or another engine).

Grid file::

    {
      "base": {"world": "token_mdp", "world_params": {"family": "target"}, "updates": 150},
      "axes": {
        "objective": [
          {"label": "grpo", "objective": "grpo", "objective_params": {"eps_low": 0.2, "eps_high": 0.2}},
          {"label": "grpo_no_tr", "objective": "grpo", "objective_params": {"eps_low": "inf", "eps_high": "inf"}},
          "m2po"
        ],
        "schedule": ["on_policy", "stale_k:16"],
        "seed": [0, 1, 2]
      }
    }

Every axis value is either a scalar (it sets the config field named like the axis) or a mapping of config
overrides with an optional ``label`` (mapping-valued fields such as ``world_params`` are merged into the base).
The cell directory is named from the labels: ``objective=grpo__schedule=stale_k-16__seed=0``.  Cells run in
separate processes; a failing cell is recorded (``summary.json`` status ``failed`` with the error) and the others
finish; re-running skips cells that completed or collapsed and resumes interrupted ones.  ``sweep_results.csv``
gets one row per cell: its axis labels, status, peak and final reward / exact return and the collapse update.

Engines live in the :data:`ENGINES` registry: ``local`` (``concurrent.futures.ProcessPoolExecutor``, spawn
context) and ``ray`` (:mod:`offpolicylab.sweep_ray`, registered when first asked for).  An engine is
``fn(cells: list[Cell], workers: int, progress: bool) -> list[dict]`` that calls :func:`run_cell` on each cell.
"""

from __future__ import annotations

import concurrent.futures as futures
import importlib
import itertools
import json
import multiprocessing
import re
import shutil
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from offpolicylab.config import TrainConfig
from offpolicylab.registry import Registry
from offpolicylab.runs import write_grid, write_sweep_results

RESULT_KEYS = ("status", "updates_done", "peak_reward_mean", "final_reward_mean", "peak_exact_return",
               "final_exact_return", "optimal_return", "collapse_update", "error")
_DONE = ("completed", "collapsed")


@dataclass(frozen=True)
class Cell:
    """One grid cell: its name (directory), axis labels, full config mapping and run directory."""

    name: str
    labels: dict[str, str]
    config: dict[str, Any]
    out_dir: str


# ============================================================================================ grid → cells
def load_grid(path: str | Path) -> dict[str, Any]:
    try:
        grid = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"grid file {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"grid file {path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(grid, dict) or set(grid) - {"base", "axes"}:
        raise ValueError(f"grid file {path} must be an object with keys base and axes")
    return grid


def expand_grid(grid: dict[str, Any], out_dir: str | Path) -> list[Cell]:
    """The Cartesian product of the axes.  Field names and scalar ranges are checked here (bad → ValueError);
    names of objectives / worlds / schedules are checked when the cell runs, so a bad one fails only its cells."""
    base = dict(grid.get("base", {}))
    axes = grid.get("axes", {})
    if not isinstance(axes, dict) or not all(isinstance(v, list) and v for v in axes.values()):
        raise ValueError("grid axes must map an axis name to a non-empty list of values")
    options = [[_axis_value(name, value) for value in values] for name, values in axes.items()]
    cells = []
    for combo in itertools.product(*options) if options else [()]:
        config = json.loads(json.dumps(base))
        labels = {}
        for name, (label, overrides) in zip(axes, combo, strict=True):
            labels[name] = label
            _merge(config, overrides)
        TrainConfig.from_dict(config)  # validates field names and scalar ranges
        cell_name = "__".join(f"{k}={v}" for k, v in labels.items()) or "cell"
        cells.append(Cell(cell_name, labels, config, str(Path(out_dir) / cell_name)))
    names = [c.name for c in cells]
    if len(set(names)) != len(names):
        raise ValueError("grid cells have duplicate names; give distinct 'label's to axis values")
    return cells


def _axis_value(axis: str, value: Any) -> tuple[str, dict[str, Any]]:
    if isinstance(value, dict):
        overrides = {k: v for k, v in value.items() if k != "label"}
        label = value.get("label") or "_".join(_short(v) for v in overrides.values())
        return _safe(str(label)), overrides
    return _safe(_short(value)), {axis: value}


def _merge(config: dict[str, Any], overrides: dict[str, Any]) -> None:
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return "_".join(f"{k}{_short(v)}" for k, v in value.items())
    return str(value)


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=+-]", "-", text).strip("-") or "x"


# ============================================================================================ one cell
def run_cell(cell_config: dict[str, Any], out_dir: str) -> dict[str, Any]:
    """Run (or skip, or resume) one cell; never raises: a failure is recorded and returned as status ``failed``."""
    import torch

    from offpolicylab.runs import RunDir
    from offpolicylab.trainer import train

    torch.set_num_threads(1)
    run = RunDir(out_dir)
    previous = run.read_summary()
    if previous is not None and previous.get("status") in _DONE:
        return {**previous, "skipped": True}
    if previous is not None:  # a failed cell: start again from scratch
        shutil.rmtree(out_dir)
    try:
        config = TrainConfig.from_dict(cell_config)
        resume = run.holds_run() and run.read_summary() is None
        return train(config, out_dir, resume=resume)
    except Exception as exc:  # noqa: BLE001 - a cell failure must not stop the sweep
        error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        if run.read_summary() is None:
            run.write_summary("failed", error=error)
        (Path(out_dir) / "error.txt").write_text(traceback.format_exc())
        return {**(run.read_summary() or {}), "status": "failed", "error": error}


def _run_cell_args(cell: Cell) -> dict[str, Any]:
    return run_cell(cell.config, cell.out_dir)


# ============================================================================================ engines
Engine = Callable[[list[Cell], int, bool], list[dict[str, Any]]]
#: Engines that live in a module of their own, imported when first asked for (the module registers itself).
_ENGINE_MODULES = {"ray": "offpolicylab.sweep_ray"}


def _import_engine(name: str) -> None:
    if name in _ENGINE_MODULES:
        importlib.import_module(_ENGINE_MODULES[name])


ENGINES: Registry[Engine] = Registry("sweep engine", on_missing=_import_engine)


def register_engine(name: str, engine: Engine) -> None:
    """Add a sweep engine; a duplicate name raises ``ValueError``."""
    ENGINES.register(name, engine, {})


def get_engine(name: str) -> Engine:
    """The engine ``name``; an unknown name raises ``ValueError`` naming the valid ones."""
    return ENGINES.get(name).builder


def local_engine(cells: list[Cell], workers: int, progress: bool) -> list[dict[str, Any]]:
    """Cells on a ``ProcessPoolExecutor`` (spawn context, one torch thread per worker); results in cell order."""
    results: list[dict[str, Any] | None] = [None] * len(cells)
    bar = _bar(len(cells), progress)
    if workers <= 1:
        for i, cell in enumerate(cells):
            results[i] = _run_cell_args(cell)
            bar.update(1)
    else:
        context = multiprocessing.get_context("spawn")
        with futures.ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            pending = {pool.submit(_run_cell_args, cell): i for i, cell in enumerate(cells)}
            for future in futures.as_completed(pending):
                i = pending[future]
                try:
                    results[i] = future.result()
                except Exception as exc:  # noqa: BLE001 - a crashed worker process
                    results[i] = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
                bar.update(1)
    bar.close()
    return [r or {"status": "failed", "error": "no result"} for r in results]


register_engine("local", local_engine)


# ============================================================================================ the sweep
def run_sweep(grid: dict[str, Any], out_dir: str | Path, *, workers: int = 1, engine: str = "local",
              progress: bool = False) -> list[dict[str, Any]]:
    """Expand ``grid``, run every cell with ``engine``, write ``out_dir/sweep_results.csv``; returns its rows."""
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers={workers!r} is invalid; valid: an integer >= 1")
    run_engine = get_engine(engine)
    cells = expand_grid(grid, out_dir)
    write_grid(out_dir, grid)
    summaries = run_engine(cells, workers, progress)
    rows = [result_row(cell, summary) for cell, summary in zip(cells, summaries, strict=True)]
    write_sweep_results(out_dir, rows)
    return rows


def result_row(cell: Cell, summary: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"cell": cell.name, **cell.labels}
    for key in RESULT_KEYS:
        row[key] = summary.get(key, "")
    if row["collapse_update"] == -1:
        row["collapse_update"] = ""
    return row


def _bar(total: int, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=not enabled, unit="cell", dynamic_ncols=True)
