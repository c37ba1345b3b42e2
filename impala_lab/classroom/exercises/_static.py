"""The static look at an answer's code: the names it must not use, and a challenge's rule.

Two readers share `scan`. A notebook's check cell reads the code between the markers of the
answer it is given (`flag_answer`, the source found as `inspect` finds it); the instructors'
grader (``impala_lab_grader``) reads every line of a hand-in that the student wrote, in every
cell, and decides its verdict with the same `scan`. What is flagged:

- the library's implementation of what the answer writes (`Spec.forbidden`, e.g. the name
  ``MinibatchBuffer``), and reading the checker's frames or objects (`INTROSPECTION`);
- code the reader cannot see (`UNREADABLE`): code run from a string, a name built at run
  time (``getattr(tf, "ker" + "as")``), modules loaded or processes started by hand;
- what a challenge's `Rule` forbids: a loop, an ``if``, a base class, a name.

A name matches as a variable or an attribute (``"MinibatchBuffer"``), only as an attribute
(``".step"``), as an imported name, or as a whole dotted expression with import aliases
resolved (``"sys.modules"``); ``"module:NAME"`` matches an import of module NAME and every
use of the name it binds.

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import textwrap
from dataclasses import dataclass, field
from typing import Any

from impala_lab.classroom.exercises._common import MARK_END, MARK_START, _cell_label


@dataclass(frozen=True)
class Rule:
    """A challenge's structural rule, checked on the code itself.

    Attributes:
      name: the rule in a few words, e.g. ``"no Python loop"``.
      hint: what the rule catches and the way round it (the message's ``hint:`` line).
      syntax: statements and expressions that break it, with what to call them, e.g.
        ``{ast.For: "a for loop"}`` (``ast.comprehension``: a comprehension with an ``if``).
      names: names that break it (matched as `Spec.forbidden` is), with what they do.
      recursion: a function that calls itself, directly or through others, breaks it
        (`recursive`).
      plain_class: the answer must be a ``class NAME:`` statement with no base class, no
        keyword (a metaclass) and no decorator.
    """

    name: str
    hint: str
    syntax: dict[type, str] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    recursion: bool = False
    plain_class: bool = False


@dataclass(frozen=True)
class Hit:
    """One flagged use: where (line and column in the scanned text), what it means, the code
    (one line, shortened) and its kind ("forbidden", "unreadable" or "rule")."""

    line: int
    col: int
    what: str
    code: str
    kind: str


# What no answer may do, whatever the exercise: read the checker's frames or objects.
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
# Code that the reader of the answer's text cannot see.
UNREADABLE = {
    **dict.fromkeys(("exec", "eval", "compile", "__import__", "breakpoint"), _FROM_TEXT),
    **dict.fromkeys(("getattr", "setattr", "delattr", "globals", "locals", "vars",
                     "__dict__", "__builtins__", "__getattribute__", "__code__", "__globals__",
                     "__closure__", "__subclasses__", "__bases__", "__mro__", "__loader__",
                     "__spec__", "__reduce__", "__reduce_ex__", "operator.attrgetter",
                     "operator.methodcaller"), _BUILT_NAME),
    # code objects, which run as functions without any source
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


def _dotted(node: ast.AST, names: dict[str, str]) -> str | None:
    """``a.b.c`` with the root resolved through `names` (None: not a plain dotted name)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([names.get(node.id, node.id), *reversed(parts)])


def _attr_keys(obj: ast.AST, attr: str, names: dict[str, str]) -> list[str]:
    keys = [f"{ast.unparse(obj)}.{attr}", "." + attr, attr]
    root = _dotted(obj, names)
    return keys + ([f"{root}.{attr}"] if root else [])


def _keys(node: ast.AST, names: dict[str, str], literal: set[int]) -> list[str]:
    """The keys a rule table can name `node` by (see the module docstring)."""
    if isinstance(node, ast.Name):
        if id(node) in literal:  # getattr(x, "name"): read as x.name
            return []
        return [node.id] + ([f"module:{names[node.id]}"] if node.id in names else [])
    if isinstance(node, ast.Attribute):
        return _attr_keys(node.value, node.attr, names)
    if isinstance(node, ast.Call) and id(node.func) in literal:
        return _attr_keys(node.args[0], node.args[1].value, names)
    if isinstance(node, ast.Import | ast.ImportFrom):
        module = (node.module or "") if isinstance(node, ast.ImportFrom) else ""
        keys = []
        for a in node.names:
            full = f"{module}.{a.name}" if module else a.name
            parts = full.split(".")
            keys += [full, *parts, *(f"module:{'.'.join(parts[:k])}" for k in
                                     range(1, len(parts) + 1))]
        return keys
    if isinstance(node, ast.keyword) and node.arg:
        return [f"kw:{node.arg}"]
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return [f"def:{node.name}"]
    return []


def _literal_getattrs(tree: ast.AST) -> set[int]:
    """The ``getattr``/``hasattr`` names of calls whose attribute is a literal string."""
    out = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str) and node.args[1].value.isidentifier()):
            out.add(id(node.func))
    return out


