"""`train_with_dashboard`: ``Impala.train(..., dashboard=True)``, a blocking ``train()`` whose
dashboard keeps moving (its controls disabled: the kernel takes no clicks meanwhile).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def train_with_dashboard(run: Any, stop: Any = None, *,
                         on_report: Callable[[dict], None] | None = None,
                         **train_args: Any) -> dict[str, Any]:
    """``run.train(stop, on_report=on_report, **train_args)`` in this thread while its
    dashboard shows the progress (``on_report`` runs before the dashboard's own)."""
    from impala_lab.dashboard.widgets import Dashboard

    board = Dashboard(run)
    board.show(blocking_train=True)  # the kernel takes no clicks until this returns
    try:
        with run.driving_thread():
            return run.train(stop, on_report=board.report_hook(on_report), **train_args)
    finally:
        board.train_ended()
