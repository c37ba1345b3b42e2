"""The course website and the pages it is made of.

The fast tests hold the sources: README.md is a front page (short, short lines, one table),
every relative link in README.md, docs/*.md and notebooks/*.md points at a file that exists,
the students' site stages no answer (no instructor guide, no grader's guide, no solution)
while the instructor build stages them, no student page links an instructor page, and the
build puts the generated config table where the configuration page has its markers.

The slow tests build the site once per session with ``tools/build_site.py`` (``make docs``),
which reuses the executed notebooks that tests/test_notebooks.py left in
``test-artifacts/executed-notebooks/`` (this file's name sorts after it, so in a whole run
they are there; run alone, the build executes them). Then Debian's Chromium, driven by
Playwright, opens the built site from a local http.server on 127.0.0.1: the home page, a
notebook page with its figure decoded, and the configuration page. Every request that does
not go to 127.0.0.1 is blocked, so the site must work offline.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from impala_lab.config import field_names, markdown_table

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "site"
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")
MAX_README_LINES = 150
MAX_README_LINE = 200  # characters
# The heading of the instructor guide's answers to the notebooks' questions.
ANSWERS = "Answers to the notebooks' questions"
# The notebook page whose figure the browser checks: V-trace's plots come from matplotlib.
FIGURE_NOTEBOOK = "notebooks/05_vtrace.html"
NOTEBOOK_SOLUTION = ROOT / "notebooks" / "solutions" / "ex1_minibatch_buffer_get.ipynb"

_spec = importlib.util.spec_from_file_location("build_site", ROOT / "tools" / "build_site.py")
build_site = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_site)


def markdown_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *build_site.course_pages()]


def student_pages() -> list[Path]:
    """The markdown pages of the students' site."""
    return [ROOT / "README.md", *build_site.course_pages(),
            *(ROOT / "docs" / name for name in build_site.guide_names())]


