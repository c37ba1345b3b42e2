"""examples/impala_in_one_file.py: its actor's unrolls are RolloutWorker's (time limits and
their bootstrap values included), its V-trace and loss equal the library's, it stays short
and free of impala_lab, its actors never import TensorFlow, --help shows the defaults, and a
run trains (in the output the bench reads) and leaves no process behind (also after
Ctrl-C)."""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from bench.one_file import read_run
from impala_lab.actor.rollout_worker import RolloutWorker
from impala_lab.config import ImpalaConfig
from impala_lab.learner import vtrace as lib_vtrace
from impala_lab.learner.vtrace_policy import VTracePolicy, batch_to_tensors
from tests.leaks import alive, children_of, wait_gone
from tests.signals import default_sigint

REPO = Path(__file__).resolve().parents[1]
FILE = REPO / "examples" / "impala_in_one_file.py"
OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACT = gym.spaces.Discrete(2)


def load_module():
    spec = importlib.util.spec_from_file_location("impala_in_one_file", FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up by name
    spec.loader.exec_module(module)
    return module


one = load_module()


def random_batch(seed: int, T: int = 20, B: int = 6, A: int = 3, dtype=np.float32) -> dict:
    """Random logits, actions, rewards, discounts (some episode ends), values, bootstrap."""
    rng = np.random.default_rng(seed)
    return {
        "behaviour_logits": rng.normal(0, 1.5, (T, B, A)).astype(dtype),
        "target_logits": rng.normal(0, 1.5, (T, B, A)).astype(dtype),
        "actions": rng.integers(0, A, (T, B)).astype(np.int32),
        "rewards": rng.normal(0, 1, (T, B)).astype(dtype),
        "discounts": (0.99 * (rng.random((T, B)) > 0.1)).astype(dtype),
        "values": rng.normal(0, 2, (T, B)).astype(dtype),
        "bootstrap_value": rng.normal(0, 2, (B,)).astype(dtype),
    }


def log_rhos_of(b: dict) -> np.ndarray:
    """log pi(a|x) - log mu(a|x) in float64 numpy (independent of either implementation)."""
    def logp(logits: np.ndarray) -> np.ndarray:
        z = logits.astype(np.float64)
        z = z - z.max(-1, keepdims=True)
        logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
        return np.take_along_axis(logp_all, b["actions"][..., None], -1)[..., 0]
    return logp(b["target_logits"]) - logp(b["behaviour_logits"])


# ------------------------------------------------------------------ the file's shape
def test_file_is_at_most_400_lines_and_imports_nothing_from_impala_lab():
    text = FILE.read_text()
    assert len(text.splitlines()) <= 400
    imported = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert "impala_lab" not in imported and "tensorflow" in imported  # the check sees imports
    assert "impala_lab" not in text.replace("impala_lab's", "")  # nor a string import


def test_importing_the_file_as_an_actor_does_not_import_tensorflow():
    # A spawned actor imports the main file (as __mp_main__) and then runs `actor`.
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location("
            f"'__mp_main__', {str(FILE)!r}); m = importlib.util.module_from_spec(s); "
            "sys.modules['__mp_main__'] = m; s.loader.exec_module(m); "
            "print(sorted({'tensorflow', 'keras', 'impala_lab'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=REPO).stdout
    assert out.strip() == "[]"


def test_help_shows_every_flag_with_its_default():
    out = subprocess.run([sys.executable, str(FILE), "--help"], capture_output=True, text=True,
                         check=True, cwd=REPO).stdout
    out = " ".join(out.split())  # argparse wraps at the terminal's width
    for flag, default in (("--env", "CartPole-v1"), ("--num-actors", "2"), ("--lr", "0.001"),
                          ("--rho-bar", "1.0"), ("--stop-return", "475.0")):
        assert flag in out and f"(default: {default})" in out, (flag, out)


# ------------------------------------------------------------------ V-trace
@pytest.mark.parametrize("rho_bar,pg_rho_bar", [(1.0, 1.0), (2.0, 0.5)])
def test_vtrace_equals_the_library_in_float32(rho_bar, pg_rho_bar):
    b = random_batch(seed=int(rho_bar * 10))
    log_rhos = log_rhos_of(b).astype(np.float32)
    args = (b["discounts"], b["rewards"], b["values"], b["bootstrap_value"])
    vs, adv = one.vtrace(tf.constant(log_rhos), *map(tf.constant, args), rho_bar, pg_rho_bar)
    ref = lib_vtrace.from_importance_weights(log_rhos, *args, clip_rho_threshold=rho_bar,
                                             clip_pg_rho_threshold=pg_rho_bar)
    np.testing.assert_allclose(vs.numpy(), ref.vs.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(adv.numpy(), ref.pg_advantages.numpy(), rtol=0, atol=1e-6)
    # from_logits: the library's own log-probabilities of the same logits
    ref2 = lib_vtrace.from_logits(b["behaviour_logits"], b["target_logits"], b["actions"],
                                  *args, clip_rho_threshold=rho_bar,
                                  clip_pg_rho_threshold=pg_rho_bar)
    np.testing.assert_allclose(vs.numpy(), ref2.vs.numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(adv.numpy(), ref2.pg_advantages.numpy(), rtol=0, atol=1e-5)
    # The tolerance catches a wrong clip: the advantage and targets move by far more.
    wrong_vs, wrong_adv = one.vtrace(tf.constant(log_rhos), *map(tf.constant, args),
                                     rho_bar + 0.5, pg_rho_bar + 0.5)
    assert np.abs(wrong_vs.numpy() - ref.vs.numpy()).max() > 1e-2
    assert np.abs(wrong_adv.numpy() - ref.pg_advantages.numpy()).max() > 1e-2


def test_vtrace_equals_the_librarys_float64_reference_to_1e_9():
    b = random_batch(seed=5, T=30, dtype=np.float64)
    log_rhos = log_rhos_of(b)
    args = (b["discounts"], b["rewards"], b["values"], b["bootstrap_value"])
    vs, adv = one.vtrace(tf.constant(log_rhos), *map(tf.constant, args), 1.0, 1.0)
    assert vs.dtype == tf.float64
    ref = lib_vtrace.from_importance_weights_numpy(log_rhos, *args)
    np.testing.assert_allclose(vs.numpy(), ref.vs, rtol=0, atol=1e-9)
    np.testing.assert_allclose(adv.numpy(), ref.pg_advantages, rtol=0, atol=1e-9)


# ------------------------------------------------------------------ loss and forward
def build(seed: int):
    cfg = one.Config(seed=seed, gamma=0.97, vf_coeff=0.5, entropy_coeff=0.01,
                     rho_bar=1.0, pg_rho_bar=1.0)
    nets = one.build_nets(4, 2, cfg)
    policy = VTracePolicy(OBS, ACT, ImpalaConfig(
        seed=1, gamma=cfg.gamma, vf_loss_coeff=cfg.vf_coeff, entropy_coeff=cfg.entropy_coeff,
        vtrace_clip_rho_threshold=cfg.rho_bar, vtrace_clip_pg_rho_threshold=cfg.pg_rho_bar))
    # Library order: hidden_0, value_hidden_0, hidden_1, value_hidden_1, logits, value head.
    pi, v = nets[0].get_weights(), nets[1].get_weights()
    policy.model.set_weights([pi[0], pi[1], v[0], v[1], pi[2], pi[3], v[2], v[3],
                              pi[4], pi[5], v[4], v[5]])
    return cfg, nets, policy


def cartpole_like_batch(seed: int, T: int = 25, B: int = 8) -> dict:
    rng = np.random.default_rng(seed)
    f32 = np.float32
    terminated = (rng.random((T, B)) < 0.08).astype(f32)
    return {"obs": rng.normal(0, 1, (T, B, 4)).astype(f32),
            "actions": rng.integers(0, 2, (T, B)).astype(np.int32),
            "rewards": rng.normal(1, 0.5, (T, B)).astype(f32),
            "terminateds": terminated,
            "truncateds": np.maximum(terminated, rng.random((T, B)) < 0.05).astype(f32),
            "truncation_values": rng.normal(20, 5, (T, B)).astype(f32),
            "behaviour_logits": rng.normal(0, 1, (T, B, 2)).astype(f32),
            "bootstrap_obs": rng.normal(0, 1, (B, 4)).astype(f32)}


def to_file_batch(t: dict, gamma: float) -> dict:
    """The library's batch as the file's actor writes it: a truncation's bootstrap value is
    in the reward, and the discount is 0 after any episode end."""
    truncated = t["truncateds"] * (1 - t["terminateds"])
    return {"obs": t["obs"], "actions": t["actions"], "bootstrap_obs": t["bootstrap_obs"],
            "behaviour_logits": t["behaviour_logits"],
            "rewards": t["rewards"] + gamma * truncated * t["truncation_values"],
            "discounts": (gamma * (1 - np.maximum(t["terminateds"], truncated))).astype(
                np.float32)}


def test_loss_and_gradients_equal_the_librarys_vtrace_policy():
    cfg, nets, policy = build(seed=7)
    t = cartpole_like_batch(seed=3)
    with tf.GradientTape(persistent=True) as tape:
        ref_total, ref = policy.loss_and_stats({k: tf.constant(v) for k, v in t.items()})
        total, mine = one.loss_fn(*nets, {k: tf.constant(v) for k, v in
                                          to_file_batch(t, cfg.gamma).items()}, cfg)
    assert 0.2 < float(ref["mean_rho"]) < 5  # the behaviour logits differ: rho is not 1
    for key, ref_key in (("loss", "total_loss"), ("pg", "policy_loss"), ("vf", "vf_loss"),
                         ("entropy", "entropy"), ("rho", "mean_rho")):
        got, want = float(mine[key]), float(ref[ref_key])
        assert got == pytest.approx(want, rel=1e-6, abs=1e-6), key
    assert float(total) == pytest.approx(float(ref_total), rel=1e-6)
    pi, v = nets[0].trainable_variables, nets[1].trainable_variables
    ours = tape.gradient(total, pi + v)
    lib = dict(zip([w.path for w in policy.model.trainable_variables],
                   tape.gradient(ref_total, policy.model.trainable_variables)))
    names = ["hidden_0", "hidden_1", "logits_head"]
    lib_order = [lib[f"{n}/{p}"] for n in names for p in ("kernel", "bias")]
    lib_order += [lib[f"{n}/{p}"] for n in ("value_hidden_0", "value_hidden_1", "value_head")
                  for p in ("kernel", "bias")]
    for a, b in zip(ours, lib_order):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-4)


def test_the_actors_numpy_policy_is_the_learners_keras_forward():
    cfg, (pi_net, v_net), policy = build(seed=11)
    shapes = one.param_shapes(4, 2, cfg.hidden)
    flat = np.concatenate([w.numpy().ravel() for w in
                           pi_net.trainable_variables + v_net.trainable_variables])
    assert flat.size == sum(int(np.prod(s)) for s in shapes)
    obs = np.random.default_rng(0).normal(0, 1, (32, 4)).astype(np.float32)
    logits, values = one.numpy_policy(one.unflatten(flat, shapes), obs)
    np.testing.assert_allclose(logits, pi_net(obs).numpy(), atol=1e-5)
    np.testing.assert_allclose(values, v_net(obs).numpy()[:, 0], atol=1e-5)
    lib_logits, lib_values = policy.compute_logits_and_values(obs)  # and the library's
    np.testing.assert_allclose(logits, lib_logits, atol=1e-5)
    np.testing.assert_allclose(values, lib_values, atol=1e-5)


# ------------------------------------------------------------------ the actor
def test_the_actors_unrolls_are_the_rollout_workers_with_a_time_limit():
    """CartPole cut at 12 steps, unrolls of 30: episodes end inside every unroll, mostly by
    the time limit. With the same weights, the same env seeds and the same action generator
    (RolloutWorker's: env i from SeedSequence child i + 1, the actions from child 0) the file's
    `rollout` takes the worker's actions, ends the same episodes, and puts into each truncated
    step's reward gamma times the value the worker stores as its truncation value."""
    cfg, nets, policy = build(seed=5)
    limit, T, B, seed = 12, 30, 3, 2024
    make = functools.partial(gym.make, "CartPole-v1", max_episode_steps=limit)
    weights, _ = policy.get_weights()
    worker = RolloutWorker(make, num_envs=B, sample_batch_size=T, seed=seed)
    worker.set_weights(weights, 1)
    children = np.random.SeedSequence(seed, spawn_key=(0,)).spawn(B + 1)
    envs = [make() for _ in range(B)]
    obs = np.stack([env.reset(seed=int(c.generate_state(1, np.uint32)[0]))[0]
                    for env, c in zip(envs, children[1:])]).astype(np.float32)
    rng, returns = np.random.default_rng(children[0]), np.zeros(B)
    flat = np.concatenate([w.numpy().ravel() for w in
                           nets[0].trainable_variables + nets[1].trainable_variables])
    params = one.unflatten(flat, one.param_shapes(4, 2, cfg.hidden))
    for _ in range(2):  # the second unroll starts where the first left its envs
        lib = worker.sample()
        mine, finished = one.rollout(envs, obs, params, rng, T, cfg.gamma, returns)
        np.testing.assert_array_equal(mine["actions"], lib.actions)
        np.testing.assert_array_equal(mine["obs"], lib.obs)
        np.testing.assert_array_equal(mine["bootstrap_obs"], lib.bootstrap_obs)
        np.testing.assert_allclose(mine["behaviour_logits"], lib.behaviour_logits, atol=1e-5)
        cut = lib.truncateds & ~lib.terminateds
        assert cut.sum() >= B, "the time limit must strike inside the unroll"
        assert np.all(lib.truncation_values[cut] != 0)
        np.testing.assert_array_equal(mine["discounts"] == 0, lib.terminateds | lib.truncateds)
        np.testing.assert_allclose(mine["discounts"][mine["discounts"] != 0], cfg.gamma)
        np.testing.assert_allclose(
            mine["rewards"], lib.rewards + cfg.gamma * np.where(cut, lib.truncation_values, 0),
            rtol=1e-6, atol=1e-6)
        assert finished == list(lib.episode_returns)
        # and the learners see the same batch: the file's loss equals the library's on it
        lib_total, _ = policy.loss_and_stats(
            {k: tf.constant(v) for k, v in batch_to_tensors(lib).items()})
        total, _ = one.loss_fn(*nets, {k: tf.constant(v) for k, v in mine.items()}, cfg)
        assert float(total) == pytest.approx(float(lib_total), rel=1e-5)


# ------------------------------------------------------------------ end to end
def start_run(*args: str) -> subprocess.Popen:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.Popen([sys.executable, str(FILE), "--log-interval", "1", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=REPO, preexec_fn=default_sigint)


def wait_for_progress(proc: subprocess.Popen, lines: list[str]) -> list[int]:
    """Read lines until a progress line shows learner updates; the run's child pids then."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, "the run ended early:\n" + "".join(lines)
        lines.append(line)
        if " updates " in line and int(line.split(" updates ")[1].split()[0]) > 0:
            return children_of(proc.pid)
    raise AssertionError("no learner update within 120 s:\n" + "".join(lines))


def result_of(lines: list[str]) -> dict:
    """What the bench reads in the run's output (its clock is not used here)."""
    return read_run(lines, clock=lambda: 0.0, launched=0.0)


def test_a_short_run_trains_and_leaves_no_process_behind():
    seed = np.random.SeedSequence().entropy % 10_000  # drawn per run, printed on failure
    proc = start_run("--stop-return", "60", "--max-seconds", "90", "--seed", str(seed))
    lines: list[str] = [f"seed {seed}\n"]
    children = wait_for_progress(proc, lines)
    assert len(children) >= 2  # the actors (and multiprocessing's resource tracker)
    lines += proc.stdout.readlines()
    assert proc.wait(timeout=60) == 0, "".join(lines)
    result = result_of(lines)
    assert result["solved"] and result["return_mean"] >= 60, "".join(lines)
    assert result["updates"] > 0 and result["env_steps"] > 0
    assert wait_gone(children, timeout=10) == []


def test_ctrl_c_stops_the_run_and_every_actor():
    proc = start_run("--stop-return", "1e9", "--max-seconds", "120")
    lines: list[str] = []
    children = wait_for_progress(proc, lines)
    assert all(alive(p) for p in children)
    os.kill(proc.pid, signal.SIGINT)
    for p in children:  # as a terminal's Ctrl-C does: the whole foreground group
        os.kill(p, signal.SIGINT)
    lines += proc.stdout.readlines()
    assert proc.wait(timeout=30) == 0, "".join(lines)
    assert any("interrupted" in x for x in lines)
    assert result_of(lines)["updates"] > 0
    assert wait_gone(children, timeout=10) == []
