"""The student's world: what a hand-in may see in the sandbox, and nothing else.

A student's machine holds an interpreter and the student package with its own dependencies.
So does the sandbox: the interpreter (its executable, its standard library and shared
libraries), the distributions that ``impala_lab`` requires, followed through their own
requirements (`requirements`: no extras of impala_lab, so no ray, no dev tools), each entry
of theirs bound from wherever it is installed (`entries`) into the interpreter's own
site-packages folder (`site_target`), which is emptied first; then the student build and
the hand-in's own cells (`impala_lab_grader.sandbox`). Every other folder where Python code
or the course could live is hidden where a bound folder holds it (`hidden`): the
interpreter's and the system's site folders, every folder on this process's ``sys.path`` and
``PYTHONPATH``,
the installed ``impala_lab`` (editable, in site-packages, or under ``/usr``) and its course,
the working directory and the hand-ins' folders.
"""

from __future__ import annotations

import glob
import os
import site
import sys
import sysconfig
from functools import cache
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

import impala_lab
from impala_lab.classroom.course import course_root

ROOT = "impala_lab"
SYSTEM = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


class WorldError(RuntimeError):
    """The student's world cannot be put together from this environment."""


def _key(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


@cache
def requirements(root: str = ROOT) -> tuple[metadata.Distribution, ...]:
    """The installed distributions that `root` requires (without extras of its own), and
    theirs, with the extras they ask for; `root` itself is not one of them. A requirement
    whose marker excludes this platform, or that is not installed, is left out."""
    env = default_environment()
    seen: dict[str, metadata.Distribution] = {}
    todo: list[tuple[str, frozenset[str]]] = [(root, frozenset())]
    while todo:
        name, extras = todo.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        key = (_key(dist.metadata["Name"]), extras)
        if key in seen:
            continue
        seen[key] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({**env, "extra": e})
                                         for e in ("", *extras)):
                todo.append((req.name, frozenset(req.extras)))
    out = {k[0]: d for k, d in seen.items() if k[0] != _key(root)}
    return tuple(out[k] for k in sorted(out))


def _tops(dist: metadata.Distribution) -> list[str]:
    """The names a distribution puts at the top of its site folder (packages, modules, its
    metadata folder, its bundled libraries)."""
    if dist.files is not None:
        names = {f.parts[0] for f in dist.files if f.parts}
    else:  # no RECORD (a distribution a system package manager installed)
        names = set((dist.read_text("top_level.txt") or "").split())
    return sorted(n for n in names if n not in ("..", "__pycache__", "")
                  and not n.startswith("__editable__"))


@cache
def entries(root: str = ROOT) -> dict[str, Path]:
    """Name in the sandbox's site folder -> where it is installed here: every top-level
    entry of every distribution in `requirements`.

    Raises:
      WorldError: two distributions put different folders under one name.
    """
    out: dict[str, Path] = {}
    for dist in requirements(root):
        for name in _tops(dist):
            path = Path(dist.locate_file(name))
            if not path.exists():
                continue
            if name in out and out[name].resolve() != path.resolve():
                raise WorldError(f"the student's world has two installed copies of {name!r}, "
                                 f"{out[name]} and {path}; the sandbox shows one: uninstall "
                                 f"the other")
            out[name] = path
    return out


def python() -> str:
    """The interpreter the sandbox runs: this one's own executable, outside any virtualenv
    (a virtualenv's interpreter would bring the virtualenv's packages)."""
    exe = os.path.realpath(sys.executable)
    if sys.prefix != sys.base_prefix and exe.startswith(os.path.realpath(sys.prefix) + os.sep):
        exe = os.path.join(sys.base_prefix, "bin", f"python{sys.version_info[0]}."
                                                   f"{sys.version_info[1]}")
    if not os.access(exe, os.X_OK):
        raise WorldError(f"no interpreter at {exe} (this environment's base interpreter)")
    return exe


def interpreter_binds() -> list[str]:
    """The interpreter's executable, its shared libraries' folder and its standard library,
    each bound where it is (bwrap arguments); folders under `SYSTEM` come with it."""
    paths = {python(), sysconfig.get_config_var("LIBDIR") or "",
             *(sysconfig.get_path(k, vars={"installed_base": sys.base_prefix,
                                           "installed_platbase": sys.base_prefix,
                                           "base": sys.base_prefix,
                                           "platbase": sys.base_prefix})
               for k in ("stdlib", "platstdlib"))}
    paths = {os.path.realpath(p) for p in paths if p and os.path.exists(p)}
    kept = sorted(p for p in paths if not under(p, SYSTEM) and not any(
        p != o and under(p, (o,)) for o in paths))
    return [a for p in kept for a in ("--ro-bind", p, p)]


def site_target() -> str:
    """The interpreter's own site-packages folder, where the sandbox shows the world."""
    for path in site.getsitepackages([sys.base_prefix]):
        if os.path.isdir(path):
            return path
    raise WorldError(f"no site-packages folder under {sys.base_prefix}")


def under(path: str, folders: tuple[str, ...]) -> bool:
    """Whether `path` is one of `folders` or inside one."""
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def hidden(extra: list[str]) -> list[str]:
    """Every folder (made absolute, links resolved) that could hold Python code, the real
    library or the course, plus `extra` (the hand-ins' folders): see the module docstring."""
    package = Path(impala_lab.__file__).resolve().parent
    try:
        course = [str(course_root())]
    except FileNotFoundError:
        course = []
    found = [*site.getsitepackages(), *site.getsitepackages([sys.base_prefix]),
             site.getusersitepackages(), *sys.path,
             *os.environ.get("PYTHONPATH", "").split(os.pathsep),
             *(str(d.locate_file("")) for d in metadata.distributions()),
             *glob.glob("/usr/lib/python3*/*-packages"),
             *glob.glob("/usr/local/lib/python3*/*-packages"),
             str(package), str(package.parent), *course, os.getcwd(), *extra]
    stdlib = {os.path.realpath(sysconfig.get_path(k)) for k in ("stdlib", "platstdlib")}
    out = set()
    for path in found:
        if not path:
            continue
        real = os.path.realpath(path)
        if os.path.isdir(real) and real not in stdlib and not real.endswith("lib-dynload"):
            out.add(real)
    return sorted(out)
