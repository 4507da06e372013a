"""A test-only world ``flaky_bandit``: the 3-arm pitfall bandit whose construction fails its first ``fail_times``
attempts (raising, or killing its worker process).  Each attempt is counted in ``counter_file`` (outside the cell directory, which a retry deletes), so a test
can tell how many times a cell was tried.  Registered in Ray workers through ``runtime_env``'s
``worker_process_setup_hook`` (:func:`register`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

WORLD = "flaky_bandit"


def flaky_bandit(counter_file: str, fail_times: int, crash: bool) -> Any:
    """Fail (raise, or with ``crash`` kill the worker process) while the attempt number is <= ``fail_times``."""
    from offpolicylab.worlds import make_world

    path = Path(counter_file)
    attempt = (int(path.read_text()) if path.exists() else 0) + 1
    path.write_text(str(attempt))
    if attempt <= fail_times and crash:
        os._exit(3)
    if attempt <= fail_times:
        raise RuntimeError(f"injected failure on attempt {attempt}")
    return make_world("three_arm_pitfall")


def register() -> None:
    from offpolicylab import worlds
    from offpolicylab.registry import Param

    if WORLD not in worlds.list_worlds():
        worlds.register_world(WORLD, flaky_bandit, {"counter_file": Param("", str), "fail_times": Param(0, int, low=0),
                                                  "crash": Param(False, bool)},
                           doc="test only: three_arm_pitfall that fails its first fail_times builds")


def attempts(counter_file: str | Path) -> int:
    path = Path(counter_file)
    return int(path.read_text()) if path.exists() else 0
