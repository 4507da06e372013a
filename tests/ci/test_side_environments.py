"""Every test that only runs beside an engine (verl's side environment, the engine environment of AReaL, OpenRLHF
and SkyRL) is named in .ci/run's command for that environment: in the main environment it skips, so a file left out
of .ci/run would never run anywhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def named_in(environment: str) -> set[str]:
    """The test files .ci/run passes to ``ENVIRONMENT/bin/python -m pytest``."""
    script = (ROOT / ".ci" / "run").read_text()
    lines = [line for line in script.splitlines() if line.startswith(f"{environment}/bin/python -m pytest")]
    return {name for line in lines for name in re.findall(r"tests/\S+\.py", line)}


def test_every_verl_test_runs_in_verls_environment() -> None:
    files = {path.relative_to(ROOT).as_posix() for path in (ROOT / "tests" / "integrations").glob("test_verl*.py")}
    assert files and files <= named_in(".ci-verl")


def test_every_engine_test_runs_in_the_engine_environment() -> None:
    files = {path.relative_to(ROOT).as_posix() for path in (ROOT / "tests" / "integrations").glob("test_*_engine.py")}
    assert files and files <= named_in(".ci-engines")
