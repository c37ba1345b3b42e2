"""Open in Colab: a badge and an install cell at the top of each notebook, idempotently.

    python tools/colab_cell.py notebooks/*.ipynb notebooks/*/*.ipynb   # in place
    python tools/colab_cell.py --check notebooks/                       # exit 1 if any is stale

Each notebook gets:

- once the repository has a public home on GitHub (``GITHUB_REPO`` below), a Colab badge, as
  the line after the title of its first markdown cell (the first cell then still starts with
  a heading), linking to the notebook through
  ``colab.research.google.com/github/GITHUB_REPO/blob/BRANCH/<path in the repository>``
  (a solution's badge opens its exercise: see `badge_target`). Today it has none, so
  ``GITHUB_REPO`` is None and the script removes any badge: a badge that opens somebody
  else's repository, or none at all, would only mislead;
- a first code cell (id ``colab-install``) that installs impala_lab from ``INSTALL_SOURCE``
  when it cannot be imported, with the extras the notebook needs (``ray`` where a cell uses
  Ray), and otherwise does nothing: in a clone, in CI and in a course copied out of a wheel
  (``impala-lab notebooks DIR``) impala_lab is installed already.

Where TensorFlow is preinstalled (Colab) the cell keeps it: it installs impala_lab with
``--no-deps`` and then its other requirements, read from ``pyproject.toml`` when this script
runs, without the ``tensorflow``/``tensorflow-cpu`` lines (a second TensorFlow beside Colab's
would shadow it) and without ``ml_dtypes`` (TensorFlow's, kept as installed). Everywhere else
pip installs the requirements as declared.

Without a public repository the cell installs from a wheel next to the notebook
(``INSTALL_SOURCE`` is the wheel's file name: build it in a clone with ``pip wheel --no-deps
-w dist .`` and upload it, to Colab's Files pane for instance) and says so when it is not
there; a student may set ``IMPALA_LAB_SOURCE`` in the cell to a clone's path or git URL.

To publish, set ``GITHUB_REPO`` (and ``BRANCH``) below and run the script again: it writes the
badges and points the cell at the repository, in place (same cell ids), and a second run
changes nothing. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# The repository the badges open in Colab, "owner/name" on GitHub; None while it has no
# public home (no badges then). Set it once, here.
GITHUB_REPO: str | None = None
BRANCH = "main"


def _wheel_name(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The file name of the wheel ``pip wheel --no-deps -w dist .`` builds in a clone."""
    version = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"]
    return f"impala_lab-{version}-py3-none-any.whl"


# What the install cell installs from: a pip URL (git+https://..., https://.../x.whl) or a path
# to a wheel or a source folder (turned into a file:// URL by the cell).
INSTALL_SOURCE = (f"git+https://github.com/{GITHUB_REPO}@{BRANCH}" if GITHUB_REPO
                  else _wheel_name())

BADGE_ID_TEXT = "colab-badge.svg"
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
INSTALL_CELL_ID = "colab-install"
SOURCE_VARIABLE = "IMPALA_LAB_SOURCE"
# a cell that uses Ray needs the ray extra
RAY_USE = re.compile(r"^\s*(import ray|from ray\b)|backend=[\"']ray[\"']", re.MULTILINE)
# a cell that makes a MinAtar game needs the minatar extra
MINATAR_USE = re.compile(r"[\"']MinAtar/")


def colab_url(rel_path: str) -> str:
    """The Colab address of a notebook at `rel_path` (relative to the repository's root)."""
    return f"https://colab.research.google.com/github/{GITHUB_REPO}/blob/{BRANCH}/{rel_path}"


def badge_target(rel_path: str) -> str:
    """The notebook a badge opens: itself, except that a solution opens its exercise, so that
    a stub and its solution stay identical outside the student's cell (the exercise tests
    hold them so), and the badge of a solution sent out by mistake opens the stub."""
    parts = rel_path.split("/")
    if len(parts) >= 2 and parts[-2] == "solutions":
        parts[-2] = "exercises"
    return "/".join(parts)


def badge_line(rel_path: str) -> str:
    return f"[![Open In Colab]({BADGE_IMAGE})]({colab_url(badge_target(rel_path))})"


def requirements(pyproject: Path = ROOT / "pyproject.toml") -> tuple[list[str], dict[str, list]]:
    """impala_lab's requirements without TensorFlow and ml_dtypes (markers dropped), and
    its extras."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    deps = [d.split(";")[0].strip() for d in project["dependencies"]]
    # TensorFlow's own stack stays as Colab installed it: its ml_dtypes too (our upper bound
    # only saves import time, and JAX there may need a newer one).
    deps = [d for d in deps if not re.match(r"(tensorflow(-cpu)?|ml_dtypes)\b", d)]
    return deps, project.get("optional-dependencies", {})


def install_cell_source(extras: list[str], source: str = INSTALL_SOURCE,
                        pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The install cell's code for a notebook that needs `extras` (e.g. ``["ray"]``)."""
    deps, optional = requirements(pyproject)
    for extra in extras:
        deps += optional[extra]
    spec = f"impala_lab[{','.join(extras)}]" if extras else "impala_lab"
    dep_lines = "".join(f"\n            {json.dumps(d)}," for d in deps)
    return f'''\
# Opened in Colab (or where impala_lab is missing): install it. Anywhere else this does nothing.
{SOURCE_VARIABLE} = {json.dumps(source)}  # a pip URL, or the path of a wheel or a clone
import importlib.util

if importlib.util.find_spec("impala_lab") is None:
    import pathlib
    import subprocess
    import sys

    _source = {SOURCE_VARIABLE}
    if "://" not in _source and not _source.startswith("git+"):  # a local wheel or folder
        _path = pathlib.Path(_source).expanduser().resolve()
        if not _path.exists():
            raise FileNotFoundError(
                f"impala_lab is not installed and {{_path}} is not here: build the wheel in a "
                "clone (pip wheel --no-deps -w dist .) and put it next to this notebook, or "
                "set {SOURCE_VARIABLE} to a clone's path or git URL")
        _source = _path.as_uri()
    _pip = [sys.executable, "-m", "pip", "install", "-q"]
    if importlib.util.find_spec("tensorflow") is None:
        subprocess.check_call([*_pip, "{spec} @ " + _source])
    else:  # keep the preinstalled TensorFlow: no second one (tensorflow-cpu) beside it
        subprocess.check_call([*_pip, "--no-deps", "impala_lab @ " + _source])
        subprocess.check_call([*_pip,{dep_lines}
        ])
    importlib.invalidate_caches()'''


