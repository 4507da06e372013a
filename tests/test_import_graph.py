"""No import circle of any kind in the package: every ``import`` statement of every module — at module level, inside
functions and under ``TYPE_CHECKING`` alike, relative ones resolved — is an edge of the module graph, and the graph
has no strongly connected component of more than one module.  (import-linter's layers see only imports between
layers; a function-local import inside one layer hides a circle from it.)"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

import offpolicylab

ROOT = Path(offpolicylab.__file__).resolve().parent


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (a package is its ``__init__``)."""
    names = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` (at ``path``) imports anywhere in its source: ``import a.b`` and
    ``from a import b`` name the most specific module that exists (a.b when it is a module, else a)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> nx.DiGraph:
    modules = module_names()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        graph.add_edges_from((name, target) for target in imported(name, path, modules))
    return graph


def test_the_graph_sees_function_local_and_relative_imports(tmp_path: Path) -> None:
    """The parser itself: a function-local import and a relative one are edges."""
    modules = {"pkg": tmp_path / "__init__.py", "pkg.a": tmp_path / "a.py", "pkg.b": tmp_path / "b.py"}
    modules["pkg.a"].write_text("def f():\n    from pkg.b import g\n    return g\n")
    modules["pkg.b"].write_text("from . import a\nfrom .a import f\n")
    assert imported("pkg.a", modules["pkg.a"], modules) == {"pkg.b"}
    assert imported("pkg.b", modules["pkg.b"], modules) == {"pkg.a"}


def test_no_import_circle() -> None:
    graph = import_graph()
    assert graph.number_of_nodes() > 50 and graph.number_of_edges() > 100  # the whole package was read
    circles = [sorted(component) for component in nx.strongly_connected_components(graph) if len(component) > 1]
    assert not circles, "import circles (function-local imports included): " + "; ".join(
        " <-> ".join(circle) for circle in circles)
