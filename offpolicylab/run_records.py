"""Finished (or interrupted) run directories and sweep folders read back: :func:`load_run` / :func:`load_runs` give
:class:`RunRecord` records (config, metrics as a DataFrame, events, summary, sample files, sweep labels) for plots,
the demo figure, paper figures and experiments; the files and their writer are :mod:`offpolicylab.run_dir`'s.
"""

from __future__ import annotations

import csv
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from offpolicylab.grid import expand_grid, load_grid
from offpolicylab.run_dir import (
    GRID_FILE,
    SAMPLE_PREFIX,
    SWEEP_RESULTS,
    RunDir,
    RunError,
    error_reason,
    read_table,
)

if TYPE_CHECKING:
    import pandas as pd


# -------------------------------------------------------------------------------------------- reading finished runs


@dataclass
class RunRecord:
    """One finished (or interrupted) run directory, read back: its config, metrics (a DataFrame, one row per
    update), events, summary (None while running), sample files, and ``labels``, the axis labels of its sweep cell
    (``{}`` outside a sweep).  ``label`` is the legend label a figure shows (see :mod:`offpolicylab.plots`)."""

    path: Path
    config: dict[str, Any]
    metrics: pd.DataFrame
    events: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    sample_files: list[Path] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    label: str = ""

    @property
    def objective(self) -> str:
        return str(self.config.get("objective", "unknown"))

    @property
    def schedule(self) -> str:
        """The schedule as its command-line spelling (``on_policy``, ``stale_k:256``, ...)."""
        return str(self.config.get("schedule", "on_policy"))

    @property
    def seed(self) -> int:
        return int(self.config.get("seed", 0))

    def collapse_updates(self) -> list[int]:
        """Updates at which a ``collapse`` event was recorded."""
        return [int(e["update"]) for e in self.events if e.get("event") == "collapse"]


def is_run_dir(path: str | Path) -> bool:
    return RunDir(path).config_path.is_file() and RunDir(path).metrics_path.is_file()


def find_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Each path that is a run directory, or every run directory below it (a sweep folder)."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if is_run_dir(path):
            found.append(path)
        elif path.is_dir():
            found.extend(sorted(p.parent for p in path.rglob("metrics.csv") if is_run_dir(p.parent)))
        else:
            raise ValueError(f"{path} does not exist; give run directories or folders that contain them")
    return found


def load_run(path: str | Path, labels: dict[str, str] | None = None) -> RunRecord:
    """Read one run directory; ``config.json`` and ``metrics.csv`` are required, the rest optional.  ``labels``
    default to the run's sweep-cell labels when its parent folder holds the sweep's grid file."""

    run = RunDir(path)
    if not is_run_dir(run.path):
        raise ValueError(f"{run.path} is not a run directory: it needs config.json and metrics.csv")
    config = checked_fields(run.config_path, run.read_config())
    metrics = read_metrics_frame(run.metrics_path)
    samples = sorted(run.samples_dir.glob(f"{SAMPLE_PREFIX}*.npz")) if run.samples_dir.is_dir() else []
    if labels is None:
        labels = sweep_labels(run.path.parent).get(run.path.name, {})
    return RunRecord(run.path, config, metrics, run.read_events(), run.read_summary(), samples, dict(labels))


def read_metrics_frame(path: Path) -> pd.DataFrame:
    """metrics.csv as a DataFrame of numbers, one row per update; a damaged file (not UTF-8, empty, not CSV, no
    ``update`` column, a value that is not a number) raises :class:`RunError` naming the file (and line)."""
    import pandas as pd

    header, rows = read_table(path)
    metrics = pd.DataFrame(rows, columns=header).replace({"": None, "True": "1", "False": "0"})
    for key in metrics.columns:
        numbers = pd.to_numeric(metrics[key], errors="coerce")
        bad = numbers.isna() & metrics[key].notna() & (metrics[key].str.lower() != "nan")
        if bad.any():
            index = int(bad.to_numpy().nonzero()[0][0])
            raise RunError(f"{path}:{index + 2}: {key}={str(metrics[key].iloc[index])!r} is not a number; the metrics "
                           "file is damaged")
        metrics[key] = numbers
    if metrics["update"].isna().any():
        raise RunError(f"{path}: a row has no update number; the metrics file is damaged")
    return metrics





