"""Importing TensorFlow through impala_lab is quiet; TF_CPP_MIN_LOG_LEVEL=0 shows its logs.

TensorFlow 2.16+ prints its C++ start-up lines (absl's notice, I0000 lines about oneDNN and
CPU features) before it reads its log level, straight to file descriptor 2, so a notebook
would show them under the first cell that imports it; `impala_lab._quiet_tf` filters them.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from impala_lab._quiet_tf import NOISE

SCRIPT = """
import sys
import impala_lab
import tensorflow as tf

@tf.function
def double(x):
    return 2 * x

for n in range(1, 9):  # a new shape each call: retracing warnings after the fifth
    double(tf.ones(n))
print("kept", file=sys.stderr)
"""


def run_import(**env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env={**environ, **env},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stderr


@pytest.mark.slow
def test_tensorflow_imported_after_impala_lab_prints_no_log_lines():
    err = run_import()
    assert err.strip() == "kept", err[-2000:]


@pytest.mark.slow
def test_tf_cpp_min_log_level_0_shows_them():
    err = run_import(TF_CPP_MIN_LOG_LEVEL="0")
    assert "triggered tf.function retracing" in err
    assert any(NOISE.match(line) for line in err.splitlines()), err[-2000:]
    assert err.rstrip().endswith("kept")


def test_the_filter_keeps_other_lines():
    assert NOISE.match("I0000 00:00:1796297495.891275   12526 port.cc:153] oneDNN custom")
    assert NOISE.match("W0000 00:00:1796297495.891275   12526 x.cc:1] a warning")
    assert NOISE.match("WARNING: All log messages before absl::InitializeLog() is called are")
    assert not NOISE.match("E0000 00:00:1796297495.891275   12526 x.cc:1] an error")
    assert not NOISE.match("Traceback (most recent call last):")
