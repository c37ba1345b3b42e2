"""The grader's own look at a hand-in's code, decided in the grader before anything of it runs.

The notebook's check cell reads only the code between the markers of the answer it is given;
a hand-in could put its loop in a helper cell, add a second pair of markers, or change what
the check reads. Here the grader reads every cell that runs (`impala_lab_grader.notebook.
code_cells`, the very code the sandbox then runs) and decides:

- **the markers**: exactly one well-formed pair in the whole notebook (one line that is the
  start marker, then one that is the end marker, in one cell before the check), or the
  hand-in fails and says so;
- **what the student wrote**: the code between the markers, and every line of every other
  cell that is not the handed-out notebook's (`student_lines`: a cell as handed out counts
  as none, an edited one by the lines that differ, a new one in full);
- **the names and the rule**: on those lines, the checkers' own rules
  (`impala_lab.classroom.exercises._static.scan` with the exercise's `Spec`: the library's
  implementation, the challenge's rule, its recursion over all cells together, and a ``no
  base class`` rule on every statement that binds the answer's name), and what only the
  grader must stop: code it cannot read (`UNREADABLE`) and a look at the checker's frames or
  objects (`INTROSPECTION`), read with import aliases resolved (`grader_keys`).

The handed-out notebook is the exercise's stub from the installed course
(`impala_lab.classroom.course.course_root`).
"""

from __future__ import annotations

import ast
import difflib
from typing import Any

import impala_lab.classroom.exercises as exercises
from impala_lab.classroom.course import course_root
from impala_lab.classroom.exercises._common import MARK_END, MARK_START
from impala_lab.classroom.exercises._static import (
    RECURSION,
    Hit,
    Rule,
    broken,
    describe,
    imported,
    keys,
    recursive,
    scan,
    table,
)
from impala_lab_grader.child import spec_of
from impala_lab_grader.notebook import code_cells, normalised, read_notebook, source

# A look at the checker's frames or objects.
INTROSPECTION = {
    "_getframe": "reads the call stack (sys._getframe)",
    "currentframe": "reads the call stack (inspect.currentframe)",
    "getouterframes": "reads the call stack (inspect.getouterframes)",
    "inspect.stack": "reads the call stack (inspect.stack)",
    "inspect.trace": "reads the call stack (inspect.trace)",
    "f_back": "reads the call stack (frame.f_back)",
    "f_locals": "reads another frame's variables (f_locals)",
    "f_globals": "reads another frame's variables (f_globals)",
    "get_referrers": "searches the checker's objects (gc.get_referrers)",
    "get_objects": "searches the checker's objects (gc.get_objects)",
}

_FROM_TEXT = "runs code from a string"
_BUILT_NAME = "reaches a name built at run time"
_LOADS = "loads or starts code by hand"
# Code whose text the grader cannot read: strings run as code, names built at run time, code
# objects (they run as functions without any source), modules loaded and processes started.
UNREADABLE = {
    **dict.fromkeys(("exec", "eval", "compile", "__import__", "breakpoint"), _FROM_TEXT),
    **dict.fromkeys(("getattr", "setattr", "delattr", "globals", "locals", "vars",
                     "__dict__", "__builtins__", "__getattribute__", "__code__", "__globals__",
                     "__closure__", "__subclasses__", "__bases__", "__mro__", "__loader__",
                     "__spec__", "__reduce__", "__reduce_ex__", "operator.attrgetter",
                     "operator.methodcaller"), _BUILT_NAME),
    **dict.fromkeys(("CodeType", "FunctionType", "LambdaType", "f_code", "gi_code", "cr_code",
                     "ag_code", "co_code", "kw:co_code"), _FROM_TEXT),
    **{f"module:{name}": _LOADS for name in (
        "importlib", "runpy", "timeit", "code", "codeop", "pickle", "marshal", "copyreg",
        "shelve", "dill", "cloudpickle", "joblib", "ctypes", "cffi", "subprocess",
        "multiprocessing", "multiprocess", "pty", "gc", "inspect", "builtins", "pdb", "bdb",
        "cProfile", "profile", "trace", "doctest", "imp", "zipimport", "pkgutil", "site")},
    **dict.fromkeys(("sys.modules", "sys.path", "sys.meta_path", "sys.path_hooks",
                     "sys.settrace", "sys.setprofile", "kw:allow_pickle", "kw:safe_mode",
                     "asyncio.create_subprocess_exec", "asyncio.create_subprocess_shell"),
                    _LOADS),
    **dict.fromkeys((f"os.{f}" for f in (
        "system", "popen", "posix_spawn", "posix_spawnp", "execl", "execle",
        "execlp", "execlpe", "execv", "execve", "execvp", "execvpe", "spawnl", "spawnle",
        "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe")), _LOADS),
}
_UNREADABLE_HINT = ("the check decides from the code it reads: write names and code out (no "
                    "exec, eval or compile, no getattr with a built name, no importlib, "
                    "pickle or subprocess).")