def notebook_extras(nb: dict[str, Any]) -> list[str]:
    """The extras a notebook needs: ``ray`` if a code cell (other than ours) uses Ray,
    ``minatar`` if one makes a MinAtar game."""
    code = "\n".join(_text(c) for c in nb["cells"]
                     if c["cell_type"] == "code" and c.get("id") != INSTALL_CELL_ID)
    return [name for name, use in (("ray", RAY_USE), ("minatar", MINATAR_USE))
            if use.search(code)]


def _text(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _lines(text: str) -> list[str]:
    """Source as nbformat stores it on disk: a list of lines, each but the last with its \\n."""
    return text.splitlines(keepends=True)


def rel_path(path: Path) -> str:
    """The notebook's path in the repository (``notebooks/...``); outside it, from the
    ``notebooks`` folder on, or the file's name."""
    path = path.resolve()
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        parts = path.parts
        if "notebooks" in parts:
            return "/".join(parts[len(parts) - 1 - parts[::-1].index("notebooks"):])
        return path.name


def add_colab(nb: dict[str, Any], rel: str) -> dict[str, Any]:
    """Puts (or updates) the badge and the install cell in `nb`, in place; returns it."""
    cells = nb["cells"]
    first_md = next((c for c in cells if c["cell_type"] == "markdown"), None)
    if first_md is None:  # a notebook without any text: the badge gets a cell of its own
        first_md = {"cell_type": "markdown", "id": "colab-badge", "metadata": {}, "source": ""}
        cells.insert(0, first_md)
    # drop an old badge (and the blank line after it), then put it after the title: the first
    # heading line, so that the cell still starts with the heading
    lines = _text(first_md).split("\n")
    for i in reversed([i for i, line in enumerate(lines) if BADGE_ID_TEXT in line]):
        del lines[i: i + (2 if i + 1 < len(lines) and not lines[i + 1].strip() else 1)]
    if GITHUB_REPO:  # no public repository, no badge
        at = next((i + 1 for i, line in enumerate(lines) if line.lstrip().startswith("#")), 0)
        lines[at:at] = ["", badge_line(rel), ""] if at else [badge_line(rel), ""]
        while at and at + 3 < len(lines) and not lines[at + 3].strip():  # one blank line after
            del lines[at + 3]
    first_md["source"] = _lines("\n".join(lines))

    source = _lines(install_cell_source(notebook_extras(nb)))
    found = [c for c in cells if c.get("id") == INSTALL_CELL_ID]
    cell = found[0] if found else {"cell_type": "code", "execution_count": None,
                                   "id": INSTALL_CELL_ID, "metadata": {}, "outputs": []}
    cell["source"] = source
    if found:
        cells.remove(cell)
    # the first code cell, right after the markdown that opens the notebook
    at = next((i for i, c in enumerate(cells) if c["cell_type"] == "code"), len(cells))
    cells.insert(at, cell)
    return nb


def has_colab(nb: dict[str, Any]) -> bool:
    """True if the notebook has the install cell (up to date or not), and a badge exactly when
    ``GITHUB_REPO`` is set."""
    text = "".join(_text(c) for c in nb["cells"] if c["cell_type"] == "markdown")
    return ((BADGE_ID_TEXT in text) == bool(GITHUB_REPO)
            and any(c.get("id") == INSTALL_CELL_ID for c in nb["cells"]))


def dumps(nb: dict[str, Any]) -> str:
    """The notebook as nbformat (and tools/nbstrip.py) writes it."""
    return json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def updated(path: Path) -> tuple[str, str]:
    """(the file's text, the text with the badge and the install cell up to date)."""
    text = path.read_text(encoding="utf-8")
    return text, dumps(add_colab(json.loads(text), rel_path(path)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="notebooks or directories (recursively)")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; list the notebooks that would change, exit 1 if any")
    args = parser.parse_args(argv)
    paths: list[Path] = []
    for p in map(Path, args.paths):
        if p.is_dir():
            paths += sorted(q for q in p.rglob("*.ipynb") if ".ipynb_checkpoints" not in q.parts)
        elif p.suffix == ".ipynb" and p.is_file():
            paths.append(p)
        else:
            raise SystemExit(f"colab_cell: {p} is not a notebook or a directory")
    stale = []
    for path in paths:
        old, new = updated(path)
        if new != old:
            stale.append(path)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    for path in stale:
        print(f"colab_cell: {'would update' if args.check else 'updated'} {path}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
