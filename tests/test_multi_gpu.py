"""MultiGPULearner: towers equal one device, buffers cycle idle -> ready -> ring -> idle,
config errors before anything starts, loader errors reach the driver, the CLI solves CartPole.

Fake devices must be configured before TensorFlow initialises, and earlier test modules have
already initialised it in this process with one CPU device; so the 2- and 4-device checks run
in one subprocess (configured for 4 logical CPUs, whose first 2 serve the 2-device learner)
and the tests below assert on what it reports. The rest runs here on ``/cpu:0``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from impala_lab.config import ImpalaConfig
from impala_lab.errors import ConfigError, LearnerError

REPO = Path(__file__).resolve().parents[1]
OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACT = gym.spaces.Discrete(2)

DEVICE_SCRIPT = r'''
import json, threading, time
import numpy as np
from impala_lab.config import ImpalaConfig
from impala_lab.learner.multi_gpu_learner import MultiGPULearner, configure_learner_devices

out = {}
base = dict(num_envs_per_worker=8, sample_batch_size=20, seed=1, opt_type="rmsprop", lr=0.01,
            num_data_loader_buffers=2)
out["devices4"] = configure_learner_devices(ImpalaConfig(num_gpus=4, fake_gpus=True, **base))

import gymnasium as gym
import tensorflow as tf
from impala_lab.batch import SampleBatch
from impala_lab.errors import NonFiniteLossError
from impala_lab.learner.vtrace_policy import VTracePolicy, batch_to_tensors
from impala_lab.actor.rollout_worker import RolloutWorker

spaces = (gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2))
with RolloutWorker("CartPole-v1", num_envs=8, sample_batch_size=20, seed=3) as worker:
    batches = [worker.sample() for _ in range(4)]
rng = np.random.default_rng(0)
for b in batches:  # behaviour != target, so the importance weights and their clips matter
    b.behaviour_logits += rng.normal(0.0, 0.5, b.behaviour_logits.shape).astype(np.float32)
batch = batches[0]
out["terminations"] = int(batch.terminateds.sum())

for n in (2, 4):
    cfg = ImpalaConfig(num_gpus=n, fake_gpus=True, **base)
    single = VTracePolicy(*spaces, cfg)
    multi = VTracePolicy(*spaces, cfg)
    learner = MultiGPULearner(multi, cfg)
    init_diff = max(float(np.abs(a - b).max())
                    for a, b in zip(single.get_weights()[0], multi.get_weights()[0]))
    with tf.device("/cpu:0"):
        g1, s1 = single.compute_gradients(batch_to_tensors(batch))
    g1 = [np.asarray(g) for g in g1]
    gn, sn = learner.compute_gradients(batch)
    part_ev = [float(single.loss_and_stats(batch_to_tensors(p))[1]["vf_explained_var"])
               for p in batch.split_columns(n)]
    step1 = single.learn_on_batch(batch)
    stepn = learner.learn_on_parts(learner.stage_batch(batch), batch)
    w_diff = max(float(np.abs(a - b).max())
                 for a, b in zip(single.get_weights()[0], multi.get_weights()[0]))
    # A non-finite batch on the towers: rejected, and nothing of the learner moves.
    state = ([w.tobytes() for w in multi.model.get_weights()]
             + [a.tobytes() for a in multi.optimizer_state()])
    bad_rewards = batch.rewards.copy()
    bad_rewards[3, 1] = np.nan
    bad = SampleBatch(**{**batch.to_dict(), "rewards": bad_rewards})
    try:
        learner.learn_on_parts(learner.stage_batch(bad), bad)
        rejected = "no error"
    except NonFiniteLossError:
        rejected = "NonFiniteLossError"
    out[str(n) + "_rejected"] = {
        "raised": rejected, "version": multi.version, "skipped": multi.num_updates_skipped,
        "unchanged": state == ([w.tobytes() for w in multi.model.get_weights()]
                               + [a.tobytes() for a in multi.optimizer_state()]),
        "traces": learner.num_traces}
    out[str(n)] = {
        "devices": learner.devices,
        "staged_on": [p["obs"].device for p in learner.stage_batch(batch)],
        "part_cols": [int(p["obs"].shape[1]) for p in learner.stage_batch(batch)],
        "init_weights_diff": init_diff,
        "grad_max_abs_diff": max(float(np.abs(a - b).max()) for a, b in zip(g1, gn)),
        "grad_max_abs": max(float(np.abs(a).max()) for a in g1),
        "stats_single": {k: float(v) for k, v in s1.items()},
        "stats_multi": sn,
        "part_explained_var": part_ev,
        "step_single": step1,
        "step_multi": stepn,
        "weights_diff_after_step": w_diff,
    }

# Two devices in the background: 4 batches, num_sgd_iter=2 (ttl ramp 1, 2, 2, 2 = 7 steps).
cfg = ImpalaConfig(num_gpus=2, fake_gpus=True, num_envs_per_worker=8, sample_batch_size=20,
                   seed=1, num_sgd_iter=2, minibatch_buffer_size=1, num_data_loader_buffers=2)
before = threading.active_count()
learner = MultiGPULearner(VTracePolicy(*spaces, cfg), cfg)
released = []
put = learner.idle_buffers.put
def recording_put(buf, *a, **k):
    released.append([buf.index, buf.num_uses])
    put(buf, *a, **k)
learner.idle_buffers.put = recording_put
for b in batches:
    learner.inqueue.put(b)
learner.start()
during = threading.active_count()
deadline = time.monotonic() + 60
# 7 steps, the last buffer released and both idle again: nothing more can come.
while ((learner.num_steps < 7 or len(released) < 4 or learner.idle_buffers.qsize() < 2)
       and learner.error is None and time.monotonic() < deadline):
    time.sleep(0.01)
learner.stop()
counts = []
while not learner.outqueue.empty():
    counts.append(learner.outqueue.get())
out["thread"] = {"before": before, "during": during, "after": threading.active_count(),
                 "error": repr(learner.error), "num_steps": learner.num_steps,
                 "released": released, "states": learner.buffer_states(),
                 "idle": learner.idle_buffers.qsize(), "version": learner.policy.version,
                 "counts": counts, "traces": learner.num_traces}

# TensorFlow now runs with 4 logical CPUs: 2 are reused, 8 cannot be made any more.
out["devices2_after_init"] = configure_learner_devices(
    ImpalaConfig(num_gpus=2, fake_gpus=True, **base))
try:
    configure_learner_devices(ImpalaConfig(num_gpus=8, fake_gpus=True, **{
        **base, "sample_batch_size": 50}))
except Exception as exc:
    out["error8"] = [type(exc).__name__, str(exc)]
print("RESULT" + json.dumps(out))
'''


@pytest.fixture(scope="module")
def device_run() -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, "-c", DEVICE_SCRIPT], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


@pytest.mark.parametrize("n", [2, 4])
def test_combined_gradient_over_fake_devices_equals_the_single_device_gradient(device_run, n):
    r = device_run[str(n)]
    assert r["devices"] == [f"/cpu:{i}" for i in range(n)]
    assert [d.split("/")[-1] for d in r["staged_on"]] == [f"device:CPU:{i}" for i in range(n)]
    assert r["part_cols"] == [8 // n] * n
    assert r["init_weights_diff"] == 0.0
    assert device_run["terminations"] > 0  # episode ends inside the batch are covered
    # The loss is a sum over T x B, so entries reach ~1e3: compare within 1e-5 relative to
    # the largest entry (float32 sums in another order differ in the last bits).
    assert r["grad_max_abs"] > 1.0
    assert r["grad_max_abs_diff"] <= 1e-5 * r["grad_max_abs"]
    # Not RLlib's mean: that would be 1/n of the single-device gradient.
    single, multi = r["stats_single"], r["stats_multi"]
    for key in ("total_loss", "policy_loss", "vf_loss", "entropy", "mean_rho"):
        assert multi[key] == pytest.approx(single[key], rel=1e-5, abs=1e-6), key
    assert single["mean_rho"] != pytest.approx(1.0, abs=1e-3)
    # vf_explained_var is documented as the mean of the parts' values.
    assert multi["vf_explained_var"] == pytest.approx(np.mean(r["part_explained_var"]),
                                                      rel=1e-5, abs=1e-6)
    # One RMSProp step (scale-sensitive, unlike Adam's first step) lands on the same weights.
    assert r["step_multi"]["grad_gnorm"] == pytest.approx(r["step_single"]["grad_gnorm"],
                                                          rel=1e-5)
    assert r["step_multi"]["policy_version"] == 1
    assert r["weights_diff_after_step"] < 1e-6


@pytest.mark.parametrize("n", [2, 4])
def test_a_rejected_update_on_the_towers_leaves_weights_and_optimizer_state_unchanged(
        device_run, n):
    r = device_run[f"{n}_rejected"]
    assert r["raised"] == "NonFiniteLossError"
    assert r["unchanged"]  # weights and every optimizer variable, bitwise
    assert r["version"] == 1 and r["skipped"] == 1 and r["traces"] == 1


def test_each_staged_buffer_is_used_num_sgd_iter_times_then_released_on_two_devices(
        device_run):
    t = device_run["thread"]
    assert t["error"] == "None"
    assert t["num_steps"] == 7 and t["version"] == 7 and t["traces"] == 1
    # ttl ramp 1, 2, 2, 2: [buffer index, passes served] at each release, alternating buffers
    assert t["released"] == [[0, 1], [1, 2], [0, 2], [1, 2]]
    assert t["states"] == ["idle", "idle"] and t["idle"] == 2
    assert t["counts"] == [160] * 7
    assert t["during"] == t["before"] + 2  # the learner thread and one loader thread
    assert t["after"] == t["before"]


def test_fake_devices_are_reused_but_not_added_once_tensorflow_runs(device_run):
    assert device_run["devices4"] == ["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"]
    assert device_run["devices2_after_init"] == ["/cpu:0", "/cpu:1"]
    kind, message = device_run["error8"]
    assert kind == "ConfigError"
    assert "fake_gpus=True with num_gpus=8 needs 8 logical CPU devices" in message
    assert "already initialised in this process with 4" in message
    assert "restart the kernel" in message


# ---------------------------------------------------------------------- config errors
def test_a_train_batch_that_does_not_split_evenly_is_a_config_error():
    # 50 x 3 env steps per sample, train_batch_size 500: 4 samples = 12 columns, not / 8
    with pytest.raises(ConfigError) as info:
        ImpalaConfig(num_gpus=8, fake_gpus=True, num_envs_per_worker=3)
    msg = str(info.value)
    assert "train_batch_size=500" in msg and "12 columns" in msg
    assert "across 8 learner devices" in msg and "multiple of num_gpus" in msg


def test_fewer_loader_buffers_than_minibatch_buffers_is_a_config_error():
    with pytest.raises(ConfigError) as info:
        ImpalaConfig(num_data_loader_buffers=2, minibatch_buffer_size=3)
    msg = str(info.value)
    assert "num_data_loader_buffers=2" in msg and "minibatch_buffer_size=3" in msg
    # the same numbers are fine for the single-device learner, which has no loader buffers
    ImpalaConfig(num_data_loader_buffers=1, minibatch_buffer_size=3)


def test_more_gpus_than_tensorflow_sees_is_a_config_error_before_anything_starts():
    import tensorflow as tf

    from impala_lab.driver.impala import Impala
    from impala_lab.learner.multi_gpu_learner import configure_learner_devices

    assert not tf.config.list_physical_devices("GPU")  # this machine: CPU only
    config = ImpalaConfig(num_gpus=2, backend="inline", num_envs_per_worker=2)
    with pytest.raises(ConfigError) as info:
        configure_learner_devices(config)
    msg = str(info.value)
    assert "num_gpus=2 is invalid: TensorFlow sees 0 GPU(s)" in msg
    assert "devices it sees: /physical_device:CPU:0" in msg and "fake_gpus=True" in msg
    before = threading.active_count()
    with pytest.raises(ConfigError, match="TensorFlow sees 0 GPU"):
        Impala(config)
    assert threading.active_count() == before


def test_fake_devices_after_tensorflow_started_with_one_cpu_is_a_config_error():
    import tensorflow as tf

    from impala_lab.learner.multi_gpu_learner import configure_learner_devices

    have = len(tf.config.list_logical_devices("CPU"))  # initialises TF if nothing did yet
    n = have + 1  # (1 + 1 here, unless some test set up more)
    with pytest.raises(ConfigError) as info:
        configure_learner_devices(ImpalaConfig(num_gpus=n, fake_gpus=True,
                                               num_envs_per_worker=n))
    assert str(info.value) == (
        f"fake_gpus=True with num_gpus={n} needs {n} logical CPU devices, but TensorFlow was "
        f"already initialised in this process with {have}; create the Impala run before any "
        f"other TensorFlow use, or restart the kernel")
    # one device (num_gpus 0 or 1) needs no set-up
    assert configure_learner_devices(ImpalaConfig(num_data_loader_buffers=2)) == ["/cpu:0"]
    assert configure_learner_devices(
        ImpalaConfig(num_gpus=1, fake_gpus=True, num_data_loader_buffers=2)) == ["/cpu:0"]


# ---------------------------------------------------------------------- one device, by hand
@pytest.fixture(scope="module")
def batches():
    from impala_lab.actor.rollout_worker import RolloutWorker

    with RolloutWorker("CartPole-v1", num_envs=8, sample_batch_size=20, seed=3) as worker:
        return [worker.sample() for _ in range(4)]


def make_learner(**overrides):
    from impala_lab.learner.multi_gpu_learner import MultiGPULearner
    from impala_lab.learner.vtrace_policy import VTracePolicy

    config = ImpalaConfig(num_envs_per_worker=8, sample_batch_size=20, seed=1,
                          learner_queue_timeout=30.0, **overrides)
    return MultiGPULearner(VTracePolicy(OBS, ACT, config), config)


def test_stepping_by_hand_serves_the_ring_and_recycles_buffers(batches):
    before = threading.active_count()
    learner = make_learner(num_data_loader_buffers=3, minibatch_buffer_size=2, num_sgd_iter=3)
    assert learner.devices == ["/cpu:0"] and learner.buffer_states() == ["idle"] * 3
    assert not learner.step(block_timeout=0.2)  # nothing came: False, no error, no timing
    assert learner.load_wait_timer.count == 0 and learner.grad_timer.count == 0
    served, released = [], []
    learn = learner.learn_on_parts

    def recording_learn(parts, batch):
        served.append(next(i for i, b in enumerate(batches) if b is batch))
        return learn(parts, batch)

    put = learner.idle_buffers.put

    def recording_put(buf, *a, **k):
        released.append((buf.index, buf.num_uses))
        put(buf, *a, **k)

    learner.learn_on_parts = recording_learn
    learner.idle_buffers.put = recording_put
    for b in batches:
        learner.inqueue.put(b)
    while learner.step(block_timeout=5.0):
        pass
    try:
        # Ring of 2 slots, ttl ramp 1, 2, 3: the MinibatchBuffer's order, one buffer per batch.
        assert served == [0, 1, 2, 1, 2, 3, 2, 3]
        assert released == [(0, 1), (1, 2), (2, 3)]  # each used its ttl (up to 3), then idle
        assert learner.buffer_states() == ["in use", "idle", "idle"]  # batch 3: 1 pass left
        assert [b.num_loads for b in learner.buffers] == [2, 1, 1]
        assert [learner.outqueue.get_nowait() for _ in range(8)] == [160] * 8
        assert learner.policy.version == 8 and learner.num_traces == 1
        metrics = learner.last_train_metrics
        assert metrics["policy_version"] == 8 and np.isfinite(metrics["total_loss"])
        assert learner.take_weights_updated() and not learner.take_weights_updated()
        assert learner.grad_timer.count == 8 and learner.load_wait_timer.count == 8
        assert learner.load_timer.count == 4 and learner.queue_timer.count == 4
        assert learner.loader_threads[0].is_alive()
    finally:
        learner.stop()
    assert not learner.loader_threads[0].is_alive()
    assert threading.active_count() == before


@pytest.mark.parametrize("opt_type", ["adam", "rmsprop"])
def test_a_rejected_update_leaves_the_learner_bitwise_unchanged_on_one_device(batches, opt_type):
    from impala_lab.batch import SampleBatch
    from impala_lab.errors import NonFiniteLossError

    learner = make_learner(opt_type=opt_type, num_data_loader_buffers=2)
    policy = learner.policy

    def state() -> list[bytes]:
        return ([w.tobytes() for w in policy.model.get_weights()]
                + [a.tobytes() for a in policy.optimizer_state()])

    learner.learn_on_parts(learner.stage_batch(batches[0]), batches[0])  # Adam's moments != 0
    before = state()
    rewards = batches[1].rewards.copy()
    rewards[3, 1] = np.nan
    bad = SampleBatch(**{**batches[1].to_dict(), "rewards": rewards})
    with pytest.raises(NonFiniteLossError):
        learner.learn_on_parts(learner.stage_batch(bad), bad)
    assert state() == before
    assert policy.version == 1 and policy.num_updates_skipped == 1
    assert int(policy.optimizer.iterations.numpy()) == 1
    learner.learn_on_parts(learner.stage_batch(batches[1]), batches[1])
    assert policy.version == 2 and state() != before and learner.num_traces == 1


def test_a_loader_error_is_raised_by_step_with_the_loader_named():
    before = threading.active_count()
    learner = make_learner(num_data_loader_buffers=2)
    learner.inqueue.put("not a batch")
    with pytest.raises(LearnerError) as info:
        learner.step(block_timeout=10.0)
    err = info.value
    assert err.stage == "loader thread 0"
    assert "AttributeError" in str(err) and "split_columns" in str(err)
    assert "in stage_batch" in err.remote_traceback
    with pytest.raises(LearnerError) as again:  # the driver's check sees the same error
        learner.raise_if_failed()
    assert again.value is err
    learner.loader_threads[0].join(5)
    assert not learner.loader_threads[0].is_alive()
    learner.stop()
    assert threading.active_count() == before


def test_the_driver_runs_it_reports_devices_and_buffers_and_raises_a_loader_failure():
    from impala_lab.driver.impala import Impala
    from impala_lab.learner.multi_gpu_learner import BUFFER_STATES, MultiGPULearner

    before = threading.active_count()
    impala = Impala(backend="inline", num_envs_per_worker=4, num_data_loader_buffers=2,
                    seed=5)
    try:
        assert isinstance(impala.learner, MultiGPULearner)
        deadline = time.monotonic() + 60
        while impala.num_steps_trained == 0 and time.monotonic() < deadline:
            impala.step()
        assert impala.num_steps_trained > 0
        stats = impala.stats()
        assert stats["pipeline"]["learner_devices"] == ["/cpu:0"]
        states = stats["pipeline"]["loader_buffers"]
        assert len(states) == 2 and set(states) <= set(BUFFER_STATES)
        timing = stats["timing_breakdown"]
        assert timing["learner_load_time_ms"] > 0 and timing["learner_grad_time_ms"] > 0
        assert impala.learner.load_wait_timer.count > 0

        def failing_stage(batch):
            raise RuntimeError("staging failed on purpose")

        impala.learner.stage_batch = failing_stage
        with pytest.raises(LearnerError) as info:
            while time.monotonic() < deadline:
                impala.step()
        assert info.value.stage == "loader thread 0"
        assert "RuntimeError: staging failed on purpose" in str(info.value)
        assert "in failing_stage" in info.value.remote_traceback
    finally:
        impala.stop()
    assert threading.active_count() == before


# ---------------------------------------------------------------------- the CLI
@pytest.mark.slow
def test_cli_with_two_fake_gpus_solves_cartpole_within_bounded_env_steps(tmp_path):
    out = tmp_path / "run"
    max_steps = 1_000_000  # it takes 330k-440k (five seeds); the bound leaves 2x margin
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(
        [sys.executable, "-m", "impala_lab.cli.main", "train", "--num-gpus", "2", "--fake-gpus",
         "true", "--backend", "inline", "--num-envs-per-worker", "8", "--lr", "0.003",
         "--vf-loss-coeff", "0.25", "--stop-return", "195", "--max-env-steps", str(max_steps),
         "--seed", "0", "--quiet", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["solved"] is True and result["stop_reason"] == "stop condition"
    assert result["env_steps_to_target"] <= max_steps
    final = result["final"]
    assert final["episode_return_mean"] >= 195 and final["episode_return_count"] == 100
    assert final["pipeline"]["learner_devices"] == ["/cpu:0", "/cpu:1"]
    assert final["timing_breakdown"]["learner_load_time_ms"] > 0
