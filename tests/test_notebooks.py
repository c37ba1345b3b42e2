"""Every notebook under notebooks/ runs top to bottom in fast mode, and is committed clean; the
course writes V-trace's symbols one way (notebooks/notation.md), and the notebooks point a
student at files they have (the course folder) or the course website, never at the
repository's make targets or README.

Notebooks are found by globbing ``notebooks/**/*.ipynb``, so a new one is executed (and checked
for outputs) as soon as it lands. Each runs in a fresh kernel of this interpreter with
``IMPALA_LAB_FAST=1``; a cell that prints a ``✓`` check must print it, an exercise stub must
show its checker's NotImplementedError message (pointing at the student's cell) and a solution
its pass line. The executed copies are never written back: each goes to
``test-artifacts/executed-notebooks/`` instead, marked with its source's hash, where the course
website's build (tools/build_site.py, tests/test_site.py) reuses it rather than running the
notebook a second time.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import time
from pathlib import Path

import nbformat
import pytest

from impala_lab.classroom.exercises import EXERCISES, MARK_END, MARK_START
from tests.kernels import notebook_client

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(p for p in NOTEBOOK_DIR.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
IDS = [p.relative_to(NOTEBOOK_DIR).as_posix() for p in NOTEBOOKS]
KERNEL = "impala-lab-tests"
STEP_THROUGH = ["00a_what_impala_solves", "01_rollouts_and_sample_batches",
                "02_task_pool_and_async_sampling", "03_replay_mixing",
                "04_learner_queue_and_minibatch_buffer", "05_vtrace",
                "05a_advantages_and_targets", "06_learner_thread", "07_knobs_side_by_side"]

CHECK_PRINT = re.compile(r'print\(f?"✓')
# TensorFlow's C++ start-up logging, its retracing warnings and Ray's token-authentication
# notice: never in a notebook's output.
TF_NOISE = re.compile(r"I0000|W0000|oneDNN|absl::InitializeLog|triggered tf\.function retracing"
                      r"|authentication_token_setup")

NUMPY_REPR = re.compile(r"\bnp\.(float|int|uint|bool|complex|str)\w*\(|\bnp\.(True|False)_")

_spec = importlib.util.spec_from_file_location("nbstrip", ROOT / "tools" / "nbstrip.py")
nbstrip = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nbstrip)
_spec = importlib.util.spec_from_file_location("build_site", ROOT / "tools" / "build_site.py")
build_site = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_site)


def text_of(cell) -> str:
    """Everything a code cell printed or displayed as text (streams, results, errors)."""
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif out["output_type"] in ("execute_result", "display_data"):
            parts.append(out.get("data", {}).get("text/plain", ""))
        elif out["output_type"] == "error":
            parts.append(f"{out['ename']}: {out['evalue']}")
    return "".join(parts)


def test_the_step_through_notebooks_and_exercises_are_there():
    names = {p.relative_to(NOTEBOOK_DIR).as_posix() for p in NOTEBOOKS}
    for stem in STEP_THROUGH:
        assert f"{stem}.ipynb" in names
    for e in EXERCISES.values():
        assert f"exercises/{e.notebook}" in names and f"solutions/{e.notebook}" in names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_committed_without_outputs(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    assert nb["nbformat"] == 4
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [], f"cell {i} has outputs: run `make nbstrip`"
            assert cell["execution_count"] is None, f"cell {i} has an execution count"
            assert "execution" not in cell["metadata"], f"cell {i}: run `make nbstrip`"
    assert "widgets" not in nb["metadata"], "saved widget state: run `make nbstrip`"


def test_nbstrip_strips_and_checks(tmp_path, capsys):
    nb = {"nbformat": 4, "nbformat_minor": 5,
          "metadata": {"widgets": {"state": {}}, "kernelspec": {"name": "python3"},
                       "language_info": {"name": "python", "version": "3.11.9"}},
          "cells": [{"cell_type": "code", "id": "a", "execution_count": 3, "source": "1",
                     "metadata": {"tags": ["check"], "execution": {"t": 1}, "scrolled": True},
                     "outputs": [{"output_type": "stream", "name": "stdout", "text": "1"}]},
                    {"cell_type": "markdown", "id": "b", "metadata": {}, "source": "# hi"}]}
    path = tmp_path / "dirty.ipynb"
    path.write_text(json.dumps(nb))
    assert nbstrip.main(["--check", str(tmp_path)]) == 1
    assert "would strip" in capsys.readouterr().out
    assert json.loads(path.read_text()) == nb  # --check changes nothing
    assert nbstrip.main([str(path)]) == 0
    clean = json.loads(path.read_text())
    code = clean["cells"][0]
    assert code["outputs"] == [] and code["execution_count"] is None
    assert code["metadata"] == {"tags": ["check"]}
    assert clean["metadata"] == {"kernelspec": {"name": "python3"},
                                 "language_info": {"name": "python"}}
    assert clean["cells"][1] == nb["cells"][1]
    assert nbstrip.main(["--check", str(path)]) == 0


@pytest.fixture(scope="session")
def kernel_dir(tmp_path_factory) -> Path:
    """A kernelspec that runs this very interpreter (no stray 'python3' spec can win)."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "impala_lab tests", "language": "python"}))
    return root