def relative_links(text: str) -> list[str]:
    """The targets of the page's markdown links and images that are not URLs or anchors.
    Fenced code is left out (a shell line may hold brackets and parentheses)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)
    return build_site.RELATIVE_LINK.findall(text)


def test_the_readme_is_a_front_page() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines (at most {MAX_README_LINES}): move a long section "
        "into a page under docs/ and link it")
    long = [i + 1 for i, line in enumerate(lines) if len(line) > MAX_README_LINE]
    assert not long, f"README.md lines over {MAX_README_LINE} characters: {long}"
    tables = re.findall(r"^\|.*\|\n\|(?: ?:?-+:? ?\|)+$", text, re.MULTILINE)
    assert len(tables) <= 1, f"README.md has {len(tables)} tables (one small one at most)"
    for needed in ("make demo", "make test", "pip install", "impala-lab notebooks", "!["):
        assert needed in text, needed


@pytest.mark.parametrize("page", markdown_pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_at_a_file_that_exists(page: Path) -> None:
    links = relative_links(page.read_text(encoding="utf-8"))
    if page.name == "README.md":
        assert len(links) >= 10, "the README links its docs pages"
    missing = []
    for link in links:
        target = unquote(link.split("#", 1)[0])
        if target and not (page.parent / target).exists():
            missing.append(link)
    assert not missing, f"{page.relative_to(ROOT)} links to files that do not exist: {missing}"


def test_the_link_check_sees_a_broken_link() -> None:
    text = "See [this](docs/nowhere.md), [that](https://example.org/x) and [here](#map).\n" \
           "```bash\necho [not](a-link)\n```\n![fig](docs/results/results.png)"
    assert relative_links(text) == ["docs/nowhere.md", "docs/results/results.png"]


TEST_REFERENCE = re.compile(r"`(?:tests/)?(test_\w+\.py)(?:::(test_\w+))?")


def test_every_named_test_exists_in_the_file_the_page_names() -> None:
    """The reliability and instructor pages cite tests as `file.py::name`; a test moved to
    another file (or renamed) must take its citations with it."""
    stale = []
    for page in markdown_pages():
        for module, name in TEST_REFERENCE.findall(page.read_text(encoding="utf-8")):
            path = ROOT / "tests" / module
            if not path.exists() or (name and f"def {name}(" not in path.read_text()):
                stale.append(f"{page.relative_to(ROOT)}: {module}::{name}")
    assert not stale, f"pages cite tests that are not where they say: {stale}"


def test_the_readme_links_every_students_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in build_site.guide_names():
        assert f"](docs/{name})" in readme, f"README.md does not link docs/{name}"
    assert "](notebooks/notation.md)" in readme
    listed = {name for _, name in build_site.GUIDES + build_site.INSTRUCTOR_PAGES}
    assert {p.name for p in (ROOT / "docs").glob("*.md")} <= listed, (
        "tools/build_site.py's GUIDES (or INSTRUCTOR_PAGES) must name every docs/*.md page")


@pytest.mark.parametrize("page", student_pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_students_page_links_an_instructors_page(page: Path) -> None:
    instructors = {ROOT / "docs" / name for _, name in build_site.INSTRUCTOR_PAGES}
    linked = {(page.parent / unquote(link.split("#", 1)[0])).resolve()
              for link in relative_links(page.read_text(encoding="utf-8"))}
    assert not linked & instructors, "the students' site carries no instructor page"
    assert ANSWERS not in page.read_text(encoding="utf-8")


def staged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, instructor: bool) -> Path:
    """A site staged into ``tmp_path`` with no notebook executed (their copies left out)."""
    monkeypatch.setattr(build_site, "executed_notebooks", lambda instructor=False: {})
    monkeypatch.setattr(build_site, "copy_mathjax", lambda dest: None)
    return build_site.stage(tmp_path / ("instructor" if instructor else "students"),
                            instructor=instructor)


def test_the_students_site_has_no_answer_page(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    students = staged(tmp_path, monkeypatch, instructor=False)
    names = {p.relative_to(students).as_posix() for p in students.rglob("*") if p.is_file()}
    assert "docs/training.md" in names and "notebooks/notation.md" in names
    assert "docs/instructors.md" not in names and "docs/grading.md" not in names
    assert not any(ANSWERS in p.read_text(encoding="utf-8") for p in students.rglob("*.md"))
    menu = json.dumps(build_site.navigation())
    assert "instructors.md" not in menu and "solutions/" not in menu and "Instructors" not in menu
    assert not [p for p in build_site.lecture_notebooks() if p.parent.name == "solutions"]

    instructor = staged(tmp_path, monkeypatch, instructor=True)
    assert ANSWERS in (instructor / "docs" / "instructors.md").read_text(encoding="utf-8")
    menu = json.dumps(build_site.navigation(instructor=True))
    assert '"Instructors"' in menu and "docs/instructors.md" in menu
    assert "notebooks/solutions/ex1_minibatch_buffer_get.ipynb" in menu
    import yaml

    monkeypatch.setattr(build_site, "INSTRUCTOR_STAGE", instructor)
    monkeypatch.setattr(build_site, "INSTRUCTOR_SITE", tmp_path / "site-instructor")
    config = yaml.safe_load(build_site.write_config(instructor=True).read_text())
    assert config["site_dir"] == str(tmp_path / "site-instructor")
    assert config["docs_dir"] == str(instructor)


def test_the_build_fills_the_config_table_between_the_markers() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    filled = build_site.fill_config_table(page)
    assert (f"<!-- config-table:start -->\n{markdown_table()}\n<!-- config-table:end -->"
            in filled)
    assert filled.startswith(page.split("<!-- config-table:start -->")[0])
    with pytest.raises(ValueError, match="config-table markers"):
        build_site.fill_config_table("# no table here\n")


def test_the_site_shows_the_exercises_but_not_their_solutions() -> None:
    shown = [p.relative_to(ROOT / "notebooks").as_posix() for p in build_site.lecture_notebooks()]
    assert "05_vtrace.ipynb" in shown and "exercises/ex3_vtrace_numpy.ipynb" in shown
    assert not [name for name in shown if name.startswith("solutions/")]
    everything = build_site.lecture_notebooks(instructor=True)
    assert NOTEBOOK_SOLUTION in everything
    assert NOTEBOOK_SOLUTION not in build_site.lecture_notebooks()


def test_a_notebooks_links_to_course_files_point_at_their_pages() -> None:
    nb = {"cells": [{"cell_type": "markdown", "source": [
        "[the notation table](notation.md), [05](05_vtrace.ipynb#1-v-trace-by-hand), "
        "[up](../notation.md), [web](https://example.org/a.md), ![fig](plot.png)"]},
        {"cell_type": "code", "source": "x = '[a](b.md)'"}]}
    out = build_site.with_page_links(nb)
    assert out["cells"][0]["source"] == (
        "[the notation table](notation.html), [05](05_vtrace.html#1-v-trace-by-hand), "
        "[up](../notation.html), [web](https://example.org/a.md), ![fig](plot.png)")
    assert out["cells"][1]["source"] == "x = '[a](b.md)'"


def test_an_executed_copy_is_reused_only_while_its_source_is_unchanged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbformat

    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    monkeypatch.setattr(build_site, "NOTEBOOKS", notebooks)
    monkeypatch.setattr(build_site, "EXECUTED", tmp_path / "executed")
    source = notebooks / "x.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")]),
                   str(source))
    assert build_site.fresh_executed_copy(source) is None  # never run
    run = nbformat.read(str(source), as_version=4)
    run.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    copy = build_site.save_executed(run, source)
    assert copy == tmp_path / "executed" / "x.ipynb"
    assert build_site.fresh_executed_copy(source) == copy
    assert nbformat.read(str(copy), as_version=4).cells[0].outputs[0].text == "1\n"
    source.write_text(source.read_text().replace("print(1)", "print(2)"))
    assert build_site.fresh_executed_copy(source) is None  # edited since: run it again


def test_widgets_become_a_line_saying_what_stands_there() -> None:
    view = {"model_id": "abc", "version_major": 2, "version_minor": 0}
    nb = {"metadata": {"widgets": {"state": {}}, "kernelspec": {}},
          "cells": [{"cell_type": "code", "outputs": [
              {"output_type": "display_data",
               "data": {build_site.WIDGET_VIEW: view, "text/plain": "IntSlider(value=3)"}},
              {"output_type": "display_data", "data": {"image/png": "iVBOR"}}]}]}
    out = build_site.without_live_widgets(nb)
    assert "widgets" not in out["metadata"] and "kernelspec" in out["metadata"]
    widget, figure = out["cells"][0]["outputs"]
    assert widget["data"]["text/plain"] == build_site.WIDGET_NOTE
    assert build_site.WIDGET_NOTE in widget["data"]["text/html"]
    assert figure["data"] == {"image/png": "iVBOR"}


@pytest.fixture(scope="session")
def built_site() -> Path:
    """``make docs``'s build, once: the seconds it took land in test-artifacts/."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "build_site.py")], cwd=ROOT,
                         capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - start
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "site_build.log").write_text(
        f"{seconds:.1f} s\n--- stdout\n{out.stdout}\n--- stderr\n{out.stderr}")
    print(f"site build: {seconds:.1f} s")
    assert out.returncode == 0, f"the site build failed:\n{out.stderr[-4000:]}"
    return SITE


