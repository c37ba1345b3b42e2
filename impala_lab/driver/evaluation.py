"""Evaluation of the learner's current weights, on envs that no actor steps.

An `Evaluator` asks how the learner's newest policy does (the actors' returns come from the
lagged behaviour policy): every ``evaluation_interval`` reports of ``train()`` it plays
``evaluation_num_episodes`` episodes per action choice (``greedy`` or ``sampled``) with the
learner's weights in a `NumpyModel`, on an env of its own, in a daemon thread, with the same
env seeds every time. An evaluation past its deadline (`EVALUATION_TIMEOUT_S`) hangs in the
env: it is given up, and none starts again in that run; a failed one keeps the latest result
and says why in ``error``. docs/evaluation.md lists ``stats()["evaluation"]``'s keys.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from impala_lab.actor.numpy_model import NumpyModel
from impala_lab.envs import make_env
from impala_lab.errors import ImpalaError

__all__ = ["Evaluator", "play_episodes", "evaluation_model"]

#: An episode longer than this ends the evaluation with an error (an env without a time limit).
MAX_EPISODE_STEPS = 1_000_000
#: Seconds an evaluation may play (both action choices); past it, it has failed.
EVALUATION_TIMEOUT_S = 600.0
#: Evaluations failed in a row after which `Evaluator.broken` gives up on them.
FAILURES_TO_GIVE_UP = 3


def evaluation_model(config: Any, observation_space: Any, action_space: Any) -> NumpyModel:
    """The numpy network that ``config`` trains, for these spaces (no weights loaded)."""
    return NumpyModel(observation_space, action_space, config.model_spec)


def play_episodes(env: Any, model: NumpyModel, seeds: list[int], greedy: bool,
                  rng: np.random.Generator, *, clip: bool = True, squash: bool = False,
                  deadline: float | None = None, cancel: threading.Event | None = None
                  ) -> list[float]:
    """Play one episode per seed (``env.reset(seed=...)``) with ``model``; their returns.

    ``greedy``: the most likely action, else one drawn with ``rng``; ``clip``, ``squash``: how
    a Box action meets its bounds (the config's ``clip_actions``, ``squash_actions``). An
    `ImpalaError` ends the episodes once a step starts after ``deadline`` (a
    ``time.monotonic()`` reading) or with ``cancel`` set.
    """
    returns = []
    for seed in seeds:
        obs, _ = env.reset(seed=int(seed))
        state = model.initial_state(1) if model.use_lstm else None
        total, done, steps = 0.0, False, 0
        while not done:
            steps += 1
            if steps > MAX_EPISODE_STEPS:
                raise ImpalaError(f"an evaluation episode ran past {MAX_EPISODE_STEPS:,} steps; "
                                  "give the env a time limit (gymnasium's TimeLimit)")
            if cancel is not None and cancel.is_set():
                raise ImpalaError("the evaluation was cancelled: the run is ending")
            if deadline is not None and time.monotonic() > deadline:
                raise ImpalaError("the evaluation ran past its deadline (the env is very slow, "
                                  "or stalls, in evaluation)")
            if state is None:
                logits = model.logits(np.asarray(obs)[None])
            else:
                logits, _, state = model.step(np.asarray(obs)[None], state)
            dist = model.distribution
            action = dist.mode(logits)[0] if greedy else dist.sample(logits, rng)[0]
            action = action.item() if np.ndim(action) == 0 else dist.env_action(
                action, env.action_space, clip=clip, squash=squash)  # a Box: bounded, reshaped
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return returns


class Evaluator:
    """Evaluations of the learner's weights every ``config.evaluation_interval`` reports.

    Args:
      config: the run's `ImpalaConfig`; observation_space, action_space: the env's spaces.
      get_weights: returns the learner's current ``(weights, version)``.
      get_env_steps: returns the env steps sampled so far (recorded with each result).
      timeout_s: seconds each evaluation may play.
      clock: monotonic seconds (tests pass a fake one to judge a hung evaluation).
    """

    def __init__(self, config: Any, observation_space: Any, action_space: Any,
                 get_weights: Callable[[], tuple[list, int]],
                 get_env_steps: Callable[[], int] = lambda: 0,
                 timeout_s: float = EVALUATION_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled = bool(config.evaluation_interval)
        self.interval = int(config.evaluation_interval or 0)
        self.num_episodes = config.evaluation_num_episodes
        self.modes = (("greedy", "sampled") if config.evaluation_actions == "both"
                      else (config.evaluation_actions,))
        self._config = config
        self._spaces = (observation_space, action_space)
        self._get_weights, self._get_env_steps = get_weights, get_env_steps
        self.timeout_s, self._clock = timeout_s, clock
        seq = np.random.SeedSequence(config.seed, spawn_key=(0xE7A1,))
        self.seeds = [int(s) for s in seq.generate_state(self.num_episodes, np.uint32)]
        self._rng_seed = seq.spawn(1)[0]
        self._reports = 0
        self._lock = threading.Lock()  # guards _latest
        self._playing = threading.Lock()
        self._cancel = threading.Event()  # set when the run ends or an evaluation hangs
        self._thread: threading.Thread | None = None
        self._started = 0.0  # when the background evaluation started (clock)
        self._env: Any = None
        self._model: NumpyModel | None = None
        self.error: str | None = None  # why the latest evaluation failed (None: it did not)
        self.num_failed = 0
        self._failed_in_a_row = 0
        self.hung = False
        self._latest: dict[str, Any] = {f"episode_return_mean_{m}": math.nan for m in self.modes}
        self._latest.update(weights_version=-1, num_steps_sampled=0,
                            num_episodes=self.num_episodes, num_evaluations=0, time_s=math.nan)

    def latest(self) -> dict[str, Any]:
        """A copy of the latest finished evaluation, with ``error`` and ``num_failed``."""
        with self._lock:
            return {**self._latest, "error": self.error, "num_failed": self.num_failed}

    @property
    def running(self) -> bool:
        """True while an evaluation plays in the background."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def broken(self) -> str | None:
        """Why evaluations cannot be relied on in this run (one hung, or the last
        `FAILURES_TO_GIVE_UP` failed); None while they work."""
        return self.error if self.hung or self._failed_in_a_row >= FAILURES_TO_GIVE_UP else None

    def on_report(self) -> bool:
        """Count one report; start a background evaluation when one falls due and none runs
        (one past its deadline is given up here). Returns whether one started."""
        if not self.enabled or self.hung:
            return False
        self._reports += 1
        if self.running and self._clock() - self._started > self.timeout_s + 1.0:
            self._give_up(self._clock() - self._started)
            return False
        if self._reports % self.interval or self.running:
            return False
        self._started = self._clock()
        self._start(time.monotonic() + self.timeout_s)
        return True

    def _start(self, deadline: float) -> threading.Thread:
        """Start evaluating the learner's weights of now in a daemon thread."""
        self._thread = threading.Thread(target=self._play, args=(self._get_weights(), deadline),
                                        name="impala-evaluation", daemon=True)
        self._thread.start()
        return self._thread

    def evaluate(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Evaluate the learner's current weights now (within ``timeout_s``, at most the
        evaluator's own); the result (also ``latest()`` from now on).

        Raises:
          ImpalaError: the evaluation failed, ran past its deadline, or hangs.
          KeyboardInterrupt: a signal while it played (the evaluation is cancelled).
        """
        timeout = self.timeout_s if timeout_s is None else min(timeout_s, self.timeout_s)
        deadline = time.monotonic() + timeout
        if not self.hung:
            self.wait(max(0.0, deadline - time.monotonic()))  # a background one first
            if self.running:
                self._give_up(timeout)
        if self.hung:
            raise ImpalaError(f"evaluation failed: {self.error}")
        thread = self._start(deadline)
        try:
            # a thread alive a second past the deadline is stuck inside the env
            thread.join(max(0.0, deadline - time.monotonic()) + 1.0)
        except BaseException:  # a signal ends the run: the evaluation stops at its next step
            self._cancel.set()
            raise
        if thread.is_alive():
            self._give_up(timeout)
        if self.error is not None:
            raise ImpalaError(f"evaluation failed: {self.error}")
        return self.latest()

    def wait(self, timeout: float | None = None) -> None:
        """Block until a background evaluation (if any) has finished."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _give_up(self, seconds: float) -> None:
        """An evaluation that outlived its deadline is stuck in the env: no more of them."""
        self.hung = True
        self._cancel.set()
        self._failed(f"an evaluation has not finished in {seconds:.0f} s (its deadline: "
                     f"{self.timeout_s:g} s): the env hangs in reset() or step() when "
                     "evaluated; no more evaluations in this run")

    def _failed(self, text: str) -> None:
        with self._lock:
            self.error = text
            self.num_failed += 1
            self._failed_in_a_row += 1

    def _play(self, weights_and_version: tuple[list, int], deadline: float) -> None:
        weights, version = weights_and_version
        try:
            with self._playing:  # one evaluation at a time on the one env and model
                started = time.perf_counter()
                env_steps = self._get_env_steps()
                env, model = self._env_and_model()
                model.set_weights(weights)
                rng = np.random.default_rng(self._rng_seed)  # the same draws every time
                means = {f"episode_return_mean_{mode}": float(np.mean(play_episodes(
                    env, model, self.seeds, mode == "greedy", rng,
                    clip=self._config.clip_actions, squash=self._config.squash_actions,
                    deadline=deadline, cancel=self._cancel))) for mode in self.modes}
        except Exception as exc:  # reported in stats(), never the driver's failure
            if not (self.hung or self._cancel.is_set()):  # a cancelled one did not fail
                self._failed(f"{type(exc).__name__}: {exc}")
            return
        with self._lock:
            self._latest = {**means, "weights_version": int(version),
                            "num_steps_sampled": int(env_steps),
                            "num_episodes": self.num_episodes,
                            "num_evaluations": self._latest["num_evaluations"] + 1,
                            "time_s": round(time.perf_counter() - started, 4)}
            self.error = None
            self._failed_in_a_row = 0

    def _env_and_model(self) -> tuple[Any, NumpyModel]:
        if self._env is None:
            env = self._config.env
            self._env = env() if callable(env) else make_env(env)
            self._model = evaluation_model(self._config, *self._spaces)
        assert self._model is not None
        return self._env, self._model

    def close(self) -> None:
        """Stop a running evaluation at its next step (an env stuck in a call is left to its
        daemon thread), then close its env."""
        self._cancel.set()
        self.wait(2.0)
        if self._env is not None and not self.running:
            self._env.close()
            self._env = None
