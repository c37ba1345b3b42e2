"""bench.one_file: both sides on every seed in alternating order, a miss counts as a failure,
the one-file run is timed from outside (its stdout read on the bench's clock), and
``python -m bench --only one_file`` writes its results files."""

from __future__ import annotations

import json
import sys

import pytest

from bench import one_file, solves


def fake_run(seed: int, secs: float | None) -> dict:
    return {"seed": seed, "reached": secs is not None, "solved": secs is not None,
            "wall_s": 1.0, "seconds_to_target": secs,
            "env_steps_to_target": None if secs is None else int(secs * 1000)}


def test_compare_alternates_the_sides_and_counts_a_miss_as_a_failure():
    order = []
    times = {"one_file": {1: 10.0, 2: 12.0, 3: None}, "library": {1: 20.0, 2: 15.0, 3: 18.0}}

    def runner(side):
        def run(seed):
            order.append((seed, side))
            return fake_run(seed, times[side][seed])
        return run

    lines: list[str] = []
    r = one_file.compare([1, 2, 3], 60.0, log=lambda *a, **k: lines.append(a[0]),
                         runners={s: runner(s) for s in one_file.SIDES})
    assert order == [(1, "one_file"), (1, "library"), (2, "library"), (2, "one_file"),
                     (3, "one_file"), (3, "library")]
    mine, lib = r["one_file"], r["library"]
    assert (mine["num_solved"], mine["median_s"], mine["max_s"]) == (2, 12.0, None)
    assert (lib["num_solved"], lib["median_s"], lib["max_s"]) == (3, 18.0, 20.0)
    assert any("no 475 within 60 s" in x for x in lines)
    md = one_file.markdown(r)
    assert "| examples/impala_in_one_file.py | 2/3 | 12.0 s | never (a seed missed) |" in md
    assert "| impala-lab train (tuned preset) | 3/3 | 18.0 s | 20.0 s | 18,000 |" in md
    assert "| 3 | — | 18.0 |" in md and "random (1, 2, 3), cap 60 s" in md


# The lines examples/impala_in_one_file.py prints (its main's format strings).
PROGRESS_LINE = ("   2.0 s  steps    12,800  updates    16  return  22.1  loss    -12.0  pg  "
                 "-3.0  vf     18.0  entropy 0.690  rho 1.000  lag 1.5\n")
STARVED_LINE = ("   0.5 s  steps         0  updates     0  return   nan  loss      0.0  pg     "
                "0.0  vf      0.0  entropy 0.000  rho 0.000  lag 0.0\n")
SOLVED_LINE = ("solved: mean return of the last 100 episodes 476.3 >= 475 after 8.1 s, "
               "392,000 env steps, 480 updates\n")


def test_read_run_times_the_solved_line_on_the_benchs_clock():
    ticks = iter([3.0, 5.0, 9.5, 9.6])  # the clock as each line arrives

    r = one_file.read_run([STARVED_LINE, PROGRESS_LINE, SOLVED_LINE, "more output\n"],
                          lambda: next(ticks), launched=1.25)
    # 8.25 s from the launch: the bench's clock, not the 8.1 s the run printed
    assert r == {"solved": True, "seconds_to_target": 8.25, "env_steps": 392_000,
                 "updates": 480, "return_mean": 22.1}


def test_read_run_without_a_solved_line_reports_the_last_progress():
    r = one_file.read_run([PROGRESS_LINE, "not solved within 30 s\n"], lambda: 4.0, 0.0)
    assert r == {"solved": False, "seconds_to_target": None, "env_steps": 12_800,
                 "updates": 16, "return_mean": 22.1}
    empty = one_file.read_run([], lambda: 0.0, 0.0)
    assert not empty["solved"] and empty["env_steps"] is None


def test_one_file_run_reads_a_real_process_and_reports_a_crash(tmp_path):
    script = tmp_path / "fake.py"
    script.write_text(
        "import os, sys\n"
        "seed = int(sys.argv[sys.argv.index('--seed') + 1])\n"
        f"print({PROGRESS_LINE!r}, end='')\n"
        "print(f'solved: mean return of the last 100 episodes 480.0 >= 475 after 1.0 s, '\n"
        "      f'{seed * 1000:,} env steps, 5 updates')\n"
        "assert os.environ['OPENBLAS_NUM_THREADS'] == '1'  # as the library's actors\n")
    r = one_file.one_file_run(37, 30.0, script=script)
    assert r["solved"] and r["env_steps_to_target"] == 37_000 and r["updates"] == 5
    assert 0 <= r["seconds_to_target"] <= r["wall_s"]
    script.write_text("import sys\nprint('half a line'); sys.exit('it broke')\n")
    with pytest.raises(RuntimeError, match="exited with 1:\nit broke"):
        one_file.one_file_run(1, 30.0, script=script)


def test_bench_only_one_file_draws_random_seeds_and_writes_its_results(tmp_path, monkeypatch,
                                                                       capsys):
    from bench.__main__ import main

    def fake_compare(seeds, max_s, log=print, runners=None):
        runs = {side: [fake_run(s, 5.0 + i) for i, s in enumerate(seeds)]
                for side in one_file.SIDES}
        return {"seeds": seeds, "max_seconds": max_s, "stop_return": 475.0,
                **{side: solves.summarize_solves(runs[side], max_s,
                                                 solve_limit_s=max_s)
                   for side in one_file.SIDES}}

    monkeypatch.setattr(one_file, "compare", fake_compare)
    drawn = []
    for _ in range(2):
        assert main(["--only", "one_file", "--solve-seeds", "3", "--out", str(tmp_path)]) == 0
        saved = json.loads((tmp_path / "one_file_results.json").read_text())
        assert len(set(saved["seeds"])) == 3
        drawn.append(saved["seeds"])
        assert str(saved["seeds"]) in capsys.readouterr().out  # printed
    assert drawn[0] != drawn[1]  # drawn afresh per run (1 in ~10^12 to collide)
    assert "| examples/impala_in_one_file.py | 3/3 | 6.0 s | 7.0 s |" in (
        tmp_path / "one_file_results.md").read_text()
    assert sys.modules["bench.one_file"] is one_file
