"""Worker faults the driver must notice and bound: a hung worker, the same failure
coming back after samples, a run that samples nothing, and what these look like in the stats,
the health flags, the progress line, the dashboard's diagram and the CLI's exit code.

Hung workers: `tests.envs.HangOnceEnv` blocks in ``step()`` in exactly one env of a run, so
one worker hangs and its replacement samples on. Repeated failures: `tests.envs.WrongObsEnv`
returns a (1, 4) observation from each env's 15th step, i.e. in every worker's second sample
of 10 steps, after its first sample returned.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import signal
import xml.etree.ElementTree as ET

import pytest

import impala_lab.driver.health as health
import impala_lab.driver.impala
import impala_lab.driver.supervisor
from impala_lab import Impala, ImpalaConfig
from impala_lab.cli.main import main
from impala_lab.dashboard import diagram, terminal
from impala_lab.errors import ImpalaError, WorkerError
from tests.envs import HangOnceEnv, SlowEnv, WrongObsEnv
from tests.leaks import no_leaks
from tests.test_reliability import spy_on_returns

# Small runs: 2 workers x 2 envs x 10 steps per sample, a train batch of 2 samples.
SMALL = dict(num_workers=2, num_envs_per_worker=2, sample_batch_size=10, train_batch_size=40,
             model=(16,), seed=0)
WRONG_AFTER_FIRST_SAMPLE = functools.partial(WrongObsEnv, kind="batched", at_step=15, length=5)


# ---------------------------------------------------------------------- hung workers
def test_a_hung_worker_is_ended_counted_logged_and_replaced(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="impala_lab")
    # one env of the run hangs at its 25th step: in its worker's third sample
    env = functools.partial(HangOnceEnv, marker=str(tmp_path / "hung"), at_step=25, length=7)
    # A roomy learner queue: while the driver waits on a full one (the learner's first trace
    # takes seconds), no worker is marked stalled, and the hang would go unmarked until the end.
    cfg = ImpalaConfig(env=env, backend="process", sample_timeout_s=2.0,
                       **{**SMALL, "learner_queue_size": 1000})
    snapshots = []
    with no_leaks(), Impala(cfg) as run:
        first = list(run.workers)
        returned = spy_on_returns(run)
        result = run.train(lambda s: returned[2] >= 3, max_seconds=60, report_interval=0.05,
                           on_report=snapshots.append)
        assert result["stop_reason"] == "stop condition", dict(returned)
        assert result["num_worker_failures"] == 1
        (hung,) = [w for w in first if w not in run.workers]
        (other,) = [w for w in first if w in run.workers]
        assert returned[other.index] > 0  # the other worker never stopped
        assert hung.exitcode == -signal.SIGTERM  # blocked in step(): terminated, reaped
        workers = {w["index"]: w for w in result["workers"]}
        assert set(workers) == {other.index, 2} and workers[2]["samples"] >= 3
        assert all(w["seconds_since_sample"] < 2.0 for w in workers.values())
    # on its way there the stats, the health flag and the diagram marked the hung worker
    # (at 0.5 s, a quarter of sample_timeout_s: the replacement may be marked while it starts)
    marked = [s for s in snapshots
              if any(w["stalled"] and w["index"] == hung.index for w in s["workers"])]
    assert marked, "no snapshot marked the hung worker stalled"
    snap = marked[-1]
    (stalled,) = [w for w in snap["workers"] if w["index"] == hung.index]
    assert stalled["seconds_since_sample"] >= health.stalled_after_s(2.0) == 0.5
    assert not [w for w in snap["workers"] if w["index"] == other.index and w["stalled"]]
    assert "worker_stalled" in health.flag_codes(snap["health"])
    message = next(f["message"] for f in snap["health"]["flags"] if f["code"] == "worker_stalled")
    assert re.match(rf"worker stalled: workers? (\d \(\d+\.\d s\), )?{hung.index} \(", message)
    assert "sample_timeout_s=2 ends and replaces such a worker" in message
    svg = ET.fromstring(diagram.pipeline_svg(snap))
    texts = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")
             if t.get("class") == "impala-worker-stalled"]
    assert texts and all(t.startswith("stalled ") for t in texts)
    # the log names the worker, the timeout and the replacement
    text = caplog.text
    assert f"worker {hung.index} (env HangOnceEnv) failed: it owed a sample for " in text
    assert "longer than sample_timeout_s=2: its env may hang in step() or reset()" in text
    assert f"the worker (process {hung.pid}) was ended; replaced by worker 2" in text


def test_a_hung_worker_ends_the_run_naming_it_and_the_timeout_when_restarts_are_off(tmp_path):
    env = functools.partial(HangOnceEnv, marker=str(tmp_path / "hung"), at_step=25, length=7)
    cfg = ImpalaConfig(env=env, backend="process", sample_timeout_s=2.0,
                       restart_failed_workers=False, **SMALL)
    with no_leaks(), Impala(cfg) as run, pytest.raises(WorkerError) as info:
        run.train(max_seconds=60)
    err = info.value
    assert err.worker_index in (0, 1) and err.env_id == "HangOnceEnv"
    assert str(err).startswith(f"worker {err.worker_index} (env HangOnceEnv) failed: it owed a "
                               "sample for ")
    assert "longer than sample_timeout_s=2: its env may hang in step() or reset()" in str(err)
    assert run.num_worker_failures == 1


def test_sample_timeout_s_is_validated_and_none_waits_forever():
    assert ImpalaConfig().sample_timeout_s == 60.0
    assert ImpalaConfig(sample_timeout_s=None).sample_timeout_s is None
    for bad in (0, -1.0, float("nan"), float("inf"), "60", True):
        with pytest.raises(ValueError, match=r"^sample_timeout_s="):
            ImpalaConfig(sample_timeout_s=bad)
    assert health.stalled_after_s(60.0) == 15.0
    assert health.stalled_after_s(None) == health.WORKER_STALLED_S


def test_an_inline_run_never_ends_a_slow_worker():
    # Inline workers sample inside the driver's call: there is no request to owe. A sample
    # slower than sample_timeout_s is only slow (a hung inline env hangs the driver itself).
    cfg = ImpalaConfig(env=functools.partial(SlowEnv, delay_s=0.02), backend="inline",
                       sample_timeout_s=0.1, **SMALL)  # a sample takes 0.4 s
    with Impala(cfg) as run:
        result = run.train(max_env_steps=80, max_seconds=60)
    assert result["stop_reason"] == "max_env_steps"
    assert result["num_worker_failures"] == 0


# ---------------------------------------------------------------------- repeated failures
def test_the_same_failure_after_samples_ends_an_inline_run_with_that_error():
    # The failures-in-a-row counter resets at every sample, so this restarted forever (2,130
    # restarts in 6 s) and train() ended at max_seconds.
    cfg = ImpalaConfig(env=WRONG_AFTER_FIRST_SAMPLE, backend="inline", **SMALL)
    with no_leaks(), Impala(cfg) as run, pytest.raises(ImpalaError) as info:
        returned = spy_on_returns(run)
        run.train(max_seconds=20)
    text = str(info.value)
    limit = impala_lab.driver.supervisor.MAX_REPEATED_WORKER_FAILURES
    assert text.startswith(f"the same worker failure came back {limit} times within 600 s "
                           "(env WrongObsEnv)")
    assert "returned an observation of shape (1, 4)" in text and "env step 15" in text
    assert run.num_worker_failures == limit
    # samples came between the failures: each worker returned its first one
    assert sum(returned.values()) >= limit - 2


def test_the_same_failure_after_samples_ends_a_process_run_with_that_error(monkeypatch):
    # a short test
    monkeypatch.setattr(impala_lab.driver.supervisor, "MAX_REPEATED_WORKER_FAILURES", 6)
    cfg = ImpalaConfig(env=WRONG_AFTER_FIRST_SAMPLE, backend="process", **SMALL)
    with no_leaks(), Impala(cfg) as run, pytest.raises(ImpalaError) as info:
        returned = spy_on_returns(run)
        run.train(max_seconds=60)
    text = str(info.value)
    assert text.startswith("the same worker failure came back 6 times within 600 s "
                           "(env WrongObsEnv)")
    assert "returned an observation of shape (1, 4)" in text
    assert run.num_worker_failures == 6 and sum(returned.values()) >= 4


def test_different_failures_and_old_ones_do_not_add_up(monkeypatch):
    cfg = ImpalaConfig(backend="inline", **SMALL)
    with Impala(cfg, start_learner=False) as run:
        def fail(message: str, env: str = "E") -> int:
            return run.supervisor.count_repeats(WorkerError(0, env, message))

        # the numbers in a message (pids, steps, seconds) do not make a failure new
        assert [fail("RuntimeError: boom at step 25 (pid 123)") for _ in range(2)] == [1, 2]
        assert fail("RuntimeError: boom at step 50 (pid 4567)") == 3
        assert fail("KeyError: 'x'") == 1 and fail("RuntimeError: boom at step 1", "F") == 1
        clock = [impala_lab.driver.supervisor.time.monotonic()]
        monkeypatch.setattr(impala_lab.driver.supervisor.time, "monotonic", lambda: clock[0])
        assert fail("KeyError: 'x'") == 2
        # the window slides on
        clock[0] += impala_lab.driver.supervisor.REPEATED_FAILURE_WINDOW_S + 1
        assert fail("KeyError: 'x'") == 1


def test_the_cli_exits_1_with_the_repeated_error_in_result_json(tmp_path, capsys):
    import gymnasium as gym

    if "ImpalaLabWrongObs-v0" not in gym.registry:
        gym.register("ImpalaLabWrongObs-v0", entry_point="tests.envs:WrongObsEnv",
                     kwargs={"kind": "batched", "at_step": 15, "length": 5})
    out = tmp_path / "run"
    code = main(["train", "--env", "ImpalaLabWrongObs-v0", "--backend", "inline",
                 "--num-workers", "2", "--num-envs-per-worker", "2",
                 "--sample-batch-size", "10", "--train-batch-size", "40", "--model", "16",
                 "--max-seconds", "20", "--quiet", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    assert "impala-lab: error: ImpalaError: the same worker failure came back" in err
    result = json.loads((out / "result.json").read_text())
    assert result["stop_reason"] == "error"
    assert result["error"].startswith("ImpalaError: the same worker failure came back 20 times")
    assert "returned an observation of shape (1, 4)" in result["error"]
    assert result["final"]["num_worker_failures"] == 20


# ---------------------------------------------------------------------- no samples at all
def test_a_cli_run_that_sampled_nothing_exits_1_and_says_so(tmp_path, capsys, monkeypatch):
    # Every env hangs in its first step: before, --max-seconds ended the run with exit code 0
    # and "error": null.
    real = impala_lab.driver.impala.Impala
    monkeypatch.setattr(impala_lab.driver.impala, "Impala", lambda config: real(
        config, env_creator=functools.partial(SlowEnv, delay_s=3600.0)))
    monkeypatch.setattr(health, "NO_SAMPLES_S", 1.0)  # flag it within the short run
    out = tmp_path / "run"
    code = main(["train", "--backend", "process", "--num-workers", "1",
                 "--num-envs-per-worker", "1", "--model", "16", "--max-seconds", "3",
                 "--report-interval", "0.5", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 1
    assert "impala-lab: error: ImpalaError: no samples: no worker returned a sample" in (
        captured.err)
    lines = [line for line in captured.out.splitlines() if "steps " in line]
    assert lines and all(re.search(r"NO SAMPLES yet \(\d+\.\d s\)", line) for line in lines)
    assert "health: no samples" in lines[-1]
    result = json.loads((out / "result.json").read_text())
    assert result["stop_reason"] == "max_seconds"
    assert result["error"].startswith("ImpalaError: no samples: no worker returned a sample "
                                      "in the whole run (")
    assert "sample_timeout_s=60.0" in result["error"]
    assert result["final"]["last_error"] == result["error"]
    assert result["final"]["num_steps_sampled"] == 0
    assert "no_samples" in result["health"]["seen"]


# ---------------------------------------------------------------------- views
def stats(seconds_since_sample: float, workers: list[dict], sampled: int = 1000) -> dict:
    return {"time_total_s": 30.0, "num_steps_sampled": sampled, "sample_throughput": 0.0,
            "seconds_since_sample": seconds_since_sample, "workers": workers,
            "pipeline": {"in_flight": {"0": 2, "1": 2}, "max_in_flight": 2, "num_workers": 2}}


def test_the_health_monitor_flags_no_samples_and_stalled_workers_with_their_figures():
    monitor = health.HealthMonitor(2, 16)
    assert monitor.check(seconds_since_sample=9.9)["flags"] == []
    assert monitor.check(seconds_since_sample=float("nan"))["flags"] == []  # not training
    stalled = [{"index": 1, "seconds_since_sample": 21.04, "stalled": True}]
    out = monitor.check(seconds_since_sample=12.3, stalled_workers=stalled, sample_timeout_s=60)
    messages = {f["code"]: f["message"] for f in out["flags"]}
    assert messages == {
        "no_samples": "no samples: no worker's sample reached the driver for 12.3 s of training "
                      "(threshold 10 s); the envs may hang (sample_timeout_s=60 ends and "
                      "replaces such a worker) or every worker fails while starting",
        "worker_stalled": "worker stalled: worker 1 (21.0 s) sent no sample for at least 15 s; "
                          "its env may hang in step() or reset() (sample_timeout_s=60 ends and "
                          "replaces such a worker)"}
    assert health.flag_labels(out) == "no samples, worker stalled"
    two = [{"index": 0, "seconds_since_sample": 16.0}, {"index": 3, "seconds_since_sample": 30.0}]
    flag = monitor.check(stalled_workers=two, sample_timeout_s=None)["flags"][0]
    assert flag["message"].startswith("worker stalled: workers 0 (16.0 s), 3 (30.0 s) sent no "
                                      "sample for at least 15 s")
    assert "sample_timeout_s=None: it is never ended" in flag["message"]
    assert monitor.check()["flags"] == []  # both clear once the condition is gone


def test_the_progress_line_says_when_a_report_window_had_no_sample():
    import io

    out = io.StringIO()
    view = terminal.TerminalView(out, live=False)
    view.update(stats(0.01, [], sampled=0))  # none yet at the first report
    view.update(stats(0.01, [], sampled=400))
    view.update(stats(1.52, [], sampled=400))  # nothing since the previous report
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("NO SAMPLES yet (0.0 s)")
    assert "NO SAMPLES" not in lines[1]
    assert lines[2].endswith("NO SAMPLES since the last report (1.5 s since the last sample)")
    panel = terminal.render(stats(1.52, []), no_samples=True).splitlines()
    assert panel[1].strip() == "NO SAMPLES since the last report (1.5 s since the last sample)"


def test_the_diagram_marks_a_stalled_worker_and_shows_it_first():
    workers = [{"index": 0, "seconds_since_sample": 0.1, "stalled": False},
               {"index": 1, "seconds_since_sample": 21.4, "stalled": True}]
    svg = ET.fromstring(diagram.pipeline_svg(stats(0.1, workers)))
    texts = [t for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    marks = [t.text for t in texts if t.get("class") == "impala-worker-stalled"]
    assert marks == ["stalled 21 s"]
    labels = [t.text for t in texts if t.text in ("w0", "w1")]
    assert labels == ["w1", "w0"]  # the stalled worker first
    healthy = ET.fromstring(diagram.pipeline_svg(stats(0.1, workers[:1])))
    assert not [t for t in healthy.iter("{http://www.w3.org/2000/svg}text")
                if t.get("class") == "impala-worker-stalled"]