def _short(node: ast.AST) -> str:
    code = ast.unparse(node).splitlines()[0] if not isinstance(node, ast.keyword) else \
        f"{node.arg}=..."
    return code if len(code) <= 60 else code[:57] + "..."


RECURSION = "a function that calls itself (a loop too)"


def hit(node: ast.AST, what: str, kind: str = "rule") -> Hit:
    """A `Hit` at `node`."""
    return Hit(node.lineno, node.col_offset, what, _short(node), kind)


def recursive(tree: ast.AST) -> list[ast.AST]:
    """The definitions in `tree` of functions that call themselves, directly or through
    others (a rule's ``recursion``: a loop in disguise)."""
    defs: dict[str, ast.AST] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            defs[node.name] = node
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda):
            defs.update({t.id: node for t in node.targets if isinstance(t, ast.Name)})
    calls = {name: {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Name) and n.func.id in defs}
             for name, node in defs.items()}
    looped = _cyclic(calls)
    return [node for name, node in defs.items() if name in looped]


def _cyclic(graph: dict[str, set[str]]) -> set[str]:
    """The nodes of `graph` that lie on a cycle: Tarjan's strongly connected components,
    iterative (linear in the graph's size, whatever a hand-in defines)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: set[str] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)

    for root in graph:
        if root in index:
            continue
        visit(root)
        work = [(root, iter(graph[root]))]
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    visit(nxt)
                    work.append((nxt, iter(graph[nxt])))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    part = [stack.pop()]
                    while part[-1] != node:
                        part.append(stack.pop())
                    on_stack.difference_update(part)
                    if len(part) > 1 or node in graph[node]:
                        out.update(part)
    return out


def table(forbidden: dict[str, str], rule: Rule | None) -> dict[str, tuple[str, str]]:
    """Every name a scan flags: key -> (kind, what it means)."""
    out = {k: ("unreadable", v) for k, v in UNREADABLE.items()}
    out.update({k: ("forbidden", v) for k, v in INTROSPECTION.items()})
    out.update({k: ("forbidden", f"calls {v}") for k, v in forbidden.items()})
    if rule is not None:
        out.update({k: ("rule", v) for k, v in rule.names.items()})
    return out


def scan(tree: ast.AST, names: dict[str, tuple[str, str]], rule: Rule | None = None,
         imports: dict[str, str] | None = None) -> list[Hit]:
    """Every flagged use in `tree`, in the order of the text (a rule's recursion aside:
    `recursive`).

    Args:
      tree: the parsed code.
      names: `table`'s keys and what each means.
      rule: a challenge's rule (its syntax; its names are in `names`).
      imports: the import aliases in force (default: `tree`'s own, `aliases`).
    """
    imports = aliases(tree) if imports is None else imports
    literal = _literal_getattrs(tree)
    called = {id(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
    syntax = rule.syntax if rule is not None else {}
    hits = []
    for node in ast.walk(tree):
        for key in _keys(node, imports, literal):
            if key in names and hasattr(node, "lineno"):
                kind, what = names[key]  # code run or a name built: shown with its call
                shown = called.get(id(node), node) if kind == "unreadable" else node
                hits.append(hit(shown, what, kind))
                break
        kind_of = next((k for k in syntax if isinstance(node, k)), None)
        if kind_of is ast.comprehension and node.ifs:
            hits.append(Hit(node.ifs[0].lineno, node.ifs[0].col_offset, syntax[kind_of],
                            _short(node.ifs[0]), "rule"))
        elif kind_of is not None and kind_of is not ast.comprehension:
            hits.append(hit(node, syntax[kind_of]))
    return sorted(hits, key=lambda h: (h.line, h.col))


def describe(hit: Hit, where: str, line: int, rule: Rule | None) -> str:
    """The flag's text (after the answer's name): what, the code, where; a rule's or the
    unreadable code's own hint on a line of its own."""
    at = f"(`{hit.code}`, {where}, line {line})"
    if hit.kind == "rule" and rule is not None:
        return broken(rule, f"{hit.what} {at}")
    if hit.kind == "unreadable":
        return f"{hit.what} {at}\n  hint:     {_UNREADABLE_HINT}"
    return f"{hit.what} {at}"