def execute(path: Path, kernel_dir: Path, monkeypatch) -> tuple[object, float]:
    monkeypatch.setenv("JUPYTER_PATH", str(kernel_dir))
    monkeypatch.setenv("IMPALA_LAB_FAST", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)  # the package's own set-up
    nb = nbformat.read(path, as_version=4)
    client = notebook_client(nb, KERNEL, kernel_dir / "sockets", path.parent)
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError (with the traceback) if a cell fails
    return nb, time.perf_counter() - start


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_runs_top_to_bottom_in_fast_mode(path, kernel_dir, monkeypatch):
    nb, seconds = execute(path, kernel_dir, monkeypatch)
    print(f"{path.relative_to(NOTEBOOK_DIR)}: {seconds:.1f} s")
    build_site.save_executed(nb, path)  # the site shows this run, not a second one
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    for cell in code_cells:
        if CHECK_PRINT.search(cell.source):
            assert "✓" in text_of(cell), f"this check printed nothing:\n{cell.source[:300]}"
    folder = path.parent.name
    # impala_lab quiets TensorFlow when it is imported first (every notebook does so).
    noise = [line for cell in code_cells for out in cell.get("outputs", [])
             if out["output_type"] == "stream" and out["name"] == "stderr"
             for line in out["text"].splitlines() if TF_NOISE.search(line)]
    assert not noise, (
        "TensorFlow's or Ray's log lines in the output:\n" + "\n".join(noise[:5]))
    # numpy 2 prints a scalar in a dict or list as np.float64(1.0): print plain numbers.
    reprs = [line for cell in code_cells for line in text_of(cell).splitlines()
             if NUMPY_REPR.search(line)]
    assert not reprs, "numpy scalar reprs in the output:\n" + "\n".join(reprs[:5])
    if folder not in ("exercises", "solutions"):
        return
    exercise = EXERCISES[nb.metadata["impala_lab"]["exercise"]]
    student = [c for c in code_cells if "student" in c.metadata.get("tags", [])]
    check = [c for c in code_cells if "check" in c.metadata.get("tags", [])]
    assert len(student) == 1 and len(check) == 1
    out = text_of(check[0])
    if folder == "exercises":
        assert MARK_START in student[0].source and MARK_END in student[0].source
        assert "still raises NotImplementedError: fill in the code between the markers" in out
        assert f"{MARK_START}\n      {MARK_END}" in out
        assert f"in cell [{student[0].execution_count}] (the cell that defines it)" in out
    else:
        assert f"✓ {exercise.name}: all " in out and " cases pass" in out, out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_markdown_renders_and_starts_with_a_heading(path):
    # markdown-it-py (CommonMark, as JupyterLab renders it) comes with Keras, through rich.
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark").enable("table")
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = [c for c in nb["cells"] if c["cell_type"] == "markdown"]
    assert cells, "no markdown cell"
    for i, cell in enumerate(cells):
        text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        tokens = md.parse(text)
        indented = [t for t in tokens if t.type == "code_block"]
        assert not indented, (f"markdown cell {i} renders an indented code block (4+ leading "
                              f"spaces?): {indented[0].content[:80]!r}")
        if i == 0:
            # A badge line (a paragraph of image links) may come first, then the title.
            blocks = [t for t in tokens if t.level == 0 and t.nesting != -1]
            while blocks and blocks[0].type == "paragraph_open":
                inline = tokens[tokens.index(blocks[0]) + 1]
                kinds = {c.type for c in inline.children or []} - {"softbreak", "text"}
                if not kinds or not kinds <= {"link_open", "link_close", "image"}:
                    break
                blocks = blocks[1:]
            assert blocks and blocks[0].type == "heading_open", (
                f"the first markdown cell does not start with a heading: {text[:80]!r}")


# ------------------------------------------------------------------ one notation
NOTATION = NOTEBOOK_DIR / "notation.md"
# Where the course writes V-trace's symbols: notebooks, the guides, the front page, the one-file.
COURSE_TEXTS = [*NOTEBOOKS, NOTATION, *sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md",
                ROOT / "examples" / "impala_in_one_file.py"]
