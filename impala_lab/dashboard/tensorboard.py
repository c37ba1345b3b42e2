"""TensorBoard summaries of a run: every stats scalar, the knob changes, the policy lag.

    writer = TensorBoardWriter.for_run(run, "runs/cartpole/tensorboard")
    run.train(max_seconds=60, on_report=writer.write)   # or writer.hook(another_hook)
    writer.close()

Each report writes at step ``num_steps_sampled`` (docs/training.md, "TensorBoard", lists the
tags). A write that fails (a full disk) turns the writer off with one warning: the run goes on.
"""

from __future__ import annotations

import logging
import math
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

STEP_KEY = "num_steps_sampled"
KNOB_TAG = "knob_changes"
LAG_TAG = "policy_lag/batches"
LAG_DESCRIPTION = ("Updates between the policy that sampled a batch and the learner's, when the "
                   "batch reached the driver: one value per batch since the previous report.")

Hook = Callable[[dict], None]
logger = logging.getLogger("impala_lab")


def scalar_tags(snapshot: Mapping[str, Any]) -> dict[str, float]:
    """The TensorBoard scalars of a stats snapshot: ``{tag: value}``, nested keys joined
    with ``/``, the workers as ``workers/<index>/<field>``, booleans as 0/1; strings, None,
    other lists and NaN/inf left out."""
    out: dict[str, float] = {}

    def walk(value: Any, name: str) -> None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                walk(item, f"{name}/{key}" if name else str(key))
        elif isinstance(value, list | tuple):
            if all(isinstance(item, Mapping) and "index" in item for item in value):
                for item in value:
                    walk({k: v for k, v in item.items() if k != "index"},
                         f"{name}/{item['index']}")
        elif isinstance(value, numbers.Real) and math.isfinite(value):
            out[name] = float(value)

    walk(snapshot, "")
    return out


def knob_change_text(change: Mapping[str, Any]) -> str:
    """One line of markdown for an entry of ``Impala.knob_changes``."""
    return (f"`{change['knob']}` set to {change['value']!r} at {change['time_s']:.1f} s "
            f"(env step {change['num_steps_sampled']:,})")


class TensorBoardWriter:
    """Writes stats snapshots as TensorBoard summaries under `logdir` (created), flushed at
    every write; `close` it, or use it as a context manager.

    Args:
      knob_changes: the run's growing ``Impala.knob_changes``; each write adds the new ones.
      policy_lags: returns the policy lags of the batches since its previous call
        (``RunStats.take_policy_lags``); each write draws them as a histogram.
    """

    def __init__(self, logdir: str | os.PathLike, *,
                 knob_changes: Sequence[Mapping[str, Any]] | None = None,
                 policy_lags: Callable[[], Sequence[float]] | None = None) -> None:
        try:
            from tensorboard.compat.proto.summary_pb2 import Summary
            from tensorboard.plugins.histogram.summary_v2 import histogram_pb
            from tensorboard.plugins.scalar.summary_v2 import scalar_pb
            from tensorboard.plugins.text.summary_v2 import text_pb
        except ImportError:
            raise ImportError("TensorBoard summaries need the tensorboard package: "
                              "pip install tensorboard") from None
        import tensorflow as tf

        self._tf = tf
        self._summary_type, self._scalar_pb, self._histogram_pb, self._text_pb = (
            Summary, scalar_pb, histogram_pb, text_pb)
        self.logdir = os.fspath(logdir)
        self._writer = tf.summary.create_file_writer(self.logdir)
        self._knob_changes = knob_changes
        self._knobs_written = 0
        self._policy_lags = policy_lags
        self._closed = False
        self.failed: str | None = None  # why writing stopped, once a write failed

    @classmethod
    def for_run(cls, run: Any, logdir: str | os.PathLike) -> TensorBoardWriter:
        """A writer fed by an `Impala` run's knob changes and policy lags (from now on)."""
        run.run_stats.take_policy_lags()
        return cls(logdir, knob_changes=run.knob_changes,
                   policy_lags=run.run_stats.take_policy_lags)

    def write(self, snapshot: Mapping[str, Any]) -> None:
        """Writes one report (scalars, new knob changes, lag histogram), unless one failed."""
        if self._closed:
            raise ValueError(f"this TensorBoardWriter ({self.logdir}) is closed")
        if self.failed is not None:
            return
        try:
            self._write(snapshot)
        except Exception as exc:  # tf.errors.OpError, OSError: the disk, not the run
            self.failed = f"{type(exc).__name__}: {exc}"
            logger.warning("TensorBoard summaries are off from here: writing to %s failed "
                           "(%s); training goes on", self.logdir, self.failed)

    def _write(self, snapshot: Mapping[str, Any]) -> None:
        step = int(snapshot[STEP_KEY])
        # One Summary proto, one op: an eager tf.summary.scalar op per tag cost far more.
        summary = self._summary_type()
        for tag, value in scalar_tags(snapshot).items():
            summary.value.extend(self._scalar_pb(tag, value).value)
        if self._policy_lags is not None:
            lags = np.asarray(self._policy_lags(), dtype=np.float64)
            summary.value.extend(
                self._histogram_pb(LAG_TAG, lags, description=LAG_DESCRIPTION).value)
        write_raw = self._tf.summary.experimental.write_raw_pb
        with self._writer.as_default():
            write_raw(summary.SerializeToString(), step=step)
            if self._knob_changes is not None:
                new = list(self._knob_changes[self._knobs_written:])
                self._knobs_written += len(new)
                for change in new:  # at the env step it was applied, not at the report's
                    text = self._text_pb(KNOB_TAG, knob_change_text(change))
                    write_raw(text.SerializeToString(), step=int(change["num_steps_sampled"]))
        self._writer.flush()

    def hook(self, then: Hook | None = None) -> Hook:
        """An ``on_report`` hook that writes the snapshot, then calls `then` (if any) with it."""
        def on_report(snapshot: dict) -> None:
            self.write(snapshot)
            if then is not None:
                then(snapshot)
        return on_report

    def close(self) -> None:
        """Flushes and closes the event file; later closes do nothing."""
        if not self._closed:
            self._closed = True
            try:
                self._writer.close()
            except Exception as exc:  # the last flush of a full disk
                if self.failed is None:
                    logger.warning("TensorBoard summaries: closing %s failed (%s: %s)",
                                   self.logdir, type(exc).__name__, exc)

    def __enter__(self) -> TensorBoardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def train_with_tensorboard(run: Any, logdir: str | os.PathLike, stop: Any = None, *,
                           on_report: Hook | None = None, **train_args: Any) -> dict[str, Any]:
    """``run.train(stop, on_report=on_report, **train_args)``, writing each report and the
    stats it returns under `logdir`; the writer is closed however train ends."""
    with TensorBoardWriter.for_run(run, logdir) as writer:
        final = run.train(stop, on_report=writer.hook(on_report), **train_args)
        writer.write(final)
    return final
