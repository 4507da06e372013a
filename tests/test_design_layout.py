"""docs/design.md is the tree: every module of the package is named on it (its Layout lists the top-level modules,
and one line per module inside the subpackages), so a newcomer finds each file's job in one place."""

from __future__ import annotations

from pathlib import Path

import offpolicylab

PACKAGE = Path(offpolicylab.__file__).parent
DESIGN = PACKAGE.parent / "docs" / "design.md"


def test_every_module_is_named_in_the_design_page() -> None:
    text = DESIGN.read_text()
    modules = [path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
               if path.name != "__main__.py" and not (path.name == "__init__.py" and path.parent == PACKAGE)]
    named = [module for module in modules
             if (f"offpolicylab/{module}" in text if "/" not in module else module in text)]
    assert sorted(set(modules) - set(named)) == []
    assert len(modules) > 80  # the walk found the package, not an empty folder