@pytest.mark.slow
@pytest.mark.timeout(1800)  # run alone, the build executes every notebook itself
def test_the_built_site_has_every_page(built_site: Path) -> None:
    assert (built_site / "index.html").is_file()
    for path in build_site.lecture_notebooks():
        rel = path.relative_to(ROOT).with_suffix(".html")
        assert (built_site / rel).is_file(), f"{rel} is missing"
    assert not (built_site / "notebooks" / "solutions").exists()
    # no answer anywhere: no instructor page, no page with the answers' heading
    for _, name in build_site.INSTRUCTOR_PAGES:
        assert not (built_site / "docs" / name.replace(".md", ".html")).exists(), name
    assert not [p for p in built_site.rglob("*.html") if ANSWERS in p.read_text(encoding="utf-8")]
    # the files the pages link to came along: a figure, the GIF, a results page, the notation
    for rel in ("docs/results/results.png", "impala_lab/data/breakout_policy.gif",
                "docs/results/results.html", "notebooks/notation.html"):
        assert (built_site / rel).is_file(), rel
    # and the one-file IMPALA, which mkdocs-jupyter shows as a page of code (through jupytext)
    one_file = (built_site / "examples" / "impala_in_one_file.html").read_text(encoding="utf-8")
    assert "def rollout" in one_file and "class Learner" in one_file
    # a notebook's link to the notation table leads to its page
    page = (built_site / "notebooks" / "05_vtrace.html").read_text(encoding="utf-8")
    assert 'href="notation.html"' in page
    for name in ("training", "performance", "reliability", "off_policy", "map", "api"):
        assert (built_site / "docs" / f"{name}.html").is_file(), name
    config = (built_site / "docs" / "configuration.html").read_text(encoding="utf-8")
    for field in field_names():
        assert f"<code>{field}</code>" in config, field
    api = (built_site / "docs" / "api.html").read_text(encoding="utf-8")
    for title, _ in build_site.API:
        assert f'id="{title.lower()}"' in api, title
    # the docstrings themselves, not only the headings: vtrace's functions and a method
    assert "from_importance_weights" in api and "learn_on_batch" in api


