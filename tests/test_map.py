"""docs/map.md stays true: its reading path names files that exist, holds IMPALA only and fits
one sitting, and its table names every top-level module and folder of the package."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAP = ROOT / "docs" / "map.md"
PACKAGE = ROOT / "impala_lab"
MAX_READING_LINES = 4000


def _section(title: str) -> str:
    text = MAP.read_text()
    match = re.search(rf"^## {title}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"docs/map.md has no '## {title}' section"
    return match.group(1)


def reading_path() -> list[Path]:
    """The reading path's files, in the order the section names them (each once)."""
    names = re.findall(r"`(impala_lab/[\w/]+\.py)`", _section("Reading path"))
    return [ROOT / n for n in dict.fromkeys(names)]


def test_the_reading_path_names_files_that_exist_and_fits_one_sitting():
    files = reading_path()
    assert len(files) >= 8, files
    missing = [str(f.relative_to(ROOT)) for f in files if not f.is_file()]
    assert missing == []
    lines = sum(len(f.read_text().splitlines()) for f in files)
    assert lines <= MAX_READING_LINES, f"the reading path is {lines} lines"
    # the section says its own total, and it is the files' total
    stated = re.search(r"([\d,]+) lines in all", _section("Reading path"))
    assert stated and int(stated.group(1).replace(",", "")) == lines


def test_the_reading_path_follows_one_batch_round_trip_in_order():
    order = [str(f.relative_to(ROOT)) for f in reading_path()]
    stages = ["impala_lab/actor/rollout_worker.py", "impala_lab/driver/task_pool.py",
              "impala_lab/driver/driver_loop.py", "impala_lab/learner/learner_thread.py",
              "impala_lab/learner/vtrace_policy.py", "impala_lab/learner/vtrace.py"]
    assert [s for s in order if s in stages] == stages


def test_no_file_of_the_reading_path_reaches_behind_the_speed_door():
    # Start-up and transport tuning lives in impala_lab/speed/ (see docs/performance.md): the
    # files a student reads import none of it.
    for path in reading_path():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.startswith("impala_lab.speed") for n in names), path


def test_the_map_names_every_top_level_module_and_folder():
    table = _section("The rooms")
    modules = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    folders = sorted(p.name + "/" for p in PACKAGE.iterdir()
                     if p.is_dir() and (p / "__init__.py").is_file())
    for name in [*modules, *folders]:
        assert f"`{name}`" in table or f"`impala_lab/{name}`" in table, name
    assert len(modules) <= 12, modules
