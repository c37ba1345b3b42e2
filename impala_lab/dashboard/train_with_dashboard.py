"""`train_with_dashboard`: ``Impala.train(..., dashboard=True)``, a blocking ``train()`` whose
dashboard keeps moving (its controls disabled: the kernel takes no clicks meanwhile).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def train_with_dashboard(run: Any, stop: Mapping[str, float] | Callable[[dict], bool] | None
                         = None, *, max_seconds: float | None = None,
                         max_env_steps: int | None = None, report_interval: float = 1.0,
                         on_report: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Train ``run`` in this thread while its dashboard shows the progress; arguments and
    result as in ``Impala.train`` (``on_report`` runs before the dashboard's own)."""
    from impala_lab.dashboard.widgets import Dashboard

    board = Dashboard(run)
    board.show(blocking_train=True)  # the kernel takes no clicks until this returns
    try:
        with run.driving_thread():
            return run.train(stop, max_seconds=max_seconds, max_env_steps=max_env_steps,
                             report_interval=report_interval,
                             on_report=board.report_hook(on_report))
    finally:
        board.train_ended()
