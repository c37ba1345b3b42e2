"""Shared pytest set-up: quiet TensorFlow, headless matplotlib, the `slow` and `alone` markers,
and the grader tests' `no_static` fixture.

The environment variables are set here, at import, because pytest imports this file before any
test module: TensorFlow and matplotlib read them when they are first imported.

`make test` runs the suite on two pytest-xdist workers. A test marked `alone` runs with no test
beside it: a browser driving JupyterLab loses clicks and kernel choices while the other worker
loads the machine. Two file locks shared by the workers hold that order: every test takes the
run lock shared, an `alone` test takes it exclusive, and the gate in front of it (held by a
waiting `alone` test) keeps the other worker from starting test after test meanwhile.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TF's C++ info lines out of the log
os.environ["MPLBACKEND"] = "Agg"  # tests never open a window

# pytest explains a failed assert only in test modules and the modules named here: the
# helpers that hold asserts several test files share.
pytest.register_assert_rewrite("tests.exercise_helpers", "tests.dashboard_fakes", "tests.batches")


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "slow: a test that takes more than a few seconds (`-m 'not slow'` skips it)")
    config.addinivalue_line(
        "markers", "alone: under pytest-xdist, no other test runs while this one does")


def _lock_files() -> tuple[Path, Path] | None:
    """The gate and run lock files of this pytest-xdist run (None outside a worker)."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run_id is None:
        return None
    folder = Path(tempfile.gettempdir())
    return folder / f"impala_lab_tests_{run_id}.gate", folder / f"impala_lab_tests_{run_id}.run"


@contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    with open(path, "a") as fh:
        fcntl.flock(fh, mode)  # released when the file closes
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if (files := _lock_files()) is None:
        return (yield)
    gate, run = files
    with ExitStack() as held:
        if item.get_closest_marker("alone"):
            held.enter_context(_flock(gate, fcntl.LOCK_EX))
            held.enter_context(_flock(run, fcntl.LOCK_EX))
        else:
            with _flock(gate, fcntl.LOCK_SH):
                held.enter_context(_flock(run, fcntl.LOCK_SH))
        return (yield)


def pytest_sessionfinish(session) -> None:
    # a worker that is done has no test left for the other to wait on
    for path in _lock_files() or ():
        path.unlink(missing_ok=True)


@pytest.fixture
def no_static(monkeypatch):
    """The grader without its static look, for the tests of what its sandbox holds: an attack
    the static look would stop first must still fail where it runs."""
    from impala_lab_grader import grade  # only the grader's tests pay for the import
    monkeypatch.setattr(grade, "static_verdict", lambda *args: None)
