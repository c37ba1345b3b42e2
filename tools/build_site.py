"""Build the course website (``make docs``): mkdocs-material over a staged copy of the repo.

    python tools/build_site.py                 # the students' site: build/site-src/ -> site/
    python tools/build_site.py --instructor    # with the answers: site-instructor/
    python tools/build_site.py --stage-only

The site is for students. The instructor guide (its answers to every notebook's questions)
and the grader's guide (``INSTRUCTOR_PAGES``), and the exercises' solutions, go only into the
instructor build (``make docs-instructor``), staged in ``build/site-src-instructor/`` and built
into ``site-instructor/``; the default build leaves them out, and no page of it may link them.

A site is built from a folder laid out like the repository, so the relative links that work
on GitHub work on the site too:

- ``README.md`` (the home page) and the ``docs/*.md`` guides; the configuration page gets the
  table of every ``ImpalaConfig`` field from ``impala_lab.config.markdown_table`` between its
  ``config-table`` markers, so the site's table is never a hand copy;
- ``docs/api.md``, an API reference that mkdocstrings fills from the docstrings;
- ``notebooks/notation.md``, the course's symbols, and the lecture notebooks and the
  exercises, executed in fast mode (``IMPALA_LAB_FAST=1``), their links to other course files
  pointed at those files' pages. An executed copy is reused from
  ``test-artifacts/executed-notebooks/`` when its recorded hash matches the notebook's source:
  ``tests/test_notebooks.py`` writes one for each notebook it runs, so in ``make test`` every
  notebook executes once. A missing or stale copy is executed here;
- every other file a page links to (figures, the GIF, the one-file example).

Warnings are errors (``mkdocs build --strict``): a broken link fails the build, and so does a
notebook that raises while it is executed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STAGE = ROOT / "build" / "site-src"
SITE = ROOT / "site"
INSTRUCTOR_STAGE = ROOT / "build" / "site-src-instructor"
INSTRUCTOR_SITE = ROOT / "site-instructor"
EXECUTED = ROOT / "test-artifacts" / "executed-notebooks"
NOTEBOOKS = ROOT / "notebooks"
SOURCE_HASH_KEY = "impala_lab_source_sha256"
KERNEL = "impala-lab-site"
# Read by MathJax 2 when it loads: jupyter-server-mathjax ships the STIX-Web fonts alone. The
# notebook pages set the $...$ delimiters themselves.
MATHJAX_CONFIG = """window.MathJax = {
  "HTML-CSS": {availableFonts: [], preferredFont: null, imageFont: null, webFont: "STIX-Web"}
};
"""
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = ("An interactive widget (sliders, buttons or the live dashboard) stands here when "
               "the notebook runs in Jupyter.")
CONFIG_TABLE = re.compile(r"(<!-- config-table:start -->\n).*?(\n<!-- config-table:end -->)",
                          re.DOTALL)
# A markdown link or image whose target is relative: [text](target) or ![alt](target).
RELATIVE_LINK = re.compile(r"\]\((?!https?:|mailto:|#)([^)\s]+)\)")
# A relative link to a page's source (a notebook or a markdown page), with its anchor if any.
PAGE_LINK = re.compile(r"(\]\((?!https?:|mailto:|#)[^)\s]+?)\.(?:md|ipynb)((?:#[^)\s]*)?\))")

# The API reference: (heading, dotted path) for each public name, in reading order.
API = [
    ("Impala", "impala_lab.driver.impala.Impala"),
    ("ImpalaConfig", "impala_lab.config.ImpalaConfig"),
    ("SampleBatch", "impala_lab.batch.SampleBatch"),
    ("RolloutWorker", "impala_lab.actor.rollout_worker.RolloutWorker"),
    ("SampleTaskPool", "impala_lab.driver.task_pool.SampleTaskPool"),
    ("ReplayMixer", "impala_lab.driver.replay_mixer.ReplayMixer"),
    ("LearnerThread", "impala_lab.learner.learner_thread.LearnerThread"),
    ("MinibatchBuffer", "impala_lab.learner.minibatch_buffer.MinibatchBuffer"),
    ("VTracePolicy", "impala_lab.learner.vtrace_policy.VTracePolicy"),
    ("vtrace", "impala_lab.learner.vtrace"),
]

# The guides' pages (docs/NAME.md) in the menu's order, with their titles.
GUIDES = [
    ("The course", "course.md"),
    ("Installation", "installation.md"),
    ("Training", "training.md"),
    ("Recurrent policies", "recurrent.md"),
    ("Pixels: MinAtar and Atari", "pixels.md"),
    ("Dependable learning", "dependable_learning.md"),
    ("Performance", "performance.md"),
    ("Reliability", "reliability.md"),
    ("Evaluation", "evaluation.md"),
    ("Off-policy corrections", "off_policy.md"),
    ("Configuration", "configuration.md"),
    ("Map", "map.md"),
    ("IMPALA in one file", "impala_in_one_file.md"),
]
# The instructor's pages (docs/NAME.md), only in the instructor build: the guide with the
# answers to the notebooks' questions, and the grader's guide (when it is there).
INSTRUCTOR_PAGES = [
    ("Instructor guide", "instructors.md"),
    ("Grading hand-ins", "grading.md"),
]


def lecture_notebooks(instructor: bool = False) -> list[Path]:
    """The notebooks a site shows: the lectures and the exercises; the solutions only in the
    instructor build."""
    folders = ("exercises", "solutions") if instructor else ("exercises",)
    found = sorted(NOTEBOOKS.glob("*.ipynb"))
    for folder in folders:
        found += sorted((NOTEBOOKS / folder).glob("*.ipynb"))
    return [p for p in found if ".ipynb_checkpoints" not in p.parts]


def course_pages() -> list[Path]:
    """The course's markdown pages beside the notebooks (the notation table)."""
    return sorted(NOTEBOOKS.glob("*.md"))


