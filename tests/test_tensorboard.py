"""TensorBoard summaries, read back with TensorBoard's own reader: every numeric metrics.csv
column at the same env step, the knob changes as text, a policy-lag histogram per report with
one value per sample batch."""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from impala_lab.dashboard.tensorboard import (
    LAG_TAG,
    TensorBoardWriter,
    knob_change_text,
    scalar_tags,
)

REPO = Path(__file__).resolve().parents[1]
SMALL = dict(env="CartPole-v1", backend="inline", num_workers=2, num_envs_per_worker=4,
             sample_batch_size=25, train_batch_size=100, seed=5)
BATCH_STEPS = 25 * 4  # env steps of one sample batch: sample_batch_size x num_envs_per_worker


def read_events(logdir: Path) -> event_accumulator.EventAccumulator:
    """Every event under `logdir` (TensorBoard's default keeps only a sample of them)."""
    acc = event_accumulator.EventAccumulator(
        str(logdir), size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    return acc


def values(acc: event_accumulator.EventAccumulator, tag: str) -> list[tuple[int, object]]:
    return [(e.step, tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)]


def plugin(acc: event_accumulator.EventAccumulator, tag: str) -> str:
    return acc.SummaryMetadata(tag).plugin_data.plugin_name


def lag_counts(acc: event_accumulator.EventAccumulator) -> list[tuple[int, int]]:
    """(step, values in the histogram) of each policy-lag histogram; buckets are [left, right,
    count] rows."""
    return [(step, round(float(h[:, 2].sum()))) for step, h in values(acc, LAG_TAG)]


def test_scalar_tags_join_nested_keys_with_a_slash_and_keep_only_finite_numbers():
    snapshot = {"num_steps_sampled": 400, "episode_return_mean": math.nan,
                "timing_breakdown": {"learner_grad_time_ms": 2.5},
                "pipeline": {"in_flight": {"0": 2}, "backend": "inline",
                             "minibatch_slots": [[False, 0]]},
                "workers": [{"index": 0, "samples": 3, "stalled": False},
                            {"index": 3, "samples": 1, "stalled": True}],
                "health": {"status": "ok", "flags": [{"code": "x", "since_s": 1.0}]},
                "last_error": None, "learner": {"entropy": np.float32(0.5), "v": math.inf}}
    assert scalar_tags(snapshot) == {
        "num_steps_sampled": 400.0, "timing_breakdown/learner_grad_time_ms": 2.5,
        "pipeline/in_flight/0": 2.0, "workers/0/samples": 3.0, "workers/0/stalled": 0.0,
        "workers/3/samples": 1.0, "workers/3/stalled": 1.0, "learner/entropy": 0.5}


def test_knob_change_text_names_the_knob_value_time_and_step():
    change = {"time_s": 12.34, "num_steps_sampled": 48000, "knob": "lr", "value": 0.001}
    assert knob_change_text(change) == "`lr` set to 0.001 at 12.3 s (env step 48,000)"


def test_the_writer_writes_scalars_text_and_a_lag_histogram_per_report(tmp_path):
    changes: list[dict] = []
    lags = iter([[], [1.0, 2.0, 2.0], [0.0]])
    writer = TensorBoardWriter(tmp_path, knob_changes=changes, policy_lags=lambda: next(lags))
    writer.write({"num_steps_sampled": 0, "policy_lag": {"mean": math.nan, "max": 0}})
    changes.append({"time_s": 1.0, "num_steps_sampled": 250, "knob": "lr", "value": 0.01})
    changes.append({"time_s": 1.5, "num_steps_sampled": 280, "knob": "num_sgd_iter", "value": 2})
    hook_seen = []
    writer.hook(hook_seen.append)({"num_steps_sampled": 300, "policy_lag": {"mean": 1.5}})
    with writer:
        writer.write({"num_steps_sampled": 300, "policy_lag": {"mean": 1.0, "max": 2},
                      "stop_reason": "max_env_steps"})
    writer.close()  # a second close does nothing
    with pytest.raises(ValueError, match="closed"):
        writer.write({"num_steps_sampled": 400})
    assert hook_seen == [{"num_steps_sampled": 300, "policy_lag": {"mean": 1.5}}]

    acc = read_events(tmp_path)
    assert plugin(acc, "policy_lag/mean") == "scalars"
    assert [(s, float(v)) for s, v in values(acc, "policy_lag/mean")] == [(300, 1.5), (300, 1.0)]
    assert [(s, float(v)) for s, v in values(acc, "policy_lag/max")] == [(0, 0.0), (300, 2.0)]
    assert plugin(acc, "knob_changes") == "text"
    assert [(s, v.item().decode()) for s, v in values(acc, "knob_changes")] == [
        (250, "`lr` set to 0.01 at 1.0 s (env step 250)"),
        (280, "`num_sgd_iter` set to 2 at 1.5 s (env step 280)")]
    assert plugin(acc, LAG_TAG) == "histograms"
    assert lag_counts(acc) == [(0, 0), (300, 3), (300, 1)]


def test_impala_train_writes_every_report_and_the_final_stats(tmp_path):
    from impala_lab import Impala

    logdir = tmp_path / "tb"
    reports: list[dict] = []

    def on_report(s: dict) -> None:
        reports.append(s)
        if len(reports) == 2:
            run.set_knobs(lr=0.002)

    with Impala(SMALL) as run:
        # Stopped by the number of reports, not by env steps: a loaded machine reports less often.
        final = run.train(lambda s: len(reports) >= 4, max_env_steps=2_000_000,
                          report_interval=0.2, on_report=on_report, tensorboard_dir=logdir)
        rows = run.history.rows()
        change = run.knob_changes[0]
    assert len(reports) >= 2 and len(rows) == len(reports) + 1
    acc = read_events(logdir)
    steps = [int(r["num_steps_sampled"]) for r in rows]
    assert [s for s, _ in values(acc, "num_steps_sampled")] == steps
    assert float(values(acc, "knobs/lr")[-1][1]) == np.float32(0.002)
    assert [(s, v.item().decode()) for s, v in values(acc, "knob_changes")] == [
        (change["num_steps_sampled"], knob_change_text(change))]
    # A histogram per report and one for the final stats: one lag per batch since the last.
    assert lag_counts(acc) == [(s, (s - prev) // BATCH_STEPS)
                               for prev, s in zip([0, *steps], steps, strict=False)]
    assert final["num_steps_sampled"] == steps[-1]


def test_cli_tensorboard_matches_metrics_csv(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(
        [sys.executable, "-m", "impala_lab.cli", "train", "--backend", "inline",
         "--num-workers", "2", "--num-envs-per-worker", "4", "--sample-batch-size", "25",
         "--train-batch-size", "100", "--max-env-steps", "20000", "--report-interval", "0.1",
         "--seed", "3", "--quiet", "--tensorboard", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    acc = read_events(out / "tensorboard")
    steps = [int(r["num_steps_sampled"]) for r in rows]
    assert len(rows) >= 2  # a report and the final stats, however loaded the machine is

    def number(text: str) -> float | None:
        try:
            return float(text)
        except ValueError:
            return None

    numeric = [c for c in rows[0] if c != "time"
               and all(r[c] == "" or number(r[c]) is not None for r in rows)
               and any(r[c] != "" for r in rows)]
    assert {"episode_return_mean", "learner.entropy", "policy_lag.mean",
            "timing_breakdown.learner_grad_time_ms", "knobs.lr"} <= set(numeric)
    for column in numeric:  # each finite value, as float32, at the row's env step, in order
        expected = [(step, np.float32(number(r[column]))) for step, r in zip(steps, rows,
                                                                               strict=True)
                    if r[column] != "" and math.isfinite(number(r[column]))]
        got = [(step, v.item()) for step, v in values(acc, column.replace(".", "/"))]
        assert got == expected, column
    # metrics.csv's time column is the event's wall time (both stamped at the report)
    walls = [e.wall_time for e in acc.Tensors("num_steps_sampled")]
    assert np.allclose(walls, [float(r["time"]) for r in rows], atol=1.0)
    assert lag_counts(acc) == [(s, (s - prev) // BATCH_STEPS)
                               for prev, s in zip([0, *steps], steps, strict=False)]


def test_a_failed_write_turns_the_writer_off_with_one_warning(tmp_path, caplog):
    caplog.set_level("WARNING", logger="impala_lab")
    writer = TensorBoardWriter(tmp_path / "tb")
    writer.write({"num_steps_sampled": 1, "x": 1.0})

    def full_disk() -> None:
        raise OSError(28, "No space left on device")

    writer._writer.flush = full_disk
    writer.write({"num_steps_sampled": 2, "x": 2.0})  # does not raise: the run goes on
    writer.write({"num_steps_sampled": 3, "x": 3.0})
    warnings = [r for r in caplog.records if "TensorBoard summaries are off" in r.message]
    assert len(warnings) == 1 and "No space left on device" in warnings[0].message
    assert writer.failed == "OSError: [Errno 28] No space left on device"
    writer.close()