_PHRASES = ("YOUR CODE STARTS HERE", "YOUR CODE ENDS HERE")
_PAIRED = 0.5  # an edited cell is the handed-out cell it resembles at least this much
_DIFFED = 400  # lines: a longer cell is all the student's (a diff of it would take long)


def markers(nb: dict[str, Any], cells: list[tuple[int, str]]) -> tuple[int, int, int] | str:
    """(cell number, start line, end line) of the one pair of markers (0-based lines in the
    cell's normalised code), or why there is not exactly one well-formed pair."""
    found: dict[str, list[tuple[int, int, str]]] = {p: [] for p in _PHRASES}
    code = [c for c in nb["cells"] if c.get("cell_type") == "code"]
    for number, cell in enumerate(code, start=1):
        for i, line in enumerate(normalised(source(cell)).splitlines()):
            for phrase in _PHRASES:
                if phrase in line.upper():
                    found[phrase].append((number, i, line.strip()))
    starts, ends = found[_PHRASES[0]], found[_PHRASES[1]]
    problem = ""
    if len(starts) != 1 or len(ends) != 1:
        problem = f"found {len(starts)} start and {len(ends)} end marker lines"
    elif starts[0][2] != MARK_START or ends[0][2] != MARK_END:
        problem = "a marker line is not the marker as handed out"
    elif starts[0][0] != ends[0][0] or starts[0][1] >= ends[0][1]:
        problem = "the end marker does not follow the start marker in the same cell"
    elif starts[0][0] not in {n for n, _ in cells}:
        problem = "the markers are not in a cell before the check cell"
    if problem:
        return (f"needs exactly one pair of the exercise's markers, in the answer's cell: one "
                f"line `{MARK_START}`, then one line `{MARK_END}` ({problem}): put them back "
                f"as the notebook had them")
    return starts[0][0], starts[0][1], ends[0][1]


def _changed(template: list[str], lines: list[str]) -> set[int]:
    """The 1-based numbers of `lines` that are not `template`'s (a diff of stripped lines;
    all of them when either side is longer than `_DIFFED`)."""
    if max(len(template), len(lines)) > _DIFFED:
        return set(range(1, len(lines) + 1))
    matcher = difflib.SequenceMatcher(None, [t.strip() for t in template],
                                      [ln.strip() for ln in lines], autojunk=False)
    same = {b + k + 1 for _, b, size in matcher.get_matching_blocks() for k in range(size)}
    return set(range(1, len(lines) + 1)) - same


def _outside(lines: list[str], start: int, end: int) -> tuple[list[str], list[int]]:
    """The lines outside the markers (markers included), and their 1-based numbers."""
    keep = [*range(start + 1), *range(end, len(lines))]
    return [lines[i] for i in keep], [i + 1 for i in keep]