def instructor_pages() -> list[tuple[str, str]]:
    """`INSTRUCTOR_PAGES` that exist in docs/."""
    return [(title, name) for title, name in INSTRUCTOR_PAGES if (ROOT / "docs" / name).is_file()]


def guide_names(instructor: bool = False) -> list[str]:
    """The docs/*.md pages a site carries: the guides, and the instructor's pages in the
    instructor build."""
    return [name for _, name in GUIDES + (instructor_pages() if instructor else [])]


def source_hash(path: Path) -> str:
    """The SHA-256 of a notebook's committed source, which its executed copy records."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def executed_copy(path: Path) -> Path:
    """Where the executed copy of ``notebooks/<rel>`` is kept."""
    return EXECUTED / path.relative_to(NOTEBOOKS)


def save_executed(nb: Any, path: Path) -> Path:
    """Write an executed notebook (an nbformat node) as the reusable copy of ``path``."""
    import nbformat

    nb.metadata[SOURCE_HASH_KEY] = source_hash(path)
    out = executed_copy(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    nbformat.write(nb, str(tmp))
    tmp.replace(out)
    return out


def fresh_executed_copy(path: Path) -> Path | None:
    """The executed copy of ``path`` if there is one made from the source as it is now."""
    out = executed_copy(path)
    if not out.is_file():
        return None
    meta = json.loads(out.read_text(encoding="utf-8")).get("metadata", {})
    return out if meta.get(SOURCE_HASH_KEY) == source_hash(path) else None


def execute(path: Path, kernel_dir: Path) -> Path:
    """Run a notebook top to bottom in fast mode, as the tests do, and keep the copy."""
    import nbclient
    import nbformat

    env = {"JUPYTER_PATH": str(kernel_dir), "IMPALA_LAB_FAST": "1", "MPLBACKEND": "Agg"}
    old = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        nb = nbformat.read(path, as_version=4)
        client = nbclient.NotebookClient(nb, timeout=300, kernel_name=KERNEL,
                                         resources={"metadata": {"path": str(path.parent)}})
        client.execute()  # a failing cell raises CellExecutionError: the build fails
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return save_executed(nb, path)


def write_kernelspec(root: Path) -> Path:
    """A kernelspec that runs this interpreter, so no other 'python3' kernel is picked."""
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "impala_lab site", "language": "python"}))
    return root


def executed_notebooks(instructor: bool = False) -> dict[Path, Path]:
    """Each shown notebook with its executed copy, executing those without a fresh one."""
    copies: dict[Path, Path] = {}
    missing = []
    for path in lecture_notebooks(instructor):
        copy = fresh_executed_copy(path)
        if copy is None:
            missing.append(path)
        else:
            copies[path] = copy
    if missing:
        with tempfile.TemporaryDirectory() as tmp:
            kernel_dir = write_kernelspec(Path(tmp))
            for path in missing:
                print(f"build_site: executing {path.relative_to(ROOT)} (no fresh copy)",
                      flush=True)
                copies[path] = execute(path, kernel_dir)
    return copies


def without_live_widgets(nb: dict[str, Any]) -> dict[str, Any]:
    """The notebook with each widget's output replaced by a line saying what it was.

    A widget needs its kernel; on a static page it could only be drawn by a script from a
    CDN, which the site does not load. The notebook's saved widget state goes too.
    """
    nb.get("metadata", {}).pop("widgets", None)
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET_VIEW in data:
                out["data"] = {"text/html": f"<p><em>{WIDGET_NOTE}</em></p>",
                               "text/plain": WIDGET_NOTE}
    return nb


def with_page_links(nb: dict[str, Any]) -> dict[str, Any]:
    """The notebook with its markdown links to a course file's source (``notation.md``,
    another notebook) pointed at that file's page (``.html``): mkdocs rewrites the links of
    markdown pages, not those inside a notebook."""
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            source = cell["source"]
            text = "".join(source) if isinstance(source, list) else source
            cell["source"] = PAGE_LINK.sub(r"\1.html\2", text)
    return nb


def fill_config_table(text: str) -> str:
    """The page with the table of every config field between its config-table markers."""
    from impala_lab.config import markdown_table

    if not CONFIG_TABLE.search(text):
        raise ValueError("the page lacks the config-table markers")
    return CONFIG_TABLE.sub(lambda m: m.group(1) + markdown_table() + m.group(2), text)


def api_page() -> str:
    """The API reference's markdown: a mkdocstrings block per public name."""
    parts = ["# API reference", "",
             "Generated from the docstrings of the public classes and of the V-trace module.",
             ""]
    for title, dotted in API:
        parts += [f"## {title}", "", f"::: {dotted}", ""]
    return "\n".join(parts)


