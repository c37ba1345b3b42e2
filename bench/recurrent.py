"""The recurrent benchmarks of ``python -m bench``: the memory task, and what memory costs.

    memory_task(seeds, max_s)      per seed: the LSTM policy to a trailing-100 mean of 350 on
                                   impala_lab/StatelessCartPole-v1, and the feed-forward policy
                                   given the same seconds (its best trailing-100 mean)
    actor_forward(num_envs, ...)   the actor's numpy forward per env step, LSTM against MLP
    learner_rates(seconds, ...)    learn_on_batch samples/s, LSTM against MLP

Each run is ``impala-lab train --env impala_lab/StatelessCartPole-v1 --stop-return 350
--max-seconds S --seed S`` in a fresh process (`solves.time_to_solve`), with ``--use-lstm
true`` or ``false``; both take the env's tuned preset. The speed figures alternate their two
sides window by window in one process, so that drifts of the machine touch both.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench import pipeline, solves

ENV = "impala_lab/StatelessCartPole-v1"
STOP_RETURN = 350.0  # RLlib's tuned target for StatelessCartPole


def memory_task(seeds: list[int], max_s: float, log: Any = print) -> dict[str, Any]:
    """The LSTM and the feed-forward policy on the same seeds, ``max_s`` seconds each.

    Returns:
      ``{"lstm": summary, "feed_forward": {"runs", "best_return_mean" (median, worst,
      best over seeds)}, "max_s"}``; ``summary`` is `solves.summarize_solves`'s (solve
      rate, median and worst seconds and env steps to 350, a seed that never got there
      counting as infinitely slow).
    """
    lstm_runs, ff_runs = [], []
    for i, seed in enumerate(seeds):
        for use_lstm, runs in ((True, lstm_runs), (False, ff_runs)):
            r = solves.time_to_solve(
                seed, max_s, STOP_RETURN, ("--env", ENV, "--use-lstm", str(use_lstm).lower()),
                solve_limit_s=max_s)
            runs.append(r)
            what = "LSTM" if use_lstm else "feed-forward"
            reached = (f"reached {STOP_RETURN:g} in {r['seconds_to_target']:.1f} s, "
                       f"{r['env_steps_to_target']:,} env steps" if r["reached"] else
                       f"did not reach {STOP_RETURN:g}")
            log(f"        seed {seed} ({i + 1}/{len(seeds)}), {what}: {reached}; best "
                f"trailing-100 mean {r['best_return_mean']}; wall {r['wall_s']:.1f} s",
                flush=True)
    best = [r["best_return_mean"] for r in ff_runs if r["best_return_mean"] is not None]
    return {"max_s": max_s, "stop_return": STOP_RETURN,
            "lstm": solves.summarize_solves(lstm_runs, max_s, solve_limit_s=max_s),
            "feed_forward": {
                "runs": ff_runs, "num_reached": sum(r["reached"] for r in ff_runs),
                "median_best_return_mean": statistics.median(best) if best else None,
                "max_best_return_mean": max(best, default=None),
                "min_best_return_mean": min(best, default=None)}}


def _models(num_envs: int) -> tuple[Any, Any, Any]:
    """The numpy MLP and LSTM policies of the task's preset, with their initial weights,
    and a batch of ``num_envs`` observations."""
    import numpy as np

    from impala_lab.actor.numpy_model import NumpyModel
    from impala_lab.config import ImpalaConfig
    from impala_lab.driver.build import probe_spaces

    obs_space, action_space = probe_spaces(ENV)
    c = ImpalaConfig.tuned(ENV)
    out = []
    for use_lstm in (False, True):
        m = NumpyModel(obs_space, action_space, c.replace(use_lstm=use_lstm).model_spec)
        m.set_weights(list(m.initial_weights(0)))
        out.append(m)
    obs = np.stack([obs_space.sample() for _ in range(num_envs)])
    return out[0], out[1], obs


def actor_forward(num_envs: int = 8, rounds: int = 3, seconds: float = 1.0
                  ) -> dict[str, Any]:
    """What an actor pays per env step for its policy: the MLP's ``model(obs)`` (logits and
    value) against the LSTM's ``step(obs, state)`` (logits, value and the next state), on the
    same [num_envs, obs] batch, in ``rounds`` alternating windows of ``seconds`` each.

    Returns:
      ``{"num_envs", "mlp_us_per_env_step", "lstm_us_per_env_step", "ratio" (LSTM / MLP,
      the median of the windows' ratios), "rounds": [[mlp, lstm], ...]}``; microseconds per
      env step = a forward's time / num_envs.
    """
    mlp, lstm, obs = _models(num_envs)
    state = lstm.initial_state(num_envs)

    def mlp_call() -> None:
        mlp(obs)

    def lstm_call() -> None:
        lstm.step(obs, state)

    def window(fn: Any) -> float:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(100):
                fn()
            n += 100
        return 1e6 * (time.perf_counter() - t0) / n / num_envs

    for fn in (mlp_call, lstm_call):
        fn()
    pairs = [[round(window(mlp_call), 3), round(window(lstm_call), 3)] for _ in range(rounds)]
    return {"num_envs": num_envs,
            "mlp_us_per_env_step": statistics.median(p[0] for p in pairs),
            "lstm_us_per_env_step": statistics.median(p[1] for p in pairs),
            "ratio": round(statistics.median(b / a for a, b in pairs), 3), "rounds": pairs}


def learner_rates(rounds: int = 3, seconds: float = 3.0, warmup_steps: int = 3
                  ) -> dict[str, Any]:
    """``learn_on_batch`` samples/s of the MLP and the LSTM policy, each on pre-made train
    batches of the task's preset shape ([sample_batch_size, columns]), in ``rounds``
    alternating windows of ``seconds``.

    Returns:
      ``{"batch_shape", "mlp_samples_per_s", "lstm_samples_per_s", "ratio" (LSTM / MLP, the
      median of the windows' ratios), "rounds": [[mlp, lstm], ...]}``.
    """
    from bench.multi_gpu import make_batches
    from impala_lab.config import ImpalaConfig
    from impala_lab.driver.build import probe_spaces
    from impala_lab.learner.vtrace_policy import VTracePolicy

    spaces = probe_spaces(ENV)
    sides = []
    for use_lstm in (False, True):
        c = ImpalaConfig.tuned(ENV, seed=0, use_lstm=use_lstm)
        policy = VTracePolicy(*spaces, c)
        batches = make_batches(c, 2, seed=0)
        for i in range(warmup_steps):  # the first call traces the step
            policy.learn_on_batch(batches[i % 2])
        sides.append((policy, batches))
    pairs = []
    for _ in range(rounds):
        pair = []
        for policy, batches in sides:
            _, samples, dt = pipeline._learn_loop(policy, batches, seconds)
            pair.append(round(samples / dt, 1))
        pairs.append(pair)
    return {"batch_shape": list(sides[0][1][0].actions.shape),
            "mlp_samples_per_s": statistics.median(p[0] for p in pairs),
            "lstm_samples_per_s": statistics.median(p[1] for p in pairs),
            "ratio": round(statistics.median(b / a for a, b in pairs), 3), "rounds": pairs}
