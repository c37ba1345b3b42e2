"""Evaluation of the learner's weights: the numpy policy it plays is the one it was given,
evaluations start every evaluation_interval reports, bad fields are ConfigErrors, and the CLI
can stop on the evaluation's return."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from impala_lab.config import ImpalaConfig
from impala_lab.driver.evaluation import Evaluator, evaluation_model, play_episodes
from impala_lab.errors import ConfigError, ImpalaError

REPO = Path(__file__).resolve().parents[1]


def fixed_action_weights(config: ImpalaConfig, action: int) -> list[np.ndarray]:
    """Weights whose policy prefers ``action`` by 5 nats in every state: all zeros but the
    logits bias."""
    env = gym.make("CartPole-v1")
    model = evaluation_model(config, env.observation_space, env.action_space)
    env.close()
    weights = [np.zeros(shape, np.float32) for shape in model.weight_shapes()]
    (bias,) = [i for i, w in enumerate(weights) if w.shape == (2,)]  # the logits' bias
    weights[bias][action] = 5.0
    return weights


def always(action: int, seeds: list[int]) -> list[float]:
    """Returns of CartPole episodes from these reset seeds, pushing one way throughout."""
    env = gym.make("CartPole-v1")
    returns = []
    for seed in seeds:
        env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(action)
            total += reward
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def test_the_evaluator_plays_the_weights_it_reads_now():
    config = ImpalaConfig(evaluation_interval=1, evaluation_num_episodes=4,
                          evaluation_actions="greedy", seed=11)
    current = {"weights": fixed_action_weights(config, 0), "version": 7}
    ev = Evaluator(config, *_spaces(),
                   get_weights=lambda: (current["weights"], current["version"]),
                   get_env_steps=lambda: 1234)
    first = ev.evaluate()
    assert first["episode_return_mean_greedy"] == pytest.approx(np.mean(always(0, ev.seeds)))
    assert first["weights_version"] == 7 and first["num_steps_sampled"] == 1234
    assert first["num_episodes"] == 4 and first["num_evaluations"] == 1
    assert "episode_return_mean_sampled" not in first
    current.update(weights=fixed_action_weights(config, 1), version=8)
    second = ev.evaluate()
    assert second["episode_return_mean_greedy"] == pytest.approx(np.mean(always(1, ev.seeds)))
    assert second["weights_version"] == 8 and second["num_evaluations"] == 2
    ev.close()


def _spaces():
    env = gym.make("CartPole-v1")
    env.close()
    return env.observation_space, env.action_space


def test_sampled_actions_follow_the_policy_and_greedy_its_argmax():
    config = ImpalaConfig(seed=5)
    env = gym.make("CartPole-v1")
    model = evaluation_model(config, env.observation_space, env.action_space)
    weights = [np.zeros(s, np.float32) for s in model.weight_shapes()]
    model.set_weights(weights)  # logits 0, 0: the sampled policy is a fair coin
    rng = np.random.default_rng(0)
    sampled = play_episodes(env, model, list(range(40)), greedy=False, rng=rng)
    greedy = play_episodes(env, model, list(range(40)), greedy=True, rng=rng)
    env.close()
    # argmax of equal logits is action 0: greedy pushes left every step
    assert greedy == always(0, list(range(40)))
    # a fair coin keeps the pole up longer than always-left, on average (random play on
    # CartPole averages about 22 steps, always-left about 9)
    assert np.mean(sampled) > np.mean(greedy) + 5


def test_evaluations_start_every_interval_reports_one_at_a_time():
    config = ImpalaConfig(evaluation_interval=3, evaluation_num_episodes=2,
                          evaluation_actions="both", seed=2)
    weights = fixed_action_weights(config, 1)
    ev = Evaluator(config, *_spaces(), get_weights=lambda: (weights, 3))
    assert math.isnan(ev.latest()["episode_return_mean_greedy"])
    assert ev.latest()["weights_version"] == -1
    started = []
    for _ in range(9):
        started.append(ev.on_report())
        ev.wait()
    assert started == [False, False, True] * 3
    latest = ev.latest()
    assert latest["num_evaluations"] == 3
    assert latest["episode_return_mean_greedy"] == pytest.approx(np.mean(always(1, ev.seeds)))
    assert math.isfinite(latest["episode_return_mean_sampled"])
    ev.close()


def test_evaluation_off_starts_nothing():
    ev = Evaluator(ImpalaConfig(evaluation_interval=0), *_spaces(),
                   get_weights=lambda: pytest.fail("weights read with evaluation off"))
    assert not ev.enabled
    assert [ev.on_report() for _ in range(5)] == [False] * 5


@pytest.mark.parametrize("field, value, words", [
    ("evaluation_interval", -2, "evaluation_interval=-2 is invalid: give the number of train() "
                                "reports between evaluations"),
    ("evaluation_interval", 1.5, "evaluation_interval=1.5 has type float"),
    ("evaluation_num_episodes", 0, "evaluation_num_episodes=0 is invalid: each evaluation "
                                   "needs at least one episode"),
    ("evaluation_actions", "argmax", "evaluation_actions='argmax' is invalid: choose one of "
                                     "'greedy', 'sampled', 'both'"),
])
def test_a_bad_evaluation_field_is_a_config_error_naming_it(field, value, words):
    with pytest.raises(ConfigError) as info:
        ImpalaConfig(**{field: value})
    assert words in str(info.value)


def test_a_run_reports_evaluations_of_its_learners_weights():
    from impala_lab.driver.impala import Impala

    with Impala(backend="inline", num_workers=1, num_envs_per_worker=4, seed=4,
                evaluation_interval=1, evaluation_num_episodes=3,
                evaluation_actions="greedy") as run:
        run.train(max_env_steps=3000, report_interval=0.05)
        run.evaluator.wait()
        seen = run.stats()["evaluation"]
        assert seen["num_evaluations"] >= 1
        assert 0 <= seen["weights_version"] <= run.policy.version
        # a synchronous evaluation plays the learner's weights of this moment (the learner
        # thread, still training on queued batches after train(), is stopped first)
        run.learner.stop()
        result = run.evaluator.evaluate()
        weights, version = run.policy.get_weights()
        assert result["weights_version"] == version
        env = gym.make("CartPole-v1")
        model = evaluation_model(run.config, env.observation_space, env.action_space)
        model.set_weights(weights)
        direct = play_episodes(env, model, run.evaluator.seeds, True, np.random.default_rng())
        env.close()
        assert result["episode_return_mean_greedy"] == pytest.approx(np.mean(direct))
        columns = set(run.history.rows()[-1])
    assert {"evaluation.episode_return_mean_greedy", "evaluation.weights_version"} <= columns
    with Impala(backend="inline", num_workers=1, start_learner=False) as off:
        assert "evaluation" not in off.stats()


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-m", "impala_lab.cli.main", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=240)


def test_the_cli_stops_on_the_evaluation_return(tmp_path):
    out = tmp_path / "run"
    # Any CartPole policy lasts at least 8 steps, so the first evaluation reaches 5; the
    # actors' return needs 100 finished episodes first, and --stop-on eval ignores it.
    proc = run_cli("train", "--backend", "inline", "--num-workers", "1", "--seed", "1",
                   "--evaluation-interval", "2", "--evaluation-num-episodes", "2",
                   "--evaluation-actions", "greedy", "--stop-return", "5", "--stop-on", "eval",
                   "--report-interval", "0.1", "--max-seconds", "120", "--quiet",
                   "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["solved"] and result["stop_on"] == "eval"
    assert result["stop_reason"] == "stop condition"
    assert "reached evaluation return 5" in proc.stdout
    assert "the final weights evaluated (greedy): " in proc.stdout
    final = result["final"]["evaluation"]
    assert final["num_evaluations"] >= 2  # the one it stopped on, and the final one
    with open(out / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    greedy = [float(r["evaluation.episode_return_mean_greedy"]) for r in rows]
    assert greedy[-1] == pytest.approx(final["episode_return_mean_greedy"])
    assert any(g >= 5 for g in greedy[:-1])


def test_the_cli_refuses_stop_on_eval_without_evaluations(tmp_path):
    proc = run_cli("train", "--backend", "inline", "--stop-return", "5", "--stop-on", "eval",
                   "--out", str(tmp_path / "never"))
    assert proc.returncode == 2
    assert "--stop-on=eval is invalid with evaluation_interval=None" in proc.stderr
    assert "add --evaluation-interval N" in proc.stderr


def test_the_dashboard_shows_the_evaluation_beside_the_actors_return():
    from impala_lab.dashboard import markup
    from impala_lab.dashboard.plots import view_panels

    both = {"evaluation": {"episode_return_mean_greedy": 500.0,
                           "episode_return_mean_sampled": 487.25}}
    assert markup.eval_figure(both["evaluation"]) == "500 / 487"
    assert markup.eval_figure({"episode_return_mean_sampled": 12.5}) == "12.5"
    assert markup.eval_figure(None) == "off"
    assert "eval return" in markup.card_html("evaluation", both)
    (panel,) = view_panels("return")
    assert [s.key for s in panel.series] == [
        "episode_return_mean", "evaluation.episode_return_mean_greedy",
        "evaluation.episode_return_mean_sampled"]


def test_tensorboard_gets_the_evaluation_scalars():
    from impala_lab.dashboard.tensorboard import scalar_tags

    tags = scalar_tags({"evaluation": {"episode_return_mean_greedy": 20.0,
                                       "episode_return_mean_sampled": math.nan,
                                       "weights_version": 3}})
    assert tags == {"evaluation/episode_return_mean_greedy": 20.0,
                    "evaluation/weights_version": 3.0}


def test_the_progress_line_shows_the_evaluation_only_when_it_runs():
    from impala_lab.dashboard.terminal import progress_line

    base = {"time_total_s": 3.0, "num_steps_sampled": 1000, "episode_return_mean": 21.5}
    assert "eval" not in progress_line(base)
    line = progress_line({**base, "evaluation": {"episode_return_mean_greedy": 500.0,
                                                 "episode_return_mean_sampled": 35.25}})
    assert "  eval 500 / 35.2" in line


class HangsWhenEvaluated(gym.Env):
    """CartPole's spaces; every reset blocks until released (an env stuck in a C call)."""

    observation_space = gym.make("CartPole-v1").observation_space
    action_space = gym.spaces.Discrete(2)
    release = None

    def reset(self, *, seed=None, options=None):
        type(self).release.wait()
        return np.zeros(4, np.float32), {}

    def step(self, action):
        return np.zeros(4, np.float32), 1.0, True, False, {}