def student_lines(cells: list[tuple[int, str]], template: list[tuple[int, str]],
                  mark: tuple[int, int, int]) -> dict[int, set[int]]:
    """Cell number -> the lines the student wrote (1-based), see the module docstring."""
    number, start, end = mark
    pool = [t.splitlines() for _, t in template if MARK_START not in t]
    stub = next((t.splitlines() for _, t in template if MARK_START in t), [])
    out: dict[int, set[int]] = {}
    for n, text in cells:
        lines = text.splitlines()
        if n == number:
            s = next((i for i, ln in enumerate(stub) if ln.strip() == MARK_START), 0)
            e = next((i for i, ln in enumerate(stub) if ln.strip() == MARK_END), len(stub))
            mine, at = _outside(lines, start, end)
            theirs, _ = _outside(stub, s, e)
            out[n] = set(range(start + 2, end + 1)) | {at[i - 1] for i in _changed(theirs,
                                                                                  mine)}
            continue
        stripped = [ln.strip() for ln in lines]
        same = next((k for k, t in enumerate(pool) if [x.strip() for x in t] == stripped), None)
        if same is not None:
            pool.pop(same)
            out[n] = set()
            continue
        ratios = [difflib.SequenceMatcher(None, [x.strip() for x in t], stripped,
                                          autojunk=False).ratio()
                  if len(lines) <= _DIFFED else 0.0 for t in pool]
        best = max(range(len(pool)), key=ratios.__getitem__, default=None)
        if best is not None and ratios[best] >= _PAIRED:
            out[n] = _changed(pool.pop(best), lines)
        else:
            out[n] = set(range(1, len(lines) + 1))
    return out


def _binds(node: ast.AST, name: str) -> bool:
    """Whether `node` binds `name` other than by a plain class statement."""
    if isinstance(node, ast.Name):
        return node.id == name and isinstance(node.ctx, ast.Store | ast.Del)
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return node.name == name
    if isinstance(node, ast.ClassDef):
        return node.name == name and bool(node.bases or node.keywords or node.decorator_list)
    if isinstance(node, ast.Import | ast.ImportFrom):
        return any((a.asname or a.name.split(".")[0]) == name for a in node.names)
    return False


def _plain_class(trees: list[tuple[int, ast.Module]], answer: str, rule: Rule,
                 where: str) -> str | None:
    for number, tree in trees:
        for node in ast.walk(tree):
            if _binds(node, answer):
                what = (f"{answer} is not a plain class statement" if not isinstance(
                    node, ast.ClassDef) else f"{answer}'s class statement has a base class, "
                    f"a keyword (a metaclass) or a decorator")
                code = ast.unparse(node).splitlines()[0][:60]
                return broken(rule, f"{what} (`{code}`, code cell {number} of {where}, line "
                                    f"{node.lineno})")
    return None


def aliases(tree: ast.AST) -> dict[str, str]:
    """The names that `tree`'s imports bind, mapped to what they stand for (``np`` ->
    ``numpy``, ``import_module`` -> ``importlib.import_module``)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else \
                    a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _dotted(node: ast.AST, imports: dict[str, str]) -> str | None:
    """``a.b.c`` with the root resolved through `imports` (None: not a plain dotted name)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([imports.get(node.id, node.id), *reversed(parts)])


def _literal_getattrs(tree: ast.AST) -> set[int]:
    """The ``getattr``/``hasattr`` names of calls whose attribute is a literal name."""
    return {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr")
            and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant)
            and isinstance(n.args[1].value, str) and n.args[1].value.isidentifier()}


