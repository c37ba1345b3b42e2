"""The memory estimate at validation time: a config that would not fit is refused up front.

`ImpalaConfig.memory_estimate` adds up the learner queue, the batch buffer, the minibatch
ring, replay, the samples in flight and the learner's working set; validation refuses a config
whose estimate exceeds ``max_memory_gb`` (None: half of the available memory) with a
`ConfigError` naming the fields, before any process starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from unittest import mock

import gymnasium as gym
import numpy as np
import pytest

from impala_lab import Impala, ImpalaConfig, memory_budget
from impala_lab.actor.numpy_model import NumpyModel
from impala_lab.batch import SampleBatch, concat_samples
from impala_lab.errors import ConfigError
from impala_lab.memory_budget import (
    LSTM_STEP_BYTES_PER_UNIT,
    available_memory_bytes,
    lstm_weight_count,
)
from impala_lab.model_spec import ModelSpec
from tests.leaks import no_leaks

REPO = Path(__file__).resolve().parents[1]


def error_of(**kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        ImpalaConfig(**kwargs)
    return str(info.value)


@pytest.mark.parametrize("train_batch_size", [10**7, 10**9])
def test_the_cli_refuses_a_train_batch_that_cannot_fit_before_anything_starts(
        train_batch_size, tmp_path):
    # A queue of 16 batches (RLlib's, not the preset's 4) makes the queue the second part the
    # message must name.
    needed = ImpalaConfig.tuned(train_batch_size=train_batch_size, learner_queue_size=16,
                                max_memory_gb=1e12).memory_estimate()["total"]
    available = available_memory_bytes()
    if available is not None and needed <= available // 2:
        pytest.skip(f"this machine has {available / 1e9:.0f} GB available: "
                    f"train_batch_size={train_batch_size} fits in half of it")
    out = tmp_path / "run"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "impala_lab.cli", "train",
                           "--train-batch-size", str(train_batch_size),
                           "--learner-queue-size", "16", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    message = lines[0]
    assert message.startswith(f"impala-lab: error: train_batch_size={train_batch_size} is "
                              "invalid: this config would need at least ")
    for words in ("GB of memory", "learner working set", "learner queue",
                  "learner_queue_size", "half of the", "available (max_memory_gb=None)",
                  "lower train_batch_size", "or raise max_memory_gb"):
        assert words in message, (words, message)
    assert not out.exists()  # refused while the arguments were read: nothing written
    assert time.monotonic() - start < 60


def test_max_memory_gb_moves_the_limit_and_is_named():
    assert ImpalaConfig(train_batch_size=10**7, max_memory_gb=1000).train_batch_size == 10**7
    message = error_of(train_batch_size=10**7, max_memory_gb=10)
    assert "more than the limit of max_memory_gb=10" in message
    assert message.startswith("train_batch_size=10000000 is invalid")
    for value in (0, -1.0):
        assert error_of(max_memory_gb=value).startswith(f"max_memory_gb={value!r} is invalid")


def test_the_default_limit_is_half_the_available_memory():
    fits = ImpalaConfig(max_memory_gb=1000, train_batch_size=200_000).memory_estimate()["total"]
    with mock.patch("impala_lab.memory_budget.available_memory_bytes", return_value=2 * fits):
        ImpalaConfig(train_batch_size=200_000)  # exactly half: fits
    with mock.patch("impala_lab.memory_budget.available_memory_bytes", return_value=2 * fits - 2):
        message = error_of(train_batch_size=200_000)
    assert "(max_memory_gb=None)" in message and "half of the" in message
    with mock.patch("impala_lab.memory_budget.available_memory_bytes", return_value=None):
        ImpalaConfig(train_batch_size=10**9)  # unknown available memory: no limit


def test_the_field_that_grew_is_named_first():
    assert error_of(learner_queue_size=10**9).startswith("learner_queue_size=1000000000 is "
                                                         "invalid")
    # a worker sample larger than train_batch_size sets the train batch's size
    assert error_of(sample_batch_size=10**7).startswith("sample_batch_size=10000000 is invalid")
    message = error_of(replay_proportion=1.0, replay_buffer_num_slots=10**9)
    assert message.startswith("replay_buffer_num_slots=1000000000 is invalid")
    assert "replay " in message
    message = error_of(num_workers=10**5, max_sample_requests_in_flight_per_worker=10**3,
                       max_num_workers=10**6)
    assert message.startswith("num_workers=100000 is invalid")  # 50000x its default, not 500x
    assert "worker processes 4,500 GB (num_workers)" in message  # 45 MB each


def batch(T: int, B: int, obs_shape: tuple[int, ...], num_actions: int,
          obs_dtype=np.float32) -> SampleBatch:
    return SampleBatch(
        obs=np.zeros((T, B, *obs_shape), obs_dtype), actions=np.zeros((T, B), np.int64),
        rewards=np.zeros((T, B), np.float32), terminateds=np.zeros((T, B), bool),
        truncateds=np.zeros((T, B), bool), truncation_values=np.zeros((T, B), np.float32),
        behaviour_logits=np.zeros((T, B, num_actions), np.float32),
        bootstrap_obs=np.zeros((B, *obs_shape), obs_dtype),
        policy_versions=np.zeros(B, np.int64), episode_returns=np.zeros(0),
        episode_lengths=np.zeros(0, np.int64))


@pytest.mark.parametrize("space, actions", [
    (gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2)),
    (gym.spaces.Box(-1, 1, (17,), np.float64), gym.spaces.Discrete(5)),
    (gym.spaces.Box(0, 255, (84, 84, 4), np.uint8), gym.spaces.Discrete(6)),
])
def test_the_queue_and_replay_parts_are_the_bytes_of_real_batches(space, actions):
    c = ImpalaConfig(num_envs_per_worker=3, sample_batch_size=20, train_batch_size=130,
                     learner_queue_size=5, replay_buffer_num_slots=7,
                     max_memory_gb=1000)
    parts = c.memory_estimate(space, actions)
    obs_dtype = np.uint8 if space.dtype == np.uint8 else np.float32
    sample = batch(20, 3, space.shape, actions.n, obs_dtype)
    train = concat_samples([sample] * (c.train_batch_columns // 3))
    assert parts["learner queue"] == 5 * train.nbytes
    assert parts["replay"] == 7 * sample.nbytes
    assert parts["batch buffer"] == 2 * train.nbytes
    assert parts["samples in flight"] == 2 * 2 * 2 * sample.nbytes
    assert parts["total"] == sum(v for k, v in parts.items() if k != "total")


def test_a_recurrent_policys_batches_count_their_state_in_and_its_learner_the_lstm():
    space, actions = gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(2)
    kw = dict(num_envs_per_worker=3, sample_batch_size=20, train_batch_size=130,
              learner_queue_size=5, replay_buffer_num_slots=7, model=(32,),
              max_memory_gb=1000)
    c = ImpalaConfig(use_lstm=True, lstm_cell_size=16, **kw)
    parts = c.memory_estimate(space, actions)
    sample = batch(20, 3, space.shape, actions.n)
    sample.state_in = np.zeros((3, 2, 16), np.float32)
    train = concat_samples([sample] * (c.train_batch_columns // 3))
    assert sample.nbytes == batch(20, 3, space.shape, actions.n).nbytes + 3 * 2 * 16 * 4
    assert parts["learner queue"] == 5 * train.nbytes
    assert parts["replay"] == 7 * sample.nbytes
    assert parts["samples in flight"] == 2 * 2 * 2 * sample.nbytes
    # The learner: one trunk (the LSTM core is under both heads), per env step the LSTM's
    # activations, and its kernel [32, 64], recurrent kernel [16, 64] and bias [64] four times
    # (weights, gradients, two optimizer slots).
    shared = ImpalaConfig(vf_share_layers=True, **kw).memory_estimate(space, actions)
    steps = c.train_batch_columns * 20
    assert lstm_weight_count(32, 16) == 32 * 64 + 16 * 64 + 64
    assert parts["learner working set"] - shared["learner working set"] == (
        steps * LSTM_STEP_BYTES_PER_UNIT * 16 + 16 * lstm_weight_count(32, 16)
        + 3 * 2 * 16 * 4 * (c.train_batch_columns // 3))
    message = error_of(use_lstm=True, lstm_cell_size=10**6, max_memory_gb=1)
    assert message.startswith("lstm_cell_size=1000000 is invalid: this config would need")
    assert "learner working set" in message and "lstm_cell_size" in message.split("lower")[1]


def test_validation_counts_one_float_per_observation_a_lower_bound():
    c = ImpalaConfig(max_memory_gb=1000)
    cartpole = gym.make("CartPole-v1")
    assert c.memory_estimate()["total"] < c.memory_estimate(
        cartpole.observation_space, cartpole.action_space)["total"]


class WideObsEnv(gym.Env):
    """2000 float observations: a config that fits at one float per observation does not."""

    observation_space = gym.spaces.Box(-1, 1, (2000,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros(2000, np.float32), {}

    def step(self, action):
        return np.zeros(2000, np.float32), 0.0, False, False, {}


def test_impala_checks_again_with_the_envs_spaces_before_any_process_starts():
    config = ImpalaConfig(env=WideObsEnv, backend="process", train_batch_size=50_000,
                          max_memory_gb=1.2)  # fits at one float per observation
    with no_leaks(), pytest.raises(ConfigError) as info:
        Impala(config)
    message = str(info.value)
    assert message.startswith("train_batch_size=50000 is invalid: this config would need "
                              "about ")
    assert "learner queue" in message and "max_memory_gb=1.2" in message


MEASURE = textwrap.dedent("""
    import json, resource, sys
    import gymnasium as gym
    from impala_lab.config import ImpalaConfig
    from impala_lab.learner.vtrace_policy import VTracePolicy
    from tests.test_memory_limit import batch

    steps = int(sys.argv[1])
    env = gym.make("CartPole-v1")
    c = ImpalaConfig(model=(64, 64), sample_batch_size=50, train_batch_size=steps)
    policy = VTracePolicy(env.observation_space, env.action_space, c)
    b = batch(50, steps // 50, (4,), 2)
    with open("/proc/self/statm") as fh:
        before = int(fh.read().split()[1]) * resource.getpagesize()
    # Reset the peak (VmHWM) to the current RSS: the lifetime peak may come from TensorFlow's
    # start-up, before this call, and would hide it.
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    policy.learn_on_batch(b)  # the peak of this call, the trace's included
    with open("/proc/self/status") as fh:
        hwm_kb = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
    peak = hwm_kb * 1024 - before
    est = c.memory_estimate(env.observation_space, env.action_space)
    print(json.dumps({"peak": peak, "estimate": est["learner working set"]}))
""")


@pytest.mark.slow
def test_the_learner_working_set_estimate_is_not_below_what_tensorflow_takes():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)}
    import json

    out = {}
    # One fresh process per size: the peak of the first call and what it left behind would
    # otherwise count for the second.
    for steps in (10_000, 60_000):
        proc = subprocess.run([sys.executable, "-c", MEASURE, str(steps)], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[steps] = json.loads(proc.stdout.strip().splitlines()[-1])
    # The peak's growth from a small to a large batch, per env step: the per-step cost, free
    # of the trace's fixed cost.
    measured = (out[60_000]["peak"] - out[10_000]["peak"]) / 50_000
    estimated = (out[60_000]["estimate"] - out[10_000]["estimate"]) / 50_000
    print(f"learner working set per env step: measured {measured:.0f} B, "
          f"estimated {estimated:.0f} B")
    assert measured <= estimated <= 3 * measured, (measured, estimated, out)


def test_the_estimate_reads_any_object_with_the_sizes_and_a_model_spec():
    # memory_budget never imports the config: it reads the sizes of its MemorySizes protocol
    import types

    from impala_lab.memory_budget import memory_estimate

    config = ImpalaConfig(use_lstm=True, lstm_cell_size=16, model=(32,), max_memory_gb=100)
    names = ("sample_batch_size", "num_envs_per_worker", "train_batch_size",
             "learner_queue_size", "minibatch_buffer_size", "num_data_loader_buffers",
             "replay_buffer_num_slots", "num_workers", "max_sample_requests_in_flight_per_worker",
             "max_memory_gb", "model_spec", "train_batch_columns", "uses_multi_gpu_learner",
             "sample_steps")
    sizes = types.SimpleNamespace(**{n: getattr(config, n) for n in names})
    space = gym.spaces.Box(0, 255, (10, 10, 4), np.uint8)
    assert memory_estimate(sizes, space, gym.spaces.Discrete(3)) == config.memory_estimate(
        space, gym.spaces.Discrete(3))
    source = (REPO / "impala_lab" / "memory_budget.py").read_text()
    assert "impala_lab.config" not in source and "TYPE_CHECKING" not in source


@pytest.mark.parametrize("spec", [ModelSpec((64, 64)), ModelSpec((64, 64), vf_share_layers=True),
                                  ModelSpec((32,), use_lstm=True, lstm_cell_size=16)])
def test_the_weight_count_is_the_models(spec):
    obs = gym.spaces.Box(-1, 1, (4,), np.float32)
    weights = NumpyModel(obs, gym.spaces.Discrete(3), spec).initial_weights(0)
    lstm = memory_budget.lstm_weight_count(32, 16) if spec.use_lstm else 0
    assert memory_budget.weight_count(spec, 4, 0, 3) + lstm == sum(w.size for w in weights)


def test_huge_weights_are_refused_before_anything_starts():
    message = error_of(model=(100_000, 100_000))
    assert message.startswith("model=(100000, 100000) is invalid: this config would need at "
                              "least 802 GB of memory (weights 800 GB (model x num_workers))")


def test_the_weights_count_once_per_worker():
    base = ImpalaConfig(env="CartPole-v1", num_workers=2, model=(256, 256)).memory_estimate()
    more = ImpalaConfig(env="CartPole-v1", num_workers=6, model=(256, 256)).memory_estimate()
    per_copy = 4 * memory_budget.weight_count(ModelSpec((256, 256)), 1, 0, 2)
    assert more["weights"] - base["weights"] == 4 * per_copy
    assert base["weights"] == (memory_budget.LEARNER_WEIGHT_COPIES + 2) * per_copy


def test_num_workers_and_seed_are_bounded_before_anything_starts():
    limit = 8 * (os.cpu_count() or 1)
    assert error_of(num_workers=limit + 1).startswith(
        f"num_workers={limit + 1} is invalid: it exceeds {limit} worker processes on this "
        "machine (8 per CPU)")
    ImpalaConfig(env="CartPole-v1", num_workers=limit + 1, max_num_workers=limit + 1,
                 backend="inline")  # raised on purpose: accepted
    assert error_of(seed=2**63).startswith("seed=9223372036854775808 is invalid: use an "
                                           "integer in [0, 2**63)")
    assert ImpalaConfig(env="CartPole-v1", seed=2**63 - 1).seed == 2**63 - 1


# ---------------------------------------------------------------------- bounds of every count
@pytest.mark.parametrize("field, value, words", [
    ("evaluation_num_episodes", 10**9, "it must be at most 10,000"),  # a list of 10^9 seeds
    ("tf_intra_op_threads", 10**6, "on this machine"),  # never trained, ignored SIGTERM
    ("num_envs_per_worker", 10**5, "it must be at most 10,000"),
    ("num_sgd_iter", 10**4, "it must be at most 1,000"),
    ("broadcast_interval", 10**7, "it must be at most 1,000,000"),
    ("num_gpus", 10**4, "it must be at most 256"),
    ("extra_policy_lag", 10**7, "it must be at most 1,000,000"),
    ("max_policy_lag", 10**10, "it must be at most 1,000,000,000"),
    ("evaluation_interval", 10**10, "it must be at most 1,000,000,000"),
    ("max_num_workers", 10**7, "it must be at most 1,000,000"),
    ("learner_queue_timeout", 1e300, "it must be at most"),
    ("sample_timeout_s", 1e300, "it must be at most"),
    ("train_batch_size", 2**31, "it must be at most 2,147,483,647"),
    ("lstm_cell_size", 10**12, "it must be at most 2,147,483,647"),
    ("model", (2**40,), "it must be at most 2,147,483,647"),
    ("impala_channels", (16, 2**40), "it must be at most 2,147,483,647"),
    ("conv_filters", ((16, 2**40, 1),), "it must be at most 2,147,483,647"),
])
def test_every_count_and_size_has_an_upper_bound_named_with_its_field(field, value, words):
    message = error_of(**{field: value, "max_memory_gb": 1e12})
    assert message.startswith(f"{field}={value!r} is invalid: "), message
    assert words in message


def test_the_cli_refuses_a_billion_evaluation_episodes_in_one_line(tmp_path, capsys):
    from impala_lab.cli.main import main

    out = tmp_path / "run"
    assert main(["train", "--evaluation-num-episodes", "1000000000", "--evaluation-interval",
                 "1", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        "impala-lab: error: evaluation_num_episodes=1000000000 is invalid: it must be at most "
        "10,000: each evaluation plays its episodes one by one in the driver\n")
    assert not out.exists()


def test_tensorflow_and_the_worker_processes_are_counted():
    parts = ImpalaConfig(num_workers=3).memory_estimate()
    assert parts["tensorflow"] == memory_budget.TENSORFLOW_BYTES == 500_000_000
    assert parts["worker processes"] == 3 * memory_budget.WORKER_PROCESS_BYTES
    assert ImpalaConfig(num_workers=3, backend="inline").memory_estimate()[
        "worker processes"] == 0
    # a limit below TensorFlow alone names it, and the fix
    message = error_of(max_memory_gb=0.3, backend="inline")
    assert message.startswith("this run would need at least 0.5")
    assert "tensorflow 0.5 GB (fixed)" in message and message.endswith(
        "raise max_memory_gb, or free memory")


def cgroup_tree(root: Path, cgroup: str, files: dict[str, str]) -> None:
    """A fake /proc/self/cgroup and /sys/fs/cgroup under ``root``."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(cgroup)
    (root / "proc/meminfo").write_text("MemTotal: 67108864 kB\nMemAvailable: 62914560 kB\n")
    for name, text in files.items():
        (root / "sys/fs/cgroup" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "sys/fs/cgroup" / name).write_text(text)


def test_the_available_memory_is_what_the_processs_own_cgroup_v2_allows(tmp_path):
    # The process is in /kubepods/pod1/ctr: its group allows 2 GB (1.5 GB used, 0.5 GB of
    # it reclaimable file cache); the pod above it 1.5 GB with 0.5 GB used; the root none.
    cgroup_tree(tmp_path, "0::/kubepods/pod1/ctr\n", {
        "memory.max": "max\n",
        "kubepods/pod1/memory.max": "1500000000\n",
        "kubepods/pod1/memory.current": "500000000\n",
        "kubepods/pod1/ctr/memory.max": "2000000000\n",
        "kubepods/pod1/ctr/memory.current": "1500000000\n",
        "kubepods/pod1/ctr/memory.stat": "anon 1000000000\ninactive_file 500000000\n"})
    assert memory_budget.cgroup_memory_left(str(tmp_path)) == 1_000_000_000  # the pod's
    assert memory_budget.available_memory_bytes(str(tmp_path)) == 1_000_000_000


def test_the_available_memory_reads_a_cgroup_v1_memory_hierarchy(tmp_path):
    cgroup_tree(tmp_path, "4:memory:/process_api/run1\n3:cpuset:/\n0::/\n", {
        "memory/memory.limit_in_bytes": "9223372036854771712\n",  # v1's "no limit"
        "memory/process_api/run1/memory.limit_in_bytes": "800000000\n",
        "memory/process_api/run1/memory.usage_in_bytes": "300000000\n",
        "memory/process_api/run1/memory.stat": "total_inactive_file 100000000\n"})
    assert memory_budget.cgroup_memory_left(str(tmp_path)) == 600_000_000
    assert memory_budget.available_memory_bytes(str(tmp_path)) == 600_000_000
    # no limit anywhere: the machine's MemAvailable
    (tmp_path / "sys/fs/cgroup/memory/process_api/run1/memory.limit_in_bytes").write_text("max")
    assert memory_budget.cgroup_memory_left(str(tmp_path)) is None
    assert memory_budget.available_memory_bytes(str(tmp_path)) == 62914560 * 1024


def test_a_container_limit_refuses_a_config_its_host_would_take(tmp_path):
    cgroup_tree(tmp_path, "0::/\n", {"memory.max": "1000000000\n",
                                     "memory.current": "100000000\n"})
    real = memory_budget.available_memory_bytes
    with mock.patch("impala_lab.memory_budget.available_memory_bytes",
                    lambda: real(str(tmp_path))):
        message = error_of(train_batch_size=100_000)
    assert "half of the 0.9 GB available" in message


def test_shared_memory_blocks_that_cannot_fit_in_dev_shm_are_refused(monkeypatch):
    free = 64_000_000  # Docker's default /dev/shm

    class Small:
        f_bavail, f_frsize = free // 4096, 4096

    monkeypatch.setattr(memory_budget.os, "statvfs", lambda path: Small)
    message = error_of(model=(2048, 2048), num_workers=2)
    assert message.startswith("model=(2048, 2048) is invalid with num_workers=2 and "
                              "backend='process': the weights' shared-memory blocks need at "
                              "least 168.5 MB (5 blocks of 33.7 MB")
    assert "/dev/shm has 64.0 MB free" in message
    assert "lower --model or --num-workers, or use --backend inline" in message
    ImpalaConfig(model=(2048, 2048), num_workers=2, backend="inline")  # no blocks
    ImpalaConfig(model=(256, 256), num_workers=2)  # 5 blocks of 0.6 MB fit
