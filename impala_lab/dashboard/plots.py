"""Matplotlib figures of a run, from a live run's history or a run directory's ``metrics.csv``.

Used by the CLI's ``report.png``, by notebooks and by the dashboard's image panels. Always the
Agg backend: these figures are rendered to PNG, never shown in a window.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg", force=False)
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

TIMERS = ("optimizer_step_time_ms", "learner_grad_time_ms", "learner_load_time_ms",
          "learner_load_wait_time_ms", "learner_dequeue_time_ms")


def read_metrics_csv(path: str | Path) -> list[dict[str, float]]:
    """Rows of a ``metrics.csv`` as dicts of floats (empty cells become NaN)."""
    rows = []
    with open(path, newline="") as fh:
        for raw in csv.DictReader(fh):
            row = {}
            for key, text in raw.items():
                try:
                    row[key] = float(text) if text not in ("", None) else math.nan
                except ValueError:
                    row[key] = math.nan
            rows.append(row)
    return rows


def column(rows: Sequence[dict], key: str) -> np.ndarray:
    return np.array([float(r.get(key, math.nan)) if r.get(key) is not None else math.nan
                     for r in rows], dtype=np.float64)


def report_figure(rows: Sequence[dict], title: str = "") -> Figure:
    """Return, throughput, learner queue and timers over time: a 2x2 figure."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), constrained_layout=True)
    t = column(rows, "time_total_s")
    ax = axes[0, 0]
    ax.plot(t, column(rows, "episode_return_mean"), color="tab:green")
    ax.set(title="episode return (mean of last 100)", xlabel="seconds", ylabel="return")
    ax = axes[0, 1]
    ax.plot(t, column(rows, "sample_throughput"), label="sampled")
    ax.plot(t, column(rows, "train_throughput"), label="trained")
    ax.set(title="throughput", xlabel="seconds", ylabel="env steps / s")
    ax.legend(loc="best")
    ax = axes[1, 0]
    ax.plot(t, column(rows, "learner_queue.mean"), color="tab:purple")
    ax.set(title="learner queue size (mean of last 50 learner steps)", xlabel="seconds",
           ylabel="batches")
    ax = axes[1, 1]
    for name in TIMERS:
        values = column(rows, f"timing_breakdown.{name}")
        if np.isfinite(values).any():
            ax.plot(t, values, label=name.replace("_time_ms", ""))
    ax.set(title="timers", xlabel="seconds", ylabel="ms")
    ax.legend(loc="best", fontsize=8)
    if title:
        fig.suptitle(title)
    return fig


def save_report(rows: Sequence[dict], path: str | Path, title: str = "") -> Path:
    fig = report_figure(rows, title)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return Path(path)
