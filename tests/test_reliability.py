"""Reliability, end to end through the `Impala` driver: faults, bad input, sockets, a soak.

Each fault test runs a small run (process workers where the fault is about processes) and
then checks that the fault was recovered from or raised with the stage, env and step named,
that nothing hung, and that no child process or thread of the run is left (`tests.leaks`).
The CLI's SIGINT/SIGTERM checks live in test_lifetimes.py; saving and restoring a checkpoint
in test_checkpoint_restore.py.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from impala_lab import Impala, ImpalaConfig
from impala_lab.errors import ConfigError, ImpalaError, LearnerError, WorkerError
from tests.envs import FixedLengthEnv, NaNEnv, RaisingEnv, SlowEnv
from tests.leaks import children_of, no_leaks

REPO = Path(__file__).resolve().parents[1]
# Small process runs: 2 workers x 2 envs x 10 steps per sample, a train batch of 2 samples.
SMALL = dict(backend="process", num_workers=2, num_envs_per_worker=2, sample_batch_size=10,
             train_batch_size=40, model=(16,), seed=0)


def spy_on_returns(run: Impala) -> collections.Counter:
    """Count the samples each worker (by index) returns to the driver from now on."""
    returned: collections.Counter = collections.Counter()
    send = run.loop.send_weights_and_request

    def spy(worker, initial: bool = False) -> None:
        if not initial:  # called once per returned sample, with the worker that sent it
            returned[worker.index] += 1
        send(worker, initial)

    run.loop.send_weights_and_request = spy
    return returned


# ---------------------------------------------------------------------- 1. faults
def test_a_worker_killed_with_sigkill_is_replaced_and_its_replacement_samples(caplog):
    caplog.set_level(logging.WARNING, logger="impala_lab")
    with no_leaks(), Impala(ImpalaConfig(env="CartPole-v1", **SMALL)) as run:
        run.train(max_env_steps=400)
        victim = run.workers[0]
        returned = spy_on_returns(run)
        os.kill(victim.pid, signal.SIGKILL)
        result = run.train(lambda s: returned[2] >= 3, max_seconds=60, report_interval=0.05)
        assert result["stop_reason"] == "stop condition", dict(returned)
        assert result["num_worker_failures"] == 1
        assert sorted(w.index for w in run.workers) == [1, 2]
        assert returned[1] > 0  # the other worker never stopped
        assert sorted(run.backend.worker_pids()) == sorted(w.pid for w in run.workers)
        assert victim.exitcode == -signal.SIGKILL
        pids = run.backend.worker_pids()
    # the failure and the restart are in the output, naming the signal
    text = caplog.text
    assert "worker 0" in text and "SIGKILL" in text and "replaced by worker 2" in text
    assert not any(p in children_of(os.getpid()) for p in pids)


def test_an_env_that_raises_every_n_steps_is_restarted_and_counted(caplog):
    caplog.set_level(logging.WARNING, logger="impala_lab")
    # each worker process fails at its envs' 25th step: in its 3rd sample of 10 steps
    env = functools.partial(RaisingEnv, every=25, length=7)
    with no_leaks(), Impala(ImpalaConfig(env=env, **SMALL)) as run:
        result = run.train(max_env_steps=400, max_seconds=90)
        assert result["stop_reason"] == "max_env_steps"
        assert result["num_steps_sampled"] >= 400
        # 400 steps need 20 samples, 2 per worker process: at least 8 processes failed
        assert result["num_worker_failures"] >= 8
        assert len(run.workers) == 2
    assert caplog.text.count("boom at step 25") == result["num_worker_failures"]


def test_an_env_that_raises_ends_the_run_with_its_traceback_when_restarts_are_off():
    env = functools.partial(RaisingEnv, every=25, length=7)
    cfg = ImpalaConfig(env=env, restart_failed_workers=False, **SMALL)
    with no_leaks(), Impala(cfg) as run, pytest.raises(WorkerError) as info:
        run.train(max_seconds=60)
    err = info.value
    assert err.env_id == "RaisingEnv" and err.worker_index in (0, 1)
    assert "RuntimeError: boom at step 25" in str(err)
    assert "raise RuntimeError" in err.remote_traceback  # the env's own line
    assert run.num_worker_failures == 1


@pytest.mark.parametrize("restart", [False, True])
def test_nan_observations_are_a_clear_error_naming_the_env_and_step(restart):
    env = functools.partial(NaNEnv, at_step=7)
    cfg = ImpalaConfig(env=env, restart_failed_workers=restart, **SMALL)
    expected = WorkerError if not restart else ImpalaError
    with no_leaks(), Impala(cfg) as run, pytest.raises(expected) as info:
        run.train(max_seconds=60)
    text = str(info.value)
    assert "env 'NaNEnv'" in text and "non-finite observation at env step 7" in text
    assert "NaN loss" in text  # says why it stops here
    if restart:  # every replacement fails the same way before a sample: restarting stops
        assert "times in a row without returning a sample" in text
        assert run.num_worker_failures == 4


def test_an_env_slower_than_learner_queue_timeout_raises_the_learners_timeout():
    env = functools.partial(SlowEnv, delay_s=0.3, length=5)  # a sample takes 3 s
    cfg = ImpalaConfig(env=env, learner_queue_timeout=1.0, **SMALL)
    start = time.monotonic()
    with no_leaks(), Impala(cfg) as run, pytest.raises(LearnerError) as info:
        run.train(max_seconds=60)
    assert time.monotonic() - start < 30
    text = str(info.value)
    assert info.value.stage == "learner thread"
    assert "learner_queue_timeout" in text and "1.0" in text


def test_a_learner_thread_exception_ends_train_with_the_original_traceback():
    with no_leaks(), Impala(ImpalaConfig(env="CartPole-v1", **SMALL)) as run:
        learn = run.policy.learn_on_batch
        calls = []

        def flaky_learn(batch):
            calls.append(batch.count)
            if len(calls) == 3:
                raise ArithmeticError("gradient blew up on purpose")
            return learn(batch)

        run.policy.learn_on_batch = flaky_learn
        with pytest.raises(LearnerError) as info:
            run.train(max_seconds=60)
        assert run.learner.num_steps == 2  # the two steps before the failure
        assert run.num_steps_trained <= 2 * 40
        assert not run.learner.is_alive()
    assert info.value.stage == "learner thread"
    assert "ArithmeticError: gradient blew up on purpose" in str(info.value)
    assert "in flaky_learn" in info.value.remote_traceback


def test_a_loader_thread_exception_ends_train_with_the_loader_named():
    # num_data_loader_buffers=2 selects the MultiGPULearner (on /cpu:0, no fake devices)
    cfg = ImpalaConfig(env="CartPole-v1", num_data_loader_buffers=2, **SMALL)
    with no_leaks(), Impala(cfg) as run:
        stage = run.learner.stage_batch
        calls = []

        def flaky_stage(batch):
            calls.append(batch.count)
            if len(calls) == 3:
                raise MemoryError("device buffer full on purpose")
            return stage(batch)

        run.learner.stage_batch = flaky_stage
        with pytest.raises(LearnerError) as info:
            run.train(max_seconds=60)
        assert len(calls) == 3  # the loaders stage ahead: it failed on the third batch
        assert run.num_steps_trained <= 2 * 40
        threads = [run.learner, *run.learner.loader_threads]
    assert info.value.stage == "loader thread 0"
    assert "MemoryError: device buffer full on purpose" in str(info.value)
    assert "in flaky_stage" in info.value.remote_traceback
    assert not any(t.is_alive() for t in threads)


def test_the_leak_check_sees_a_left_process_and_a_left_thread():
    left = r"child processes left behind: \[\d+\]"
    with pytest.raises(AssertionError, match=left), no_leaks(timeout=0.2):
        proc = subprocess.Popen(["sleep", "30"])
    try:
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
    release = threading.Event()
    try:
        left = r"threads left behind: \['stray'\]"
        with pytest.raises(AssertionError, match=left), no_leaks(timeout=0.2):
            threading.Thread(target=release.wait, name="stray", daemon=True).start()
    finally:
        release.set()


# ---------------------------------------------------------------------- 2. bad input
def cli_options() -> list[str]:
    """Every option of ``impala-lab train`` but --help and --out (the test sets --out)."""
    from impala_lab.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return [o for a in sub.choices["train"]._actions for o in a.option_strings
            if o not in ("-h", "--help", "--out")]


_SPECIAL = ["nan", "-nan", "inf", "-inf", "1e400", "-1", "0", "1", "2", "0.5", "-0.0", "None",
            "none", "true", "false", "", " ", "64,64", "0,0", "1,,", "CartPole-v1", "Pendulum-v1",
            "process", "inline", "ray", "rmsprop", "tuned", "rllib", "--lr", "-", "１２", "٣",
            "\u00e9t\u00e9", "\U0001f600", "10" * 40, "0x10", "1_000", "+5"]
_value = st.one_of(
    st.sampled_from(_SPECIAL),
    st.integers(-(10**30), 10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=10),
)
_option = st.sampled_from([o for o in cli_options() if o != "--quiet"])
_argument = st.one_of(
    st.tuples(_option, _value).map(list),  # an option and its value
    st.tuples(_option, _value).map(lambda ov: [f"{ov[0]}={ov[1]}"]),  # --option=value
)
# Now and then a malformed argument: a flag given a value, an unknown option, a stray word,
# an option without its value (argparse's own errors, also exit code 2).
_malformed = st.one_of(
    st.just([]),
    st.sampled_from([["--quiet=1"], ["--num-wrokers", "2"], ["--LR", "1"], ["-x"], ["stray"],
                     ["--lr"], ["--preset", "fast"], ["--quiet"]]),
)


class _Started(Exception):
    """Raised by the stand-in for `Impala`: the input passed every check and training
    would start now (nothing is trained in this test)."""

    def __init__(self, config: ImpalaConfig) -> None:
        self.config = config


class _NoTraining:
    def __init__(self, config: ImpalaConfig) -> None:
        raise _Started(config)


@settings(max_examples=200, deadline=5000,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(arguments=st.lists(_argument, max_size=4), malformed=_malformed)
def test_the_cli_turns_any_argv_into_exit_2_with_a_message_or_a_valid_run(
        arguments: list[list[str]], malformed: list[str],
        tmp_path_factory: pytest.TempPathFactory) -> None:
    from impala_lab.cli.main import main

    argv = ["train", *[token for arg in arguments for token in arg], *malformed,
            "--out", str(tmp_path_factory.getbasetemp() / "cli-fuzz")]
    err, out = io.StringIO(), io.StringIO()
    handler = signal.getsignal(signal.SIGTERM)
    started = None
    with mock.patch("impala_lab.driver.impala.Impala", _NoTraining), \
            contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: an unknown option, a missing value
            code = exc.code
        except _Started as exc:
            code, started = None, exc.config
    assert signal.getsignal(signal.SIGTERM) == handler  # the CLI put its handler back
    text = err.getvalue()
    assert "Traceback" not in text, (argv, text)
    if started is not None:  # valid input: a config that round-trips
        assert ImpalaConfig.from_dict(started.to_dict()) == started
        return
    assert code == 2, (argv, code, text)
    message = text.strip().splitlines()[-1]
    assert message.startswith("impala-lab") and "error: " in message, (argv, text)


# Box actions (Pendulum-v1) are supported since the Gaussian policy (tests/test_gaussian.py
# has the refused action spaces: MultiDiscrete, MultiBinary, Dict, Tuple).
@pytest.mark.parametrize("env, space", [
    ("FrozenLake-v1", r"observation space Discrete\(16\) is not supported"),
    ("Blackjack-v1", r"observation space Tuple\(Discrete\(32\), .*\) is not supported"),
])
def test_an_unsupported_env_space_exits_2_naming_it_before_anything_starts(
        env, space, tmp_path, capsys):
    from impala_lab.cli.main import main

    with no_leaks():
        code = main(["train", "--env", env, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2
    assert re.search(rf"impala-lab: error: env='{env}' is invalid: its {space}", err), err
    assert "Traceback" not in err
    assert not (tmp_path / "run" / "result.json").exists()


def test_an_unsupported_space_from_a_factory_is_a_config_error():
    import gymnasium as gym

    class DictObsEnv(FixedLengthEnv):
        def __init__(self) -> None:
            super().__init__()
            self.observation_space = gym.spaces.Dict({"x": self.observation_space})

    with no_leaks(), pytest.raises(ConfigError) as info:
        Impala(ImpalaConfig(env=DictObsEnv, **SMALL))
    text = str(info.value)
    assert "env='factory:" in text and "DictObsEnv" in text
    assert "observation space Dict('x': Box(" in text and "FlattenObservation" in text


def test_an_env_that_cannot_be_made_is_a_config_error_naming_the_cause():
    def broken() -> None:
        raise ModuleNotFoundError("No module named 'Box2D'")

    with no_leaks(), pytest.raises(ConfigError) as info:
        Impala(ImpalaConfig(env=broken, **SMALL))
    assert "could not be made (ModuleNotFoundError: No module named 'Box2D')" in str(info.value)


# ---------------------------------------------------------------------- 3. safe defaults
def _address(hex_addr: str) -> str:
    """/proc/net's ``HEXIP:HEXPORT`` as ``ip`` (IPv4 or IPv6, in the kernel's byte order)."""
    import ipaddress

    ip = hex_addr.split(":")[0]
    if len(ip) == 8:
        return str(ipaddress.IPv4Address(bytes.fromhex(ip)[::-1]))
    words = [bytes.fromhex(ip[i:i + 8])[::-1] for i in range(0, 32, 8)]
    return str(ipaddress.IPv6Address(b"".join(words)))


def open_server_sockets(pids: list[int]) -> list[tuple[int, str, str]]:
    """(pid, protocol, local address) of every listening TCP and bound unconnected UDP
    socket the processes ``pids`` hold."""
    owner = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    owner[link[8:-1]] = pid
        except (FileNotFoundError, PermissionError):
            continue
    found = []
    for proto, server_state in (("tcp", "0A"), ("tcp6", "0A"), ("udp", "07"), ("udp6", "07")):
        try:
            lines = Path(f"/proc/net/{proto}").read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == server_state and cols[9] in owner:
                found.append((owner[cols[9]], proto, _address(cols[1])))
    return found


def is_loopback(address: str) -> bool:
    import ipaddress

    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def test_a_process_run_opens_no_server_socket_reachable_from_outside(tmp_path):
    import socket

    me = os.getpid()
    # the check sees a server socket on all interfaces (so it can fail) ...
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        probe.listen()
        assert any(pid == me and not is_loopback(addr)
                   for pid, _, addr in open_server_sockets([me]))
    exposed_before = [s for s in open_server_sockets([me]) if not is_loopback(s[2])]
    # ... and a whole process run (driver, learner, workers, a checkpoint) opens none
    with Impala(ImpalaConfig(env="CartPole-v1", **SMALL)) as run:
        run.train(max_env_steps=2000)
        workers = run.backend.worker_pids()
        assert len(workers) == 2
        sockets = open_server_sockets([me, *workers])
        run.save(tmp_path / "ckpt")
    assert [s for s in sockets if s[0] in workers] == []  # workers: no server at all
    exposed = [s for s in sockets if not is_loopback(s[2]) and s not in exposed_before]
    assert exposed == [], exposed


# ---------------------------------------------------------------------- 4. soak
def soak_record(seconds: float = 100.0, **changes) -> dict:
    """A synthetic `bench.soak.soak` record: flat figures, one sample per second."""
    samples = [{"t": float(t), "driver_rss_mb": 600.0, "workers_rss_mb": 90.0,
                "total_rss_mb": 690.0, "learner_queue_len": 3, "replay_stored": 0,
                "batch_buffer_steps": 100, "max_in_flight": 2, "threads": 2, "open_fds": 19,
                "child_processes": 2, "num_steps_sampled": 1000 * t, "num_worker_failures": 0}
               for t in range(int(seconds) + 1)]
    config = ImpalaConfig.tuned("CartPole-v1").to_dict()
    record = {"config": config, "seconds": seconds, "samples": samples, "threads_before": 1,
              "threads_after_stop": 1, "children_after_stop": []}
    record.update(changes)
    return record


def failed_checks(record: dict) -> list[str]:
    from bench.soak import analyse

    return [c["name"] for c in analyse(record)["checks"] if c["status"] == "FAIL"]


def test_the_soak_checks_fail_on_growth_overflow_and_leaks():
    assert failed_checks(soak_record(200.0)) == []
    grown = soak_record(200.0)
    for s in grown["samples"]:  # the driver grows linearly: +20% by the end
        s["driver_rss_mb"] = 600.0 * (1 + 0.2 * s["t"] / 200.0)
        s["total_rss_mb"] = s["driver_rss_mb"] + 90.0
    assert failed_checks(grown) == ["total rss growth <= 10%", "driver rss growth <= 10%"]
    short = soak_record(30.0, samples=grown["samples"][:31])  # too short to judge RSS
    assert failed_checks(short) == []
    over = soak_record(200.0)
    size = over["config"]["learner_queue_size"]
    over["samples"][50]["learner_queue_len"] = size + 1
    over["samples"][-1]["threads"] = 3
    assert failed_checks(over) == [f"learner_queue_len <= {size}", "threads end <= after warm-up"]
    leaked = soak_record(200.0, children_after_stop=[4242], threads_after_stop=2)
    assert failed_checks(leaked) == ["no child process after stop",
                                     "threads after stop <= before the run"]


@pytest.mark.slow
def test_a_short_soak_run_passes_its_leak_and_bound_checks(tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, "-m", "bench.soak", "--seconds", "20", "--out",
                           str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "soak.json").read_text())
    assert (tmp_path / "soak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    samples = report["samples"]
    assert len(samples) >= 10
    assert set(samples[0]) >= {"t", "driver_rss_mb", "worker_rss_mb", "workers_rss_mb",
                               "total_rss_mb", "learner_queue_len", "replay_stored",
                               "batch_buffer_steps", "max_in_flight", "threads", "open_fds",
                               "child_processes"}
    assert len(samples[-1]["worker_rss_mb"]) == 2
    assert all(s["child_processes"] == 2 for s in samples)  # the two workers, no more
    assert samples[-1]["num_steps_sampled"] > 0
    figures = report["figures"]
    assert figures["total_rss_after_warmup_mb"] > figures["driver_rss_after_warmup_mb"] > 0
    assert report["children_after_stop"] == []
    status = {c["name"]: c["status"] for c in report["checks"]}
    # 20 s is too short to judge RSS growth: reported only; every other check must pass
    assert status.pop("total rss growth <= 10%") == "INFO"
    assert status.pop("driver rss growth <= 10%") == "INFO"
    assert set(status.values()) == {"PASS"}, report["checks"]
    assert report["passed"] is True
    assert "no child process after stop" in proc.stdout and "PASS" in proc.stdout
