"""``.ci/layer_env.py``: the verl side environment sees the packages of the environment ``.ci/run`` was started
from — a virtual environment too, which ``venv --system-site-packages`` would not give — and its own packages win."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def make_venv(python: str | Path, where: Path) -> Path:
    subprocess.run([str(python), "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    return where / "bin" / "python"


def site_packages(env: Path) -> Path:
    (found,) = {p.resolve() for p in env.glob("lib*/python*/site-packages")}
    return found


def test_side_environment_layers_over_an_active_virtual_environment(tmp_path: Path) -> None:
    outer_python = make_venv(sys.executable, tmp_path / "outer")
    (site_packages(tmp_path / "outer") / "only_in_outer.py").write_text("WHERE = 'outer'\n")
    (site_packages(tmp_path / "outer") / "in_both.py").write_text("WHERE = 'outer'\n")
    side_python = make_venv(outer_python, tmp_path / "side")
    (site_packages(tmp_path / "side") / "in_both.py").write_text("WHERE = 'side'\n")

    done = subprocess.run([str(outer_python), str(ROOT / ".ci" / "layer_env.py"), str(tmp_path / "side")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    probe = subprocess.run([str(side_python), "-c", "import only_in_outer, in_both;"
                            " print(only_in_outer.WHERE, in_both.WHERE)"],
                           capture_output=True, text=True, timeout=60)
    assert probe.stdout.split() == ["outer", "side"], probe.stderr


def test_side_environment_from_a_bare_interpreter_sees_its_packages(tmp_path: Path) -> None:
    """From the interpreter running the tests (bare or not): pytest, installed there, is importable on the side."""
    side_python = make_venv(sys.executable, tmp_path / "side")
    done = subprocess.run([sys.executable, str(ROOT / ".ci" / "layer_env.py"), str(tmp_path / "side")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    probe = subprocess.run([str(side_python), "-c", "import pytest, numpy; print('ok')"], capture_output=True,
                           text=True, timeout=120)
    assert probe.stdout.strip() == "ok", probe.stderr


def test_a_folder_that_is_no_venv_is_refused(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / ".ci" / "layer_env.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "expected one venv" in done.stderr
