"""bench.atari: a run's curve read from metrics.csv, the figures taken from it, the table."""

from __future__ import annotations

import csv

from bench import atari


def _metrics(path, rows):
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, ["time_total_s", "num_steps_sampled", "episode_return_mean"])
        writer.writeheader()
        for t, steps, ret in rows:
            writer.writerow({"time_total_s": t, "num_steps_sampled": steps,
                             "episode_return_mean": ret})


def test_the_curve_and_the_figures_read_from_it(tmp_path):
    _metrics(tmp_path / "metrics.csv", [(5.0, 1000, ""), (590.0, 900_000, -20.5),
                                        (1190.0, 2_000_000, 3.25), (1250.0, 2_100_000, 18.0),
                                        (3590.0, 6_000_000, 20.4)])
    curve = atari.read_curve(tmp_path / "metrics.csv", 10.0)
    assert curve[0][:2] == (15.0, 1000) and curve[0][2] != curve[0][2]  # NaN: no episode yet
    assert atari.at_minutes(curve, 10) == -20.5  # the report at 600 s
    assert atari.at_minutes(curve, 20) == 3.25 and atari.at_minutes(curve, 60) == 20.4
    assert atari.at_minutes(curve, 0.1) is None
    assert atari.minutes_to(curve, 18.0) == round(1260.0 / 60, 1)
    assert atari.minutes_to(curve, 21.0) is None
    assert atari.at_steps(curve, 1_000_000) == -20.5 and atari.at_steps(curve, 500) is None


def test_the_table_says_not_reached_and_names_the_papers_scores():
    run = {"env": "ALE/Pong-v5", "seed": 7, "return_at_minutes": {"10": -20.1, "20": -12.0,
                                                                  "30": 2.5, "60": 17.0},
           "target": 18.0, "minutes_to_target": None, "agent_steps": 6_400_000,
           "agent_steps_per_s": 1777.7, "env_frames_per_s": 7111.1,
           "loadavg_before": [1.5, 1, 1], "loadavg_after": [2.25, 1, 1]}
    text = atari.markdown([run])
    assert ("| ALE/Pong-v5 | 7 | -20.1 / -12 / 2.5 / 17 | not reached | 6.40M | 1,778 | "
            "7,111 | 1.5, 2.2 |") in text
    assert "| ALE/Pong-v5 | 20.4 | 20.98 |" in text


def test_the_summary_gives_the_solve_rate_the_median_and_the_worst_seed():
    def run(env, at_60, to):
        return {"env": env, "seed": 1, "return_at_minutes": {"60": at_60},
                "minutes_to_target": to, "target": 18.0 if env == "ALE/Pong-v5" else None,
                "agent_steps": 1, "agent_steps_per_s": 1.0, "env_frames_per_s": 4.0,
                "loadavg_before": [1.0], "loadavg_after": [1.0]}

    pong = [run("ALE/Pong-v5", 18.96, 47.9), run("ALE/Pong-v5", 18.86, 57.8)]
    breakout = [run("ALE/Breakout-v5", 30.5, None)]
    assert atari.summary(pong + breakout) == [
        "- ALE/Pong-v5, 2 seeds: return at 60 min median 18.91, worst 18.86; +18 reached on "
        "2/2, minutes to it median 52.85, worst 57.8",
        "- ALE/Breakout-v5, 1 seed: return at 60 min median 30.5, worst 30.5"]
    # A seed that never reached +18 is slower than any that did: the median of 3 is the
    # slower of the two that reached it, and the worst is "not reached".
    third = run("ALE/Pong-v5", 12.0, None)
    assert atari.summary([*pong, third]) == [
        "- ALE/Pong-v5, 3 seeds: return at 60 min median 18.86, worst 12; +18 reached on 2/3, "
        "minutes to it median 57.8, worst not reached"]
    assert atari.summary([pong[0], third])[0].endswith("median not reached, worst not reached")
    assert "\n".join(atari.summary(pong)) in atari.markdown(pong)  # under the table


def test_only_the_report_runs_leave_a_gif_in_the_results(tmp_path, monkeypatch):
    calls = []

    def fake_run(env_id, seed, minutes, extra, gif_dir):
        calls.append(gif_dir)
        return {"return_at_minutes": {}, "minutes_to_target": None, "agent_steps_per_s": 1.0}

    monkeypatch.setattr(atari, "one_run", fake_run)
    monkeypatch.setattr(atari, "RESULTS", tmp_path)
    monkeypatch.setattr(atari, "RUNS_FILE", tmp_path / "atari_runs.jsonl")
    quiet = lambda *a, **k: None  # noqa: E731
    atari.runs("ALE/Pong-v5", 1, 1.0, (), path=tmp_path / "atari_runs.jsonl", log=quiet)
    atari.runs("ALE/Pong-v5", 1, 1.0, (), path=tmp_path / "tuning.jsonl", log=quiet)
    assert calls == [tmp_path, None]
    assert len((tmp_path / "tuning.jsonl").read_text().splitlines()) == 1
