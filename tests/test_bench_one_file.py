"""bench.one_file: both sides on every seed in alternating order, a miss counts as a failure,
the RESULT line is read, and ``python -m bench --only one_file`` writes its results files."""

from __future__ import annotations

import json
import sys

from bench import one_file


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


def test_one_file_run_reads_the_last_result_line(tmp_path):
    script = tmp_path / "fake.py"
    script.write_text(
        "import json, sys\n"
        "print('RESULT ' + json.dumps({'solved': False}))\n"
        "seed = int(sys.argv[sys.argv.index('--seed') + 1])\n"
        "print('RESULT ' + json.dumps({'solved': True, 'seconds_to_target': seed / 10,"
        " 'env_steps': 1234, 'updates': 5, 'return_mean': 480.0}))\n")
    r = one_file.one_file_run(37, 30.0, script=script)
    assert r["solved"] and r["seconds_to_target"] == 3.7 and r["env_steps_to_target"] == 1234
    script.write_text("print('no result')\n")
    try:
        one_file.one_file_run(1, 30.0, script=script)
    except ValueError as exc:
        assert "no RESULT line" in str(exc)
    else:
        raise AssertionError("a run without a RESULT line must fail")


def test_bench_only_one_file_draws_random_seeds_and_writes_its_results(tmp_path, monkeypatch,
                                                                       capsys):
    from bench.__main__ import main

    def fake_compare(seeds, max_s, log=print, runners=None):
        runs = {side: [fake_run(s, 5.0 + i) for i, s in enumerate(seeds)]
                for side in one_file.SIDES}
        return {"seeds": seeds, "max_seconds": max_s, "stop_return": 475.0,
                **{side: one_file.pipeline.summarize_solves(runs[side], max_s,
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
