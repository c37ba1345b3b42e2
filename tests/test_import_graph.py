"""impala_lab's modules import each other without a circle.

The graph is read from the source with ``ast``: every ``import`` and ``from ... import`` of an
impala_lab module, at module level or inside a function, except those under
``if TYPE_CHECKING:`` (never run). A circle is a set of modules that reach each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "impala_lab"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _imports(mod: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The impala_lab modules ``mod`` imports (a name inside a module counts as the module)."""
    tree = ast.parse(path.read_text())
    skipped = {id(n) for node in ast.walk(tree)
               if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
               for n in ast.walk(node)}
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                     for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in mods:
                name = name.rpartition(".")[0]
            if name and name != mod:
                found.add(name)
    return found


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                circles.append(sorted([v, *component]))

    for v in graph:
        if v not in index:
            visit(v)
    return circles


def test_no_module_of_impala_lab_imports_itself_through_others():
    mods = _modules()
    graph = {mod: _imports(mod, path, mods) for mod, path in mods.items()}
    assert "impala_lab.backends.base" in graph["impala_lab.backends.process"]  # edges found
    assert _circles(graph) == []


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]


def test_base_imports_no_backend():
    mods = _modules()
    base = _imports("impala_lab.backends.base", mods["impala_lab.backends.base"], mods)
    assert not {m for m in base if m.startswith("impala_lab.backends")}
