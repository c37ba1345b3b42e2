"""The rules read on an answer's code: the names it must not use, and a challenge's rule.

A notebook's check reads the code between the markers (`flag_answer`) for a use of the
library's implementation (`Spec.forbidden`) or a break of the challenge's `Rule`; the
instructors' grader scans every student cell with the same `scan` (``impala_lab_grader
.static``). A name matches as a variable, an attribute or a part of an imported name
(``"MinibatchBuffer"``), or only as an attribute (``".step"``).
"""

from __future__ import annotations

import ast
import inspect
import linecache
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from impala_lab.classroom.exercises._common import MARK_END, MARK_START, _cell_label


@dataclass(frozen=True)
class Rule:
    """A challenge's structural rule.

    Attributes:
      hint: what the rule catches and the way round it (the message's ``hint:`` line).
      syntax: the nodes that break it, with what to call them (``ast.comprehension``: a
        comprehension with an ``if``).
      names: names that break it (matched as `Spec.forbidden` is), with what they do.
      recursion: a function that calls itself, directly or through others, breaks it.
      plain_class: the answer must be a class with no base class or metaclass.
    """

    name: str
    hint: str
    syntax: dict[type, str] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    recursion: bool = False
    plain_class: bool = False


@dataclass(frozen=True)
class Hit:
    """One flagged node: what it means and its kind ("forbidden", "rule" or a reader's own)."""

    node: ast.AST
    what: str
    kind: str = "rule"

    @property
    def line(self) -> int:
        return self.node.lineno

    @property
    def col(self) -> int:
        return self.node.col_offset

    @property
    def code(self) -> str:
        """The node's code: one line, shortened."""
        code = f"{self.node.arg}=..." if isinstance(self.node, ast.keyword) else \
            ast.unparse(self.node).splitlines()[0]
        return code if len(code) <= 60 else code[:57] + "..."


RECURSION = "a function that calls itself (a loop too)"


def imported(node: ast.Import | ast.ImportFrom, alias: ast.alias) -> str:
    """The full dotted name an import's `alias` names (``from a.b import c``: ``a.b.c``)."""
    module = node.module if isinstance(node, ast.ImportFrom) else None
    return f"{module}.{alias.name}" if module else alias.name


def keys(node: ast.AST) -> list[str]:
    """The keys a table of names can name `node` by: a name, an attribute (``".attr"`` or
    ``"attr"``), each part of an imported name, a definition (``"def:NAME"``)."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return ["." + node.attr, node.attr]
    if isinstance(node, ast.Import | ast.ImportFrom):
        return [part for a in node.names for part in imported(node, a).split(".")]
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return [f"def:{node.name}"]
    return []


def table(forbidden: dict[str, str], rule: Rule | None) -> dict[str, tuple[str, str]]:
    """The names a scan flags: key -> (kind, what it means)."""
    out = {k: ("forbidden", f"calls {v}") for k, v in forbidden.items()}
    return out | {k: ("rule", v) for k, v in (rule.names if rule else {}).items()}


def scan(tree: ast.AST, names: dict[str, tuple[str, str]], rule: Rule | None = None,
         keys_of: Callable[[ast.AST], list[str]] = keys) -> list[Hit]:
    """Every use in `tree` of a name of `names` (`table`; `keys_of` reads a node's names) and
    of the syntax `rule` forbids, in the order of the text."""
    syntax = rule.syntax if rule is not None else {}
    hits = []
    for node in ast.walk(tree):
        key = next((k for k in keys_of(node) if k in names), None)
        if key is not None and hasattr(node, "lineno"):
            kind, what = names[key]
            hits.append(Hit(node, what, kind))
        kind_of = next((k for k in syntax if isinstance(node, k)), None)
        if kind_of is ast.comprehension and node.ifs:
            hits.append(Hit(node.ifs[0], syntax[kind_of]))
        elif kind_of is not None and kind_of is not ast.comprehension:
            hits.append(Hit(node, syntax[kind_of]))
    return sorted(hits, key=lambda h: (h.line, h.col))


def recursive(tree: ast.AST) -> list[ast.AST]:
    """The definitions in `tree` of functions that call themselves, directly or not."""
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
    """The nodes of `graph` on a cycle: Tarjan's strongly connected components, iterative and
    linear (whatever a hand-in defines)."""
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


def describe(hit: Hit, where: str, line: int, rule: Rule | None) -> str:
    """The flag's text: what, the code, where; a rule's hint on a line of its own."""
    what = f"{hit.what} (`{hit.code}`, {where}, line {line})"
    return broken(rule, what) if hit.kind == "rule" and rule is not None else what


def broken(rule: Rule, what: str) -> str:
    """A rule's message: the rule, what broke it and where, and its hint."""
    return f"breaks the challenge's rule \"{rule.name}\": {what}\n  hint:     {rule.hint}"


def regions(answer: Any) -> list[tuple[str, str, int]]:
    """The code between the markers in the answer's source: (text, filename, first line)."""
    fns = [answer] if inspect.isfunction(answer) else []
    if isinstance(answer, type):
        for value in vars(answer).values():
            value = getattr(value, "__func__", value)
            value = getattr(value, "fget", value)
            if inspect.isfunction(value):
                fns.append(value)
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
    """The notebook's look at a class answer's bases and metaclass."""
    name = getattr(answer, "__name__", "the answer")
    bases = [c.__name__ for c in getattr(answer, "__mro__", ())[1:] if c is not object]
    if bases:
        return broken(rule, f"{name} subclasses {bases[0]} (its class statement)")
    if isinstance(answer, type) and type(answer) is not type:
        return broken(rule, f"{name} has the metaclass {type(answer).__name__} (its class "
                      f"statement)")
    return None


def flag_answer(answer: Any, forbidden: dict[str, str], rule: Rule | None) -> str | None:
    """The notebook's look at the code between the answer's markers: the first flagged use
    (`describe`'s text), the rule's class check, or None (also without source or markers:
    `_guard.forbid`'s traps still apply)."""
    names = table(forbidden, rule)
    for text, filename, first in regions(answer):
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        hits = scan(tree, names, rule)
        if rule is not None and rule.recursion:
            hits = sorted(hits + [Hit(n, RECURSION) for n in recursive(tree)],
                          key=lambda h: (h.line, h.col))
        if hits:
            cell = _cell_label(filename)
            return describe(hits[0], cell if cell is not None else filename,
                            first + hits[0].line - 1, rule)
    if rule is not None and rule.plain_class:
        return _plain_class(answer, rule)
    return None