@contextmanager
def serve(folder: Path) -> Iterator[str]:
    """``folder`` served by http.server on 127.0.0.1 (a free port), in a thread."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@contextmanager
def chromium_page() -> Iterator:
    """A headless Chromium page that reaches 127.0.0.1 and nothing else."""
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: the browser tests drive Debian's Chromium; "
                    "run `make browser-deps` (as root) to install it")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 1600})
            blocked: list[str] = []

            def loopback_only(route) -> None:
                url = route.request.url
                if urlparse(url).hostname == "127.0.0.1" or url.startswith(("data:", "blob:")):
                    route.continue_()
                else:
                    blocked.append(url)
                    route.abort()

            context.route("**/*", loopback_only)
            page = context.new_page()
            page.blocked = blocked
            yield page
            context.close()
        finally:
            browser.close()


# Every <img> of the notebook's outputs whose picture was decoded: its natural size.
FIGURES_JS = """() => [...document.querySelectorAll('.jp-OutputArea-output img')]
  .filter(img => img.complete && img.naturalWidth > 0)
  .map(img => ({w: img.naturalWidth, h: img.naturalHeight, src: img.src.slice(0, 22)}))"""


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_site_opens_in_a_browser(built_site: Path) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    with serve(built_site) as url, chromium_page() as page:
        page.goto(f"{url}/index.html")
        assert "impala_lab" in page.title()
        assert page.locator("article h1").first.inner_text().strip().rstrip("¶") == "impala_lab"
        assert page.locator("article code", has_text="make demo").count() >= 1
        menu = page.locator("nav.md-nav--primary").inner_text()
        for entry in ("Lectures", "Exercises", "Guides", "API reference"):
            assert entry in menu, entry
        page.screenshot(path=str(ARTIFACTS / "site_home.png"))

        page.goto(f"{url}/{FIGURE_NOTEBOOK}")
        page.wait_for_load_state("load")
        assert "V-trace" in page.locator("article").inner_text()
        figures = page.evaluate(FIGURES_JS)
        assert figures, "the notebook page shows no decoded figure"
        assert all(f["src"] == "data:image/png;base64," for f in figures), figures
        assert max(f["w"] for f in figures) >= 300 and max(f["h"] for f in figures) >= 200, (
            figures)
        # the formulas are typeset by the MathJax the site carries (no CDN can be reached)
        page.wait_for_function("() => document.querySelectorAll('.MathJax').length > 10",
                               timeout=60_000)
        page.locator(".jp-OutputArea-output img").first.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "site_notebook.png"))

        page.goto(f"{url}/docs/configuration.html")
        row = page.locator("article table tr", has=page.locator("td code", has_text=re.compile(
            r"^train_batch_size$")))
        assert row.count() == 1, "the configuration page has no train_batch_size row"
        cells = row.locator("td").all_inner_texts()
        assert cells[1] == "500" and "learner batch" in cells[2], cells
        page.screenshot(path=str(ARTIFACTS / "site_configuration.png"))
        # nothing the pages need comes from elsewhere, except the notebooks' Colab badges
        assert all("colab" in u for u in page.blocked), page.blocked
