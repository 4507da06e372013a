"""Grid files: a grid of runs → its cells, each a full run config with a directory name (docs/configs.md).

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
The cell directory is named from the labels: ``objective=grpo__schedule=stale_k-16__seed=0``, made of the
characters ``A-Z a-z 0-9 . _ = + -`` only (anything else becomes ``-``; a name longer than 200 characters is cut
and ends in a hash), so every cell lies directly under the output folder.  Pure: nothing here runs or writes; both
the sweep (:mod:`offpolicylab.sweep`) and the run-directory reader (:mod:`offpolicylab.run_records`) use it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from offpolicylab.config import TrainConfig, read_mapping

MAX_CELL_NAME = 200  # characters; file systems allow 255 bytes per name
MAX_CELLS = 100_000  # cells of one grid: each is a run directory (and a process task)


@dataclass(frozen=True)
class Cell:
    """One grid cell: its name (directory), axis labels, full config mapping and run directory."""

    name: str
    labels: dict[str, str]
    config: dict[str, Any]
    out_dir: str


# ============================================================================================ grid → cells
def load_grid(path: str | Path) -> dict[str, Any]:
    """The grid a YAML (``.yaml`` / ``.yml``) or JSON file holds (docs/configs.md): a mapping with keys ``base``
    and ``axes``."""
    grid = read_mapping(path, f"grid file {path}", "keys base and axes")
    if set(grid) - {"base", "axes"}:
        raise ValueError(f"grid file {path} must be an object with keys base and axes")
    return grid


def expand_grid(grid: dict[str, Any], out_dir: str | Path) -> list[Cell]:
    """The Cartesian product of the axes.  Field names and scalar ranges are checked here (bad → ValueError);
    names of objectives / worlds / schedules are checked when the cell runs, so a bad one fails only its cells."""
    base = grid.get("base", {})
    if not isinstance(base, dict):
        raise ValueError(f"grid base is a {type(base).__name__}; valid: a mapping of config fields")
    axes = grid.get("axes", {})
    if not isinstance(axes, dict) or not all(isinstance(v, list) and v for v in axes.values()):
        raise ValueError("grid axes must map an axis name to a non-empty list of values")
    count = math.prod(len(values) for values in axes.values())
    if count > MAX_CELLS:
        raise ValueError(f"the grid has {count:,} cells; valid: at most {MAX_CELLS:,} (split it into several grids)")
    options = [[_axis_value(name, value) for value in values] for name, values in axes.items()]
    cells = []
    for combo in itertools.product(*options) if options else [()]:
        config = json.loads(json.dumps(base))
        labels = {}
        for name, (label, overrides) in zip(axes, combo, strict=True):
            labels[name] = label
            _merge(config, overrides)
        TrainConfig.from_dict(config)  # validates field names and scalar ranges
        cell_name = _cell_name(labels)
        cells.append(Cell(cell_name, labels, config, str(_inside(Path(out_dir), cell_name))))
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


def _cell_name(labels: dict[str, str]) -> str:
    """``axis=label__axis=label``, each part made safe; cut to MAX_CELL_NAME characters (ending in a hash)."""
    name = "__".join(f"{_safe(axis)}={label}" for axis, label in labels.items()) or "cell"
    if len(name) > MAX_CELL_NAME:
        name = name[:MAX_CELL_NAME - 17] + "-" + hashlib.sha256(name.encode()).hexdigest()[:16]
    return name


def _inside(out: Path, name: str) -> Path:
    """``out / name``, which must be a direct child of ``out`` (never a path elsewhere)."""
    path = out / name
    if name in ("", ".", "..") or path.parent != out or os.sep in name:
        raise ValueError(f"grid cell name {name!r} is not a plain folder name")
    return path


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return "_".join(f"{k}{_short(v)}" for k, v in value.items())
    return str(value)


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=+-]", "-", text).strip("-") or "x"
