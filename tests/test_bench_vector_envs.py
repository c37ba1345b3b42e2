"""bench.vector_envs: the ceiling measurement runs both paths, the report says what it
measured, and the verdict follows the intervals (the full bench's figures are in
docs/results/vector_envs.md)."""

from __future__ import annotations

import pytest

from bench import vector_envs


def test_the_ceiling_measures_both_paths_and_their_ratio():
    rows = vector_envs.ceiling([4], rounds=2, seconds=0.3, log=lambda m: None)
    (row,) = rows
    assert row["envs_per_worker"] == 4
    assert len(row["rounds"]["per-env"]) == len(row["rounds"]["vector"]) == 2
    assert row["per-env_steps_per_s"] > 0 and row["vector_steps_per_s"] > 0
    assert row["ratio"] == pytest.approx(row["vector_steps_per_s"]
                                         / row["per-env_steps_per_s"], rel=0.01)


def _solve_runs(seconds):
    return [{"reached": s is not None, "seconds_to_target": s,
             "env_steps_to_target": None if s is None else 500_000} for s in seconds]


@pytest.mark.parametrize(("per_env", "vector", "expected"), [
    ([9.0, 9.5, 10.0, 9.2, 9.8], [6.0, 6.2, 6.1, 5.9, 6.3], "vector faster"),
    ([9.0, 6.0, 10.0, 6.5, 9.8], [6.0, 9.2, 6.1, 9.9, 6.3], "inconclusive"),
    ([6.0, 6.2, 6.1, 5.9, 6.3], [9.0, None, 10.0, 9.2, 9.8], "per-env faster"),
])
def test_the_solve_verdict_follows_the_intervals(monkeypatch, per_env, vector, expected):
    runs = {"per-env": iter(_solve_runs(per_env)), "vector": iter(_solve_runs(vector))}

    def fake(seed, max_seconds, extra_args=()):
        return {**next(runs["vector" if extra_args else "per-env"]), "seed": seed}

    monkeypatch.setattr(vector_envs.solves, "time_to_solve", fake)
    out = vector_envs.solve([1, 2, 3, 4, 5], 32, 60.0, log=lambda m: None)
    assert out["verdict"] == expected
    assert out["vector"]["n"] == 5
    assert out["vector"]["solved"] == sum(v is not None for v in vector)
    text = vector_envs.markdown({
        "cpus": 2, "command": "python -m bench.vector_envs", "rounds": 2, "seconds": 1.0,
        "ceiling": [{"envs_per_worker": 8, "per-env_steps_per_s": 100_000,
                     "vector_steps_per_s": 350_000, "ratio": 3.5}],
        "end_to_end": {p: {"envs_per_worker": 8, "sampled_per_s": 1, "trained_per_s": 1}
                       for p in vector_envs.PATHS},
        "solve": out})
    assert "| 8 | 100,000 | 350,000 | 3.50x |" in text
    assert f"Verdict on the seconds: {expected}." in text
    if None in vector:
        assert "| not solved |" in text  # the worst of the vector side


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        vector_envs.main(["--envs-per-worker", "0"])