def broken(rule: Rule, what: str) -> str:
    """A rule's message: the rule, what broke it and where, and its hint."""
    return f"breaks the challenge's rule \"{rule.name}\": {what}\n  hint:     {rule.hint}"


def regions(answer: Any) -> list[tuple[str, str, int]]:
    """The code between the markers in the answer's source: (text, filename, first line)."""
    fns = []
    if isinstance(answer, type):
        for value in vars(answer).values():
            value = getattr(value, "__func__", value)
            value = getattr(value, "fget", value)
            if inspect.isfunction(value):
                fns.append(value)
    elif inspect.isfunction(answer):
        fns.append(answer)
    out = []
    for fn in fns:
        try:
            lines, first = inspect.getsourcelines(fn)
        except (OSError, TypeError):
            continue
        # A marker comment less indented than the body falls outside the function's block:
        # read on in the file for it; a challenge's markers may enclose the whole method.
        whole = linecache.getlines(fn.__code__.co_filename)
        if whole and not any(ln.strip() == MARK_END for ln in lines):
            lines = whole[first - 1:]
        if whole and not any(ln.strip() == MARK_START for ln in lines):
            lines, first = whole, 1
        start = [i for i, ln in enumerate(lines) if ln.strip() == MARK_START]
        end = [i for i, ln in enumerate(lines) if ln.strip() == MARK_END]
        if len(start) == 1 and len(end) == 1 and start[0] < end[0]:
            region = textwrap.dedent("".join(lines[start[0] + 1:end[0]]))
            found = (region, fn.__code__.co_filename, first + start[0] + 1)
            if found not in out:
                out.append(found)
    return out


def _plain_class(answer: Any, rule: Rule) -> str | None:
    """The notebook's own look at a class answer (the grader reads its class statement)."""
    name = getattr(answer, "__name__", "the answer")
    bases = [c.__name__ for c in getattr(answer, "__mro__", ())[1:] if c is not object]
    if bases:
        return broken(rule, f"{name} subclasses {bases[0]} (its class statement)")
    if isinstance(answer, type) and type(answer) is not type:
        return broken(rule, f"{name} has the metaclass {type(answer).__name__} (its class "
                      f"statement)")
    return None


def flag_answer(answer: Any, forbidden: dict[str, str], rule: Rule | None) -> str | None:
    """The notebook's static look at the code between the markers: the first flagged use
    (`describe`'s text), the rule's class check, or None (also when the source or the markers
    cannot be found: the traps of `impala_lab.classroom.exercises._guard.forbid` still
    apply)."""
    names = table(forbidden, rule)
    for text, filename, first in regions(answer):
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        hits = scan(tree, names, rule)
        if rule is not None and rule.recursion:
            hits = sorted(hits + [hit(n, RECURSION) for n in recursive(tree)],
                          key=lambda h: (h.line, h.col))
        if hits:
            cell = _cell_label(filename)
            return describe(hits[0], cell if cell is not None else filename,
                            first + hits[0].line - 1, rule)
    if rule is not None and rule.plain_class:
        return _plain_class(answer, rule)
    return None
