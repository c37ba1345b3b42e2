"""A stand-in for `Impala` that ``impala-lab train`` can drive without TensorFlow or workers.

`FakeImpala` has the surface the CLI uses (train, record, save, restore, the evaluator, the
policy's weights, stop): each report "samples" `STEPS_PER_REPORT` env steps after sleeping
``report_interval``, its mean return is the env steps / 1000, and its checkpoints are real
ones (`impala_lab.driver.checkpoint`) of the network's real initial weights, so the run folder,
resume, signals, streams and evaluation deadlines are the CLI's own, in a second.

    python -m tests.fake_run train --out runs/x ...   # impala-lab with FakeImpala

Envs for evaluation faults (registered on import): ``RaisesInEval-v0`` raises on a reset with
a seed (only the evaluator resets with one), ``HangsInEval-v0`` sleeps for an hour there.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv

from impala_lab.driver import checkpoint
from impala_lab.driver.build import initial_weights
from impala_lab.driver.evaluation import Evaluator
from impala_lab.driver.run_stats import history_row
from impala_lab.stats import StatsHistory

STEPS_PER_REPORT = 1000


class RaisesInEval(CartPoleEnv):
    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        if seed is not None and seed > 1000:  # the evaluator's seeds are 32-bit draws
            raise RuntimeError("this env breaks in evaluation")
        return super().reset(seed=seed, options=options)


class HangsInEval(CartPoleEnv):
    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        if seed is not None and seed > 1000:
            time.sleep(3600)
        return super().reset(seed=seed, options=options)


for _name, _cls in (("RaisesInEval-v0", RaisesInEval), ("HangsInEval-v0", HangsInEval)):
    if _name not in gym.registry:
        gym.register(_name, entry_point=_cls, max_episode_steps=200)


class _Policy:
    def __init__(self, run: FakeImpala) -> None:
        self._run = run

    def get_weights(self) -> tuple[list[np.ndarray], int]:
        return self._run.weights, self._run.version


class FakeImpala:
    """What `impala_lab.cli.train` reads of a run (see the module docstring)."""

    def __init__(self, config: Any, weights: tuple[list, int] | None = None,
                 counters: dict[str, Any] | None = None) -> None:
        self.config = config
        env = gym.make(config.env)
        self.observation_space, self.action_space = env.observation_space, env.action_space
        env.close()
        self.weights, self.version = weights or (
            initial_weights(config, self.observation_space, self.action_space), 0)
        counters = counters or {}
        self.num_steps_sampled = counters.get("num_steps_sampled", 0)
        self._elapsed_before = counters.get("elapsed_s", 0.0)
        self._start = time.monotonic()
        self.history = StatsHistory(maxlen=100_000)
        self.policy = _Policy(self)
        self.last_error: str | None = None
        self.evaluator = Evaluator(config, self.observation_space, self.action_space,
                                   self.policy.get_weights, lambda: self.num_steps_sampled,
                                   timeout_s=float(os.environ.get("FAKE_EVAL_TIMEOUT", 600)))

    @property
    def elapsed_s(self) -> float:
        return self._elapsed_before + time.monotonic() - self._start

    def stats(self) -> dict[str, Any]:
        steps = self.num_steps_sampled
        s = {"time_total_s": round(self.elapsed_s, 3), "num_steps_sampled": steps,
             "num_steps_trained": steps, "episode_return_mean": steps / 1000,
             "episode_return_count": min(100, steps // 100), "last_error": self.last_error,
             "policy_lag": {"mean": 0.0, "max": 0},
             "health": {"status": "ok", "flags": [], "seen": {}, "num_updates_skipped": 0}}
        if self.evaluator.enabled:
            s["evaluation"] = self.evaluator.latest()
        return s

    def record(self) -> dict[str, Any]:
        s = self.stats()
        self.history.append(history_row(s))
        self.evaluator.on_report()
        return s

    def train(self, stop: Any = None, *, max_seconds: float | None = None,
              max_env_steps: int | None = None, report_interval: float = 1.0,
              on_report: Any = None, tensorboard_dir: Any = None) -> dict[str, Any]:
        start = time.monotonic()
        reason = None
        while reason is None:
            time.sleep(report_interval)
            self.num_steps_sampled += STEPS_PER_REPORT
            self.version += 1
            try:
                s = self.record()
                if on_report is not None:
                    on_report(s)
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                raise
            if stop is not None and stop(s):
                reason = "stop condition"
            elif max_env_steps is not None and self.num_steps_sampled >= max_env_steps:
                reason = "max_env_steps"
            elif max_seconds is not None and time.monotonic() - start >= max_seconds:
                reason = "max_seconds"
        final = self.record()
        final["stop_reason"] = reason
        return final

    def save(self, path: Any) -> Path:
        counters = {"num_steps_sampled": self.num_steps_sampled,
                    "num_steps_trained": self.num_steps_sampled, "num_weight_syncs": 0,
                    "episodes_total": 0, "elapsed_s": self.elapsed_s}
        state = checkpoint.checkpoint_state(self.config.to_dict(), self.version, counters)
        return checkpoint.write_checkpoint(path, state, self.weights, [np.zeros(2, np.float32)])

    @classmethod
    def restore(cls, path: Any, *, fallback_to_prev: bool = False, **overrides: Any
                ) -> FakeImpala:
        root, state, weights, _ = checkpoint.read_checkpoint_at(
            path, fallback_to_prev=fallback_to_prev)
        config = checkpoint.restored_config(root, state, overrides)
        return cls(config, (weights, state["policy_version"]), state["counters"])

    def stop(self) -> None:
        self.evaluator.close()


def main(argv: list[str]) -> int:
    """``impala-lab`` with `FakeImpala` for `Impala`."""
    from impala_lab.cli.main import main as cli_main

    with mock.patch("impala_lab.driver.impala.Impala", FakeImpala):
        return cli_main(argv)


if __name__ == "__main__":
    if os.environ.get("FAKE_FAIL_WRITES"):  # every write of these names fails with ENOSPC
        names = os.environ["FAKE_FAIL_WRITES"].split(",")
        real_replace = os.replace

        def replace(src: Any, dst: Any) -> None:
            if Path(dst).name in names:
                raise OSError(28, "No space left on device")
            real_replace(src, dst)

        os.replace = replace  # type: ignore[assignment]
    sys.exit(main(sys.argv[1:]))