def grader_keys(node: ast.AST, imports: dict[str, str], literal: set[int]) -> list[str]:
    """`keys`, and the keys only the grader's tables use: a whole dotted expression, as
    written and with the import aliases `imports` resolved (``"sys.modules"``); an import of
    module NAME and every use of a name it binds (``"module:NAME"``); a keyword argument
    (``"kw:NAME"``). A ``getattr(x, "name")`` or ``hasattr`` call whose function is in
    `literal` (`_literal_getattrs`) reads as ``x.name``."""
    if id(node) in literal:
        return []
    if isinstance(node, ast.Call) and id(node.func) in literal:
        node = ast.Attribute(node.args[0], node.args[1].value, ast.Load())
    if isinstance(node, ast.Name):
        return keys(node) + ([f"module:{imports[node.id]}"] if node.id in imports else [])
    if isinstance(node, ast.Attribute):
        root = _dotted(node.value, imports)
        return [f"{ast.unparse(node.value)}.{node.attr}", *keys(node)] + (
            [f"{root}.{node.attr}"] if root else [])
    if isinstance(node, ast.Import | ast.ImportFrom):
        full = [imported(node, a) for a in node.names]
        return keys(node) + full + [f"module:{'.'.join(name.split('.')[:k])}" for name in full
                                    for k in range(1, name.count(".") + 2)]
    if isinstance(node, ast.keyword) and node.arg:
        return [f"kw:{node.arg}"]
    return keys(node)


def _scan(tree: ast.Module, names: dict[str, tuple[str, str]], rule: Rule | None,
          imports: dict[str, str]) -> list[Hit]:
    """`scan` with `grader_keys`; unreadable code is shown with its call."""
    literal = _literal_getattrs(tree)
    hits = scan(tree, names, rule, lambda node: grader_keys(node, imports, literal))
    called = {id(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return [Hit(called.get(id(h.node), h.node), h.what, h.kind) if h.kind == "unreadable"
            else h for h in hits]


def static_verdict(ex: exercises.Exercise, nb: dict[str, Any], name: str) -> str | None:
    """The grader's static verdict on a hand-in (see the module docstring): what the answer
    did that no answer may do, as the checkers word it after the answer's name, or None.

    Args:
      ex: the exercise (`impala_lab_grader.notebook.exercise_of`).
      nb: the hand-in's notebook JSON.
      name: the notebook's file name as messages show it.
    """
    cells = code_cells(nb)
    mark = markers(nb, cells)
    if isinstance(mark, str):
        return mark
    trees = []
    for number, text in cells:
        try:
            trees.append((number, ast.parse(text)))
        except SyntaxError as exc:
            return (f"has code that is not Python in code cell {number} of {name} (line "
                    f"{exc.lineno}: {exc.msg})")
    spec = spec_of(ex)
    template = code_cells(read_notebook(course_root() / "exercises" / ex.notebook))
    mine = student_lines(cells, template, mark)
    imports: dict[str, str] = {}
    for _, tree in trees:
        imports.update(aliases(tree))
    names = {**{k: ("unreadable", v) for k, v in UNREADABLE.items()},
             **{k: ("forbidden", v) for k, v in INTROSPECTION.items()},
             **table(spec.forbidden, spec.rule)}
    hits: list[tuple[int, Hit]] = []
    for number, tree in trees:
        hits += [(number, h) for h in _scan(tree, names, spec.rule, imports)
                 if h.line in mine[number]]
    if spec.rule is not None and spec.rule.recursion:  # across cells: a helper may recurse
        home = {id(node): n for n, tree in trees for node in ast.walk(tree)}
        whole = ast.Module(body=[s for _, tree in trees for s in tree.body], type_ignores=[])
        hits += [(home[id(node)], Hit(node, RECURSION)) for node in recursive(whole)
                 if node.lineno in mine[home[id(node)]]]
    if hits:
        number, first = min(hits, key=lambda p: (p[0], p[1].line, p[1].col))
        text = describe(first, f"code cell {number} of {name}", first.line, spec.rule)
        return text + (f"\n  hint:     {_UNREADABLE_HINT}" if first.kind == "unreadable" else "")
    if spec.rule is not None and spec.rule.plain_class:
        return _plain_class(trees, ex.answer, spec.rule, name)
    return None