def test_a_hung_evaluation_is_given_up_at_the_first_report_past_its_deadline():
    import threading

    HangsWhenEvaluated.release = threading.Event()
    now = [0.0]
    config = ImpalaConfig(env=HangsWhenEvaluated, evaluation_interval=1,
                          evaluation_num_episodes=2)
    ev = Evaluator(config, *_spaces(), get_weights=lambda: (fixed_action_weights(config, 0), 1),
                   timeout_s=60.0, clock=lambda: now[0])
    try:
        assert ev.on_report() and ev.running
        now[0] = 30.0
        assert not ev.on_report() and ev.broken is None  # still within its deadline
        now[0] = 62.0
        assert not ev.on_report()  # past it: given up, and none started again
        assert ev.hung and ev.broken == ev.error
        assert ev.error.startswith("an evaluation has not finished in 62 s (its deadline: "
                                   "60 s): the env hangs in reset() or step() when evaluated")
        assert not ev.on_report() and ev.latest()["num_failed"] == 1
        with pytest.raises(ImpalaError, match="evaluation failed: an evaluation has not "
                                              "finished"):
            ev.evaluate()
    finally:
        HangsWhenEvaluated.release.set()
        ev.close()


def test_an_evaluation_past_its_deadline_fails_with_the_reason_and_three_in_a_row_break():
    config = ImpalaConfig(evaluation_interval=1, evaluation_num_episodes=3, seed=1)
    ev = Evaluator(config, *_spaces(), get_weights=lambda: (fixed_action_weights(config, 1), 2),
                   timeout_s=0.0)  # every step starts after the deadline
    for failures in (1, 2, 3):
        with pytest.raises(ImpalaError, match="the evaluation ran past its deadline"):
            ev.evaluate()
        assert ev.latest()["num_failed"] == failures
        assert (ev.broken is not None) == (failures == 3)
    assert ev.latest()["num_evaluations"] == 0
    ev.close()
