"""Strip outputs from Jupyter notebooks, so that they are committed without them.

    python tools/nbstrip.py                 # every notebooks/**/*.ipynb, in place
    python tools/nbstrip.py a.ipynb dir/    # these notebooks (directories: recursively)
    python tools/nbstrip.py --check         # list notebooks with outputs; exit 1 if any

For each code cell it empties ``outputs`` and sets ``execution_count`` to null; it drops the
cell metadata Jupyter adds while running (``execution``, ``ExecuteTime``, ``collapsed``,
``scrolled``) and the notebook's saved widget state, and keeps only the language's name in
``language_info``. Tags and everything else stay. The JSON is written the way nbformat writes
it (sorted keys, one-space indent), so a stripped notebook diffs cleanly. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

RUN_METADATA = ("execution", "ExecuteTime", "collapsed", "scrolled")


def strip(nb: dict[str, Any]) -> dict[str, Any]:
    """Returns the notebook without outputs, execution counts and run-time metadata."""
    for cell in nb.get("cells", []):
        meta = cell.get("metadata", {})
        for key in RUN_METADATA:
            meta.pop(key, None)
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    meta = nb.get("metadata", {})
    meta.pop("widgets", None)
    if isinstance(meta.get("language_info"), dict) and "name" in meta["language_info"]:
        meta["language_info"] = {"name": meta["language_info"]["name"]}
    return nb


def dumps(nb: dict[str, Any]) -> str:
    """The notebook as nbformat writes it."""
    return json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def notebooks(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(q for q in p.rglob("*.ipynb") if ".ipynb_checkpoints" not in q.parts)
        elif p.suffix == ".ipynb" and p.is_file():
            found.append(p)
        else:
            raise SystemExit(f"nbstrip: {p} is not a notebook or a directory")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=["notebooks"],
                        help="notebooks or directories (default: notebooks)")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; list the notebooks that would change, exit 1 if any")
    args = parser.parse_args(argv)
    changed = []
    for path in notebooks(args.paths):
        text = path.read_text(encoding="utf-8")
        new = dumps(strip(json.loads(text)))
        if new != text:
            changed.append(path)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    verb = "would strip" if args.check else "stripped"
    for path in changed:
        print(f"nbstrip: {verb} {path}")
    return 1 if (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