def copy_linked_files(page: Path, stage: Path) -> list[Path]:
    """Copy into the stage each repository file a staged page links to that is not there yet
    (figures, the GIF, a results page; never a notebook); returns the copies."""
    rel_dir = page.parent.relative_to(stage)
    copied = []
    for target in RELATIVE_LINK.findall(page.read_text(encoding="utf-8")):
        target = target.split("#", 1)[0]
        if not target or target.endswith(".ipynb"):
            continue
        source = (ROOT / rel_dir / target).resolve()
        dest = (stage / rel_dir / target).resolve()
        if source.is_file() and ROOT in source.parents and not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest)
            copied.append(dest)
    return copied


def stage(dest: Path | None = None, instructor: bool = False) -> Path:
    """Lay out a site's sources in ``dest`` (emptied first; by default `STAGE`, or
    `INSTRUCTOR_STAGE` for the instructor build); returns ``dest``."""
    dest = dest or (INSTRUCTOR_STAGE if instructor else STAGE)
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "docs").mkdir(parents=True)
    (dest / "notebooks").mkdir()
    shutil.copy2(ROOT / "README.md", dest / "README.md")
    for name in guide_names(instructor):
        shutil.copy2(ROOT / "docs" / name, dest / "docs" / name)
    for page in course_pages():
        shutil.copy2(page, dest / "notebooks" / page.name)
    config_page = dest / "docs" / "configuration.md"
    config_page.write_text(fill_config_table(config_page.read_text(encoding="utf-8")))
    (dest / "docs" / "api.md").write_text(api_page())
    for source, copy in executed_notebooks(instructor).items():
        out = dest / source.relative_to(ROOT)
        out.parent.mkdir(parents=True, exist_ok=True)
        nb = json.loads(copy.read_text(encoding="utf-8"))
        out.write_text(json.dumps(with_page_links(without_live_widgets(nb)), indent=1),
                       encoding="utf-8")
    pages = list(dest.rglob("*.md"))
    while pages:  # a copied page may link further files
        copied = copy_linked_files(pages.pop(), dest)
        pages += [p for p in copied if p.suffix == ".md"]
    copy_mathjax(dest / "mathjax")
    return dest


