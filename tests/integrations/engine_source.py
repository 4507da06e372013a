"""Import an engine's module from its installed distribution without running the ``__init__`` of the packages
above it: SkyRL's and OpenRLHF's package ``__init__`` files import their whole training stack (SkyRL's pydantic
models need Python ≥ 3.12, OpenRLHF's actor needs ``flash_attn``), while the correction and loss modules need only
torch and a few small packages.  The module itself, and every module it imports, runs unchanged from the installed
files."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import types
from pathlib import Path

import pytest


def installed(distribution: str, version: str) -> None:
    """Skip unless ``distribution`` is installed at ``version`` (the pin of ``.ci/run``'s engine environment)."""
    try:
        found = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{distribution} is not installed (it runs in the engine environment of .ci/run)",
                    allow_module_level=True)
    if found != version:
        pytest.skip(f"{distribution} {found} is installed; these values are pinned to {version}", allow_module_level=True)


def bare_module(name: str) -> types.ModuleType:
    """Module ``name`` (dotted) imported with its parent packages created empty (their ``__init__`` not run)."""
    if name in sys.modules:
        return sys.modules[name]
    parts = name.split(".")
    top = importlib.util.find_spec(parts[0])
    assert top is not None and top.submodule_search_locations, parts[0]
    path = Path(list(top.submodule_search_locations)[0])
    for depth in range(1, len(parts)):
        package = ".".join(parts[:depth])
        if package not in sys.modules:
            spec = importlib.machinery.ModuleSpec(package, None, is_package=True)
            spec.submodule_search_locations = [str(path)]
            module = importlib.util.module_from_spec(spec)
            sys.modules[package] = module
        path = path / parts[depth]
    return importlib.import_module(name)
