"""`train_with_dashboard`: a blocking ``train()`` with the live dashboard on.

``Impala.train(..., dashboard=True)`` calls it. The cell holds until the stop condition, so the
kernel takes no clicks meanwhile: the dashboard's controls stay disabled, its poller thread
keeps the widgets moving (reading the pipeline view each step leaves, see
``Impala.driving_thread``), and without a notebook frontend the terminal view is printed at
every report. ``impala.start()`` is the variant with live controls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def train_with_dashboard(run: Any, stop: Mapping[str, float] | Callable[[dict], bool] | None
                         = None, *, max_seconds: float | None = None,
                         max_env_steps: int | None = None, report_interval: float = 1.0,
                         on_report: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Train ``run`` (an `Impala`) in this thread while its dashboard shows the progress.

    Arguments and result as in ``Impala.train``; ``on_report`` is called before the
    dashboard's own report (the terminal view, without a frontend).
    """
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
