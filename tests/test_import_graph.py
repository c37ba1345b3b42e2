"""The house keeps its shape: folders import only what their job needs, no circles, small rooms.

The graph is read from the source with ``ast``: every ``import`` and ``from ... import`` of an
impala_lab module, at module level, inside a function or under ``if TYPE_CHECKING:`` (a circle
that only type checkers follow is still a circle a reader has to untangle). Importing a module
also runs its packages' ``__init__``: those count as imports too.

The rules (DESIGN.md's table of folders):

| folder | may import |
| --- | --- |
| top (`config`, `batch`, `errors`, `stats`, ...) | the top alone |
| `actor/` | the top, `envs/` (`make_env`) and itself; never TensorFlow or Keras, at any depth |
| `envs/` | the top and itself; never TensorFlow or Keras, at any depth |
| `learner/` | the top and itself: never `actor/` (its peer) or a backend |
| `speed/` | the top, `learner/` and itself: the door behind which the speed measures live |
| `backends/` | the top, `actor/`, `envs/` and itself |
| `dashboard/` | the top, `envs/` and itself: it reads ``stats()`` and history, never a stage |
| `driver/` | everything but `cli/` and `classroom/` (`speed/` included: it builds the learner) |
| `cli/`, `classroom/` | everything |
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "impala_lab"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
# V-trace's and validate's length is their documentation and their checks, one per field.
LONG_FUNCTIONS_EXEMPT = {"impala_lab.learner.vtrace", "impala_lab.learner.vtrace_reference"}
LONG_FUNCTION_NAMES_EXEMPT = {"validate"}
MAX_LONG_FUNCTIONS = 3

FOLDERS = ("actor", "learner", "driver", "backends", "dashboard", "envs", "classroom", "cli",
           "speed")
MAY_IMPORT = {
    "top": {"top"},
    "actor": {"top", "envs", "actor"},  # envs/: how a worker makes its envs (make_env)
    "envs": {"top", "envs"},
    "learner": {"top", "learner"},
    "speed": {"top", "learner", "speed"},
    "backends": {"top", "actor", "envs", "backends"},
    "dashboard": {"top", "envs", "dashboard"},
    "driver": {"top", "actor", "envs", "learner", "backends", "dashboard", "driver", "speed"},
    "cli": {"top", *FOLDERS},
    "classroom": {"top", *FOLDERS},
}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _imported_names(mod: str, path: Path, mods: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(the impala_lab modules ``mod`` imports, the top-level names of everything it imports)."""
    tree = ast.parse(path.read_text())
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    found, roots = set(), set()
    for node in ast.walk(tree):
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
            roots.add(name.split(".")[0])
            while name and name not in mods:
                name = name.rpartition(".")[0]
            if name and name != mod:
                found.add(name)
    return found, roots


def _imports(mod: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """What importing ``mod`` runs of impala_lab: its imports and each one's packages."""
    found, _ = _imported_names(mod, path, mods)
    with_packages = set(found)
    for name in found:
        parts = name.split(".")
        with_packages.update(".".join(parts[:i]) for i in range(1, len(parts)))
    with_packages.discard(mod)
    return {m for m in with_packages if m in mods and not mod.startswith(m + ".")}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {mod: _imports(mod, path, mods) for mod, path in mods.items()}


def _folder(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in FOLDERS) else "top"


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


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
    graph = _graph()
    assert "impala_lab.backends.base" in graph["impala_lab.backends.process"]  # edges found
    # Only the package's front door may import what imports the package (it is run first).
    without_front_door = {m: edges - {"impala_lab"} for m, edges in graph.items()}
    assert _circles(without_front_door) == []


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]


def test_type_checking_imports_count_as_edges(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from impala_lab.driver.impala import Impala\n")
    mods = {"impala_lab.x.m": source, "impala_lab.driver.impala": source,
            "impala_lab.driver": source, "impala_lab": source, "impala_lab.x": source}
    assert "impala_lab.driver.impala" in _imports("impala_lab.x.m", source, mods)


def test_each_folder_imports_only_what_its_job_needs():
    wrong = []
    for mod, edges in _graph().items():
        if mod == "impala_lab":  # the front door re-exports from every folder, lazily
            continue
        allowed = MAY_IMPORT[_folder(mod)]
        wrong += [f"{mod} -> {m}" for m in sorted(edges)
                  if m != "impala_lab" and _folder(m) not in allowed]
    assert wrong == [], "imports across the house's walls:\n" + "\n".join(wrong)


def test_nothing_an_actor_imports_imports_tensorflow():
    graph, mods = _graph(), _modules()
    actor_side = {m for m in mods if _folder(m) in ("actor", "envs")}
    actor_side |= {"impala_lab.backends.worker_process", "impala_lab.backends.shared_weights"}
    heavy = {}
    for mod in sorted(actor_side):
        for reached in sorted({mod} | _reachable(graph, mod)):
            _, roots = _imported_names(reached, mods[reached], mods)
            if roots & {"tensorflow", "keras"}:
                heavy.setdefault(mod, []).append(reached)
    assert heavy == {}, f"actor-side modules reach TensorFlow: {heavy}"


def test_the_learner_imports_no_backend():
    graph = _graph()
    for mod in graph:
        if _folder(mod) == "learner":
            reached = _reachable(graph, mod)
            assert not {m for m in reached if _folder(m) == "backends"}, mod


def test_no_module_is_over_500_lines():
    # The rule holds for the tests and the benches as well as the package.
    paths = [*_modules().values(), *sorted(PACKAGE.parent.glob("tests/*.py")),
             *sorted(PACKAGE.parent.glob("bench/*.py"))]  # not bench/.peers-venv
    assert len(paths) > len(_modules())
    long = {str(path.relative_to(PACKAGE.parent)): n for path in paths
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"split these rooms (over {MAX_MODULE_LINES} lines): {long}"


def _long_functions() -> list[str]:
    found = []
    for mod, path in _modules().items():
        if mod in LONG_FUNCTIONS_EXEMPT:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                    and node.name not in LONG_FUNCTION_NAMES_EXEMPT
                    and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES):
                found.append(f"{mod}.{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    return found


def test_at_most_three_functions_are_over_60_lines():
    long = _long_functions()
    assert len(long) <= MAX_LONG_FUNCTIONS, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_folders_match_the_docs_table():
    table = (Path(__file__).resolve().parents[1] / "docs" / "map.md").read_text()
    for folder in FOLDERS:
        assert re.search(rf"`impala_lab/{folder}/`", table), f"docs/map.md lacks {folder}/"