# A bar marks a clip threshold (rho-bar, rho-bar_pg, c-bar), never the clipped weight w_t: no
# barred rho with a time index, in Unicode, LaTeX or words.
BARRED_WEIGHT = re.compile(r"ρ̄_(?!pg)|\\bar\\rho_(?!\{?pg)|\\bar\{\\rho\}_(?!\{?pg)|rho-bar_[a-z]")
# A definition of delta; its right-hand side must start with the clipped weight (the paper's
# delta carries it).
DELTA_DEFINITION = re.compile(r"(?:δ|\\delta|\bdelta)_\{?[st]\}?\s*=\s*([^\n]{0,40})")
WEIGHTED = ("w_", "min(", "\\min(")
V_TRACE_SYMBOLS = re.compile(r"ρ̄|\\bar\\rho|δ|\\delta")
NOTATION_LINK = re.compile(r"\]\(((?:\.\./)?notation\.md)\)")


def text_of_notebook(path: Path) -> str:
    """All cells' sources, markdown and code, of a notebook (a plain file: its text)."""
    if path.suffix != ".ipynb":
        return path.read_text(encoding="utf-8")
    nb = json.loads(path.read_text(encoding="utf-8"))
    return "\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                     for c in nb["cells"])


def test_the_notation_table_defines_every_symbol():
    table = NOTATION.read_text(encoding="utf-8")
    for definition in ("ρ_t = π(a_t\\|x_t) / μ(a_t\\|x_t)",
                       "| ρ̄ | the clip threshold of the targets",
                       "| ρ̄_pg | the clip threshold of the policy gradient",
                       "| c̄ | the clip threshold of the traces", "| w_t = min(ρ̄, ρ_t) |",
                       "| c_t = min(c̄, ρ_t) = min(1, ρ_t) |",
                       "| δ_t = w_t (r_t + γ_t V(x_{t+1}) − V(x_t)) |",
                       "| A_s = min(ρ̄_pg, ρ_s) (r_s + γ_s v_{s+1} − V(x_s)) |"):
        assert definition in table, definition


def test_the_notation_check_sees_a_second_meaning():
    assert BARRED_WEIGHT.search("with $\\bar\\rho_t = \\min(\\bar\\rho, \\rho_t)$")
    assert BARRED_WEIGHT.search("ρ̄_s = min(1, ρ_s)") and BARRED_WEIGHT.search("rho-bar_t")
    assert not BARRED_WEIGHT.search("$\\bar\\rho_{pg}$, ρ̄_pg and $\\bar\\rho$ alone")
    unweighted = DELTA_DEFINITION.search("delta_t = r_t + gamma_t V(x_{t+1}) - V(x_t)")
    assert unweighted and not unweighted.group(1).startswith(WEIGHTED)
    weighted = DELTA_DEFINITION.search("$$\\delta_t = w_t\\,\\big(r_t$$")
    assert weighted and weighted.group(1).startswith(WEIGHTED)


@pytest.mark.parametrize("path", COURSE_TEXTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_one_notation_across_the_course(path):
    text = text_of_notebook(path)
    barred = [m.group(0) for m in BARRED_WEIGHT.finditer(text)]
    assert not barred, f"a bar marks a threshold; the clipped weight is w_t: {barred}"
    unweighted = [m.group(0) for m in DELTA_DEFINITION.finditer(text)
                  if not m.group(1).lstrip().startswith(WEIGHTED)]
    assert not unweighted, f"delta is the weighted TD error, w_t (...): {unweighted}"
    if path.name == "13_continuous_actions.ipynb":  # its shift of the mean is eta, not delta
        assert not re.search(r"δ|\\delta", text)
    if path.suffix == ".ipynb" and V_TRACE_SYMBOLS.search(text):
        links = NOTATION_LINK.findall(text)
        assert links and all((path.parent / link).resolve() == NOTATION for link in links), (
            "a notebook that writes V-trace's symbols links the notation table")


# ------------------------------------------------------------------ where the notebooks point
# A student who installed the wheel has the course folder and the website, not the repository:
# no make target, no README, no docs/ path (the website's pages are named instead).
REPOSITORY_ONLY = re.compile(r"`make\b|\bmake (?:demo|test|bench|lab|docs|setup)\b|"
                             r"(?<!MinAtar's )\bREADME\b|\bdocs/\w+\.md")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_the_notebooks_point_at_the_course_folder_or_the_website(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    found = [m.group(0) for cell in nb["cells"]
             for m in REPOSITORY_ONLY.finditer("".join(cell["source"]))]
    assert not found, f"repository-only references: {found}"
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        for target in build_site.RELATIVE_LINK.findall("".join(cell["source"])):
            target = target.split("#", 1)[0]
            assert (path.parent / target).resolve().is_relative_to(NOTEBOOK_DIR), (
                f"{target}: a link out of the course folder breaks in a copied course")
            assert (path.parent / target).exists(), f"{target} does not exist"
