"""The package's layers (pyproject.toml, ``[tool.importlinter]``; docs/design.md, "Layout"): every module imports
only from the layers below it, so no import circle can form between layers.  Checked by import-linter's own
command, function-level imports included."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_layers_hold() -> None:
    command = shutil.which("lint-imports") or pytest.fail("import-linter is not installed (the test extra has it)")
    done = subprocess.run([command, str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": str(Path(sys.executable).parent)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 kept, 0 broken" in done.stdout


def test_a_broken_layer_is_caught(tmp_path: Path) -> None:
    """The check is not vacuous: a copy of the contract in which the trainer sits below the run directories'
    module fails, naming the import that breaks it (the trainer imports run_dir)."""
    config = (ROOT / "pyproject.toml").read_text()
    swapped = (config.replace('  "offpolicylab.trainer",\n', "  TRAINER\n")
               .replace('  "offpolicylab.run_dir",\n', '  "offpolicylab.trainer",\n')
               .replace("  TRAINER\n", '  "offpolicylab.run_dir",\n'))
    assert swapped != config
    (tmp_path / "pyproject.toml").write_text(swapped)
    command = shutil.which("lint-imports") or pytest.fail("import-linter is not installed (the test extra has it)")
    done = subprocess.run([command, str(tmp_path / "pyproject.toml")], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": str(Path(sys.executable).parent)})
    assert done.returncode != 0 and "offpolicylab.trainer is not allowed to import offpolicylab.run_dir" in done.stdout