def copy_mathjax(dest: Path) -> None:
    """MathJax 2 (what jupyter-server-mathjax ships) for the notebooks' formulas, so that no
    page asks a CDN for it; its translations are left out."""
    import jupyter_server_mathjax

    static = Path(jupyter_server_mathjax.__file__).parent / "static"
    shutil.copytree(static, dest, ignore=shutil.ignore_patterns("localization"))
    (dest / "site-config.js").write_text(MATHJAX_CONFIG)


def notebook_title(path: Path) -> str:
    """A notebook's title for the navigation: its first markdown heading, or its name."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            match = re.search(r"^#+\s+(.+)$", source, re.MULTILINE)
            if match:
                return match.group(1).replace("`", "").strip()
    return path.stem


def navigation(instructor: bool = False) -> list[Any]:
    """A site's menu: the home page, the course, the guides, the API reference; in the
    instructor build also the solutions and the instructor's pages."""
    shown = lecture_notebooks(instructor)
    lectures = [p for p in shown if p.parent == NOTEBOOKS]

    def entry(path: Path) -> dict[str, str]:
        return {title_of(path): path.relative_to(ROOT).as_posix()}

    def folder(name: str) -> list[dict[str, str]]:
        return [entry(p) for p in shown if p.parent == NOTEBOOKS / name]

    notes = [{title_of(p): p.relative_to(ROOT).as_posix()} for p in course_pages()]
    menu = [{"Home": "README.md"},
            {"Lectures": notes + [entry(p) for p in lectures]},
            {"Exercises": folder("exercises")}]
    if instructor:
        menu.append({"Solutions": folder("solutions")})
    menu.append({"Guides": [{title: f"docs/{name}"} for title, name in GUIDES]})
    if instructor:
        menu.append({"Instructors": [{title: f"docs/{name}"}
                                     for title, name in instructor_pages()]})
    return [*menu, {"API reference": "docs/api.md"}]


def title_of(path: Path) -> str:
    """A page's title for the navigation: its first markdown heading, or its name."""
    if path.suffix == ".md":
        match = re.search(r"^#+\s+(.+)$", path.read_text(encoding="utf-8"), re.MULTILINE)
        return match.group(1).strip() if match else path.stem
    return notebook_title(path)


def write_config(instructor: bool = False) -> Path:
    """The staged folder's mkdocs.yml (build/mkdocs.yml, or build/mkdocs-instructor.yml): the
    repository's mkdocs.yml with absolute paths and the menu."""
    import yaml

    stage_dir, site_dir = (INSTRUCTOR_STAGE, INSTRUCTOR_SITE) if instructor else (STAGE, SITE)
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["docs_dir"] = str(stage_dir)
    config["site_dir"] = str(site_dir)
    if instructor:
        config["site_name"] += " (instructor)"
    for plugin in config["plugins"]:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            plugin["mkdocstrings"]["handlers"]["python"]["paths"] = [str(ROOT)]
    config["nav"] = navigation(instructor)
    out = stage_dir.parent / ("mkdocs-instructor.yml" if instructor else "mkdocs.yml")
    out.write_text(yaml.safe_dump(config, sort_keys=False))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instructor", action="store_true",
                        help="the instructor's site (site-instructor/): also the instructor "
                        "guide with its answers, the grader's guide and the solutions")
    parser.add_argument("--stage-only", action="store_true",
                        help="lay out the staged sources without running mkdocs")
    args = parser.parse_args(argv)
    stage(instructor=args.instructor)
    if args.stage_only:
        return 0
    config = write_config(args.instructor)
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config)]
    # NO_MKDOCS_2_WARNING: mkdocs-material's banner about its successor, printed on every build
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(command, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