#: config.json fields that readers of a finished run use, with what each must be.
READ_FIELDS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "objective": (str, "a string"), "schedule": (str, "a string"), "seed": (int, "an integer"),
    "objective_params": (dict, "a mapping"), "world": (str, "a string"), "policy": (str, "a string"),
}


def checked_fields(path: Path, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` after checking the types of the fields in :data:`READ_FIELDS` it holds (``RunError`` naming the
    file and the field otherwise)."""
    for key, (kind, text) in READ_FIELDS.items():
        value = config.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise RunError(f"{path}: {key}={value!r} is invalid; valid: {text} (the config file is damaged)")
    return config


def load_runs(paths: Iterable[str | Path]) -> list[RunRecord]:
    """Every run directory found under ``paths`` (see :func:`find_run_dirs`), with its sweep labels."""
    dirs = find_run_dirs(paths)
    if not dirs:
        raise ValueError("no run directories (config.json + metrics.csv) found under the given paths")
    by_sweep = {parent: sweep_labels(parent) for parent in {d.parent for d in dirs}}
    return [load_run(d, by_sweep[d.parent].get(d.name, {})) for d in dirs]


def read_grid(sweep_dir: str | Path) -> dict[str, Any] | None:
    """The grid file a sweep in ``sweep_dir`` ran (validated as ``offpolicylab sweep`` does), or None without one."""
    grid_path = Path(sweep_dir) / GRID_FILE
    return load_grid(grid_path) if grid_path.is_file() else None


def sweep_labels(sweep_dir: str | Path) -> dict[str, dict[str, str]]:
    """{cell directory name: its axis labels} of the sweep whose grid file is in ``sweep_dir`` ({} without one)."""
    grid = read_grid(sweep_dir)
    return {} if grid is None else {cell.name: cell.labels for cell in expand_grid(grid, sweep_dir)}


def load_samples(path: str | Path) -> dict[str, np.ndarray]:
    """Arrays of one ``samples/update_XXXXXX.npz`` file (never unpickled)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files} if isinstance(data, np.lib.npyio.NpzFile) else None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        why = ("not an .npz archive; reading it would mean unpickling, which is never done" if "pickle" in str(exc)
               else error_reason(exc))
        raise RunError(f"{path} cannot be read as the arrays a run writes ({why}); the sample file is damaged"
                       ) from None
    if arrays is None:
        raise RunError(f"{path} is a single .npy array, not the .npz archive a run writes; the sample file is damaged")
    for key, array in arrays.items():
        if array.dtype.kind not in "biuf":
            raise RunError(f"{path}: array {key!r} holds {array.dtype} values, not numbers; the sample file is damaged")
    if "log_ratio" in arrays and "advantage" in arrays and arrays["log_ratio"].size != arrays["advantage"].size:
        raise RunError(f"{path}: log_ratio has {arrays['log_ratio'].size} values but advantage "
                       f"{arrays['advantage'].size}; the sample file is damaged")
    return arrays


def sample_update(path: str | Path) -> int:
    """The update number of a sample file ``update_000123.npz``."""
    stem = Path(path).stem
    number = stem.removeprefix(SAMPLE_PREFIX)
    if not stem.startswith(SAMPLE_PREFIX) or not number.isdigit():
        raise ValueError(f"sample file {path} has no update number in its name (expected update_XXXXXX.npz)")
    return int(number)


def read_sweep_results(sweep_dir: str | Path) -> list[dict[str, str]]:
    """The rows of a sweep's ``sweep_results.csv`` (strings, as written)."""
    path = Path(sweep_dir) / SWEEP_RESULTS
    if not path.is_file():
        raise ValueError(f"{sweep_dir} holds no {SWEEP_RESULTS}; run the sweep first")
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))

