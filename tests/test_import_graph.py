"""The package's import graph has no circles: each module of gpuopt_ops imports only modules below it.

Read from the sources with `ast`, lazy imports inside functions included (a circle closed by a lazy import still
ties the modules together: neither can be read or moved without the other). Run as a script to print the graph's
circles: `python tests/test_import_graph.py [package_dir]`.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

# the package the tests import (the installed wheel's under scripts/run_tests.sh), found without importing it
PACKAGE = Path(importlib.util.find_spec("gpuopt_ops").origin).parent


def _module_name(path: Path, package_dir: Path) -> str:
    parts = path.relative_to(package_dir).with_suffix("").parts
    return ".".join(p for p in parts if p != "__init__") or "__init__"


def _imported(node: ast.AST, package: list[str], modules: set[str]) -> set[str]:
    """The package modules one import statement names (relative, or absolute `gpuopt_ops.`); `package` is the
    dotted path of the package the importing module sits in ([] at the top)."""
    if isinstance(node, ast.Import):
        return {a.name.removeprefix("gpuopt_ops.") for a in node.names} & modules
    if not isinstance(node, ast.ImportFrom):
        return set()
    if node.level:
        base = package[: len(package) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    elif node.module == "gpuopt_ops" or (node.module or "").startswith("gpuopt_ops."):
        prefix = node.module.removeprefix("gpuopt_ops").removeprefix(".")
    else:
        return set()
    names = set()
    for alias in node.names:  # `from . import ops` names a module; `from .ops import f` names ops
        candidate = f"{prefix}.{alias.name}" if prefix else alias.name
        names.add(candidate if candidate in modules else prefix)
    return names & modules


def import_graph(package_dir: Path = PACKAGE) -> dict[str, set[str]]:
    """{module: the package modules it imports anywhere in its source}, for every .py under package_dir (the
    Triton kernels' folder, loaded under the package name at run time, is not part of this package's tree)."""
    files = {_module_name(p, package_dir): p for p in sorted(package_dir.rglob("*.py"))}
    modules = set(files)
    graph = {}
    for name, path in files.items():
        package = [] if name == "__init__" else name.split(".")[: None if path.name == "__init__.py" else -1]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            found |= _imported(node, package, modules)
        graph[name] = found - {name, "__init__"}  # the package's own __init__ runs before any of its modules
    return graph


def circles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Every elementary circle of the graph, each once, starting at its smallest module name."""
    found = set()

    def walk(start: str, node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                found.add(tuple(path))
            elif nxt > start and nxt not in path:
                walk(start, nxt, path + [nxt])

    for start in sorted(graph):
        walk(start, start, [start])
    return sorted(found, key=lambda c: (len(c), c))


def test_the_package_has_no_import_circle():
    graph = import_graph()
    assert {"ops", "backends", "triton_ops", "autograd"} <= set(graph)  # the walk read the package
    assert "checks" in graph["ops"] and "autograd" in graph["triton_ops"]  # and saw its imports
    assert circles(graph) == []


def test_the_checker_finds_a_circle_closed_by_a_lazy_import(tmp_path):
    pkg = tmp_path / "gpuopt_ops"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text("def f():\n    from gpuopt_ops import a\n    return a\n")
    (pkg / "c.py").write_text("from . import a\n")
    assert circles(import_graph(pkg)) == [("a", "b")]


if __name__ == "__main__":
    found = circles(import_graph(Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE))
    for circle in found:
        print(" -> ".join((*circle, circle[0])))
    print(f"{len(found)} import circle(s)")
