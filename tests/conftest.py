"""Shared pytest set-up: quiet TensorFlow, headless matplotlib, the `slow` marker.

The environment variables are set here, at import, because pytest imports this file before any
test module: TensorFlow and matplotlib read them when they are first imported.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TF's C++ info lines out of the log
os.environ["MPLBACKEND"] = "Agg"  # tests never open a window


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "slow: a test that takes more than a few seconds (`-m 'not slow'` skips it)")
