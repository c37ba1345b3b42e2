"""The student build: a copy of `impala_lab` in which the code an exercise asks for is absent.

The grader's sandbox sees this copy and no other. It is made from the package's source files
only: no compiled file is carried over (a stale ``.opt-1.pyc`` would keep a reference's
bytecode), and the course's notebooks (solutions included) are not copied. In it, every
function the exercise is checked against (and every function that computes the same thing)
has its body replaced by a single ``raise`` of `ReferenceCalled`, and the checkers' own
reference code is gone too. Then it is compiled, for an interpreter without ``-O`` (the
grading child runs without it). So no thread, no fresh import of a module from its file, no
copy of a function's ``__code__`` can reach an expected value: the grader computes those in its
own process. Beside it lie the grading child's own modules (`CHILD_MODULES`).

One build per exercise, made once per grader process (`build_for`) and removed at exit.
"""

from __future__ import annotations

import ast
import atexit
import compileall
import os
import shutil
import tempfile
from pathlib import Path

import impala_lab

PACKAGE_DIR = Path(impala_lab.__file__).resolve().parent
GRADER_DIR = Path(__file__).resolve().parent
# What the grading child imports of this package (it runs in the sandbox).
CHILD_MODULES = ("__init__.py", "channel.py", "child.py")

# The bodies removed for each exercise: "module path (under impala_lab/):qualified name".
REMOVED: dict[str, tuple[str, ...]] = {
    "minibatch_get": ("learner/minibatch_buffer.py:MinibatchBuffer.get",),
    "replay_mix": ("driver/replay_mixer.py:ReplayMixer.mix",),
    "vtrace_numpy": (*(f"learner/vtrace.py:{name}" for name in (
        "from_importance_weights", "from_logits", "_discounted_sum_reverse")),
        *(f"learner/vtrace_reference.py:{name}" for name in (
            "from_importance_weights_numpy", "from_logits_numpy")),
        "learner/corrections.py:correction_terms"),
    "driver_step": ("driver/driver_loop.py:DriverLoop.step", "driver/impala.py:Impala.step"),
    "vtrace_loss": ("learner/vtrace_policy.py:VTracePolicy.loss_and_stats",
                    "learner/vtrace_policy.py:VTracePolicy.compute_gradients",
                    "learner/corrections.py:correction_terms"),
    "lstm_unroll": ("actor/layers.py:lstm_step", "actor/layers.py:lstm_sequence",
                    "actor/numpy_model.py:NumpyModel.step",
                    "actor/numpy_model.py:NumpyModel.unroll",
                    "learner/keras_model.py:lstm_unroll"),
    "diag_gaussian": ("actor/distributions.py:DiagGaussian.logp",
                      "actor/distributions.py:DiagGaussian.entropy",
                      "learner/distributions.py:TFDiagGaussian.logp",
                      "learner/distributions.py:TFDiagGaussian.entropy"),
}
# A challenge (``<exercise>_challenge``) removes what its exercise does, and more where it
# forbids more: the V-trace loss's challenge writes V-trace itself.
CHALLENGE_EXTRA: dict[str, tuple[str, ...]] = {
    "vtrace_loss": REMOVED["vtrace_numpy"],
}


def removed(exercise: str) -> tuple[str, ...]:
    """The entries of `REMOVED` that the student build of `exercise` strips."""
    base = exercise.removesuffix("_challenge")
    extra = CHALLENGE_EXTRA.get(base, ()) if base != exercise else ()
    return REMOVED[base] + tuple(e for e in extra if e not in REMOVED[base])


# The checkers' reference side, removed from every build (the child never needs it).
CHECKERS_REFERENCES = (
    *(f"classroom/exercises/{name}.py:_reference_trace" for name in REMOVED),
    "classroom/exercises/vtrace_loss.py:_Reference.loss",
    "classroom/exercises/lstm_unroll.py:_variant",
    "classroom/exercises/diag_gaussian.py:_variant")

_STUB = "raise __import__('impala_lab_grader.child', fromlist=['_']).absent({name!r})"
_builds: dict[str, Path] = {}


def _find(tree: ast.Module, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    body: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(
            n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return node if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else None


def strip_functions(text: str, qualnames: list[str]) -> str:
    """`text` (a module's source) with the bodies of `qualnames` replaced by a raise of
    `ReferenceCalled`; the signatures and everything else stay as they are. A name the module
    does not define is skipped: there is nothing of it to reach (`missing` lists them, and a
    test keeps the table above in step with the library).
    """
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    nodes = [(_find(tree, q), q) for q in qualnames]
    found = sorted(((n, q) for n, q in nodes if n is not None), key=lambda p: -p[0].lineno)
    for node, qualname in found:  # bottom up: the line numbers above stay right
        first = node.body[0]
        stub = " " * first.col_offset + _STUB.format(name=qualname) + "\n"
        lines[first.lineno - 1:node.end_lineno] = [stub]
    return "".join(lines)


def missing() -> list[str]:
    """The entries of `REMOVED` and `CHECKERS_REFERENCES` that name no function of the
    library as it is now (a renamed implementation would stay reachable: keep this empty)."""
    out = []
    for entry in sorted({e for v in REMOVED.values() for e in v} | set(CHECKERS_REFERENCES)):
        rel, qualname = entry.split(":")
        path = PACKAGE_DIR / rel
        text = path.read_text(encoding="utf-8") if path.is_file() else ""
        if not text or _find(ast.parse(text), qualname) is None:
            out.append(entry)
    return out


def _sources(folder: str, names: list[str]) -> list[str]:
    """What `shutil.copytree` leaves out of the build: compiled files and the notebooks."""
    return [n for n in names if n in ("notebooks", "__pycache__") or n.endswith(
        (".pyc", ".pyo", ".so"))]


def _write_build(exercise: str, root: Path) -> None:
    shutil.copytree(PACKAGE_DIR, root / "impala_lab", ignore=_sources)
    (root / "impala_lab_grader").mkdir()
    for name in CHILD_MODULES:
        shutil.copy(GRADER_DIR / name, root / "impala_lab_grader" / name)
    by_file: dict[str, list[str]] = {}
    for entry in removed(exercise) + CHECKERS_REFERENCES:
        rel, qualname = entry.split(":")
        by_file.setdefault(rel, []).append(qualname)
    for rel, qualnames in by_file.items():
        path = root / "impala_lab" / rel
        if not path.is_file():  # nothing of it to reach (`missing` keeps the table true)
            continue
        path.write_text(strip_functions(path.read_text(encoding="utf-8"), qualnames),
                        encoding="utf-8")
    # Compiled now (the sandbox's copy is read-only, and compiling at every import is slow),
    # for the child's interpreter, which runs without -O whatever this one does.
    compileall.compile_dir(root, quiet=2, workers=1, optimize=0)
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)


def build_for(exercise: str) -> Path:
    """The folder that holds the student build of `exercise` (``FOLDER/impala_lab``), made
    on first use, world-readable (the sandbox's user reads it) and removed at exit."""
    if exercise not in _builds:
        root = Path(tempfile.mkdtemp(prefix=f"impala_lab_student_{exercise}_"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        os.chmod(root, 0o755)
        _write_build(exercise, root)
        _builds[exercise] = root
    return _builds[exercise]
