"""The CLI's progress view: a bar towards the nearest limit in a terminal, today's one line per
report elsewhere."""

from __future__ import annotations

import io

import pytest

from impala_lab.cli.progress import (
    Progress,
    ProgressView,
    StopGoal,
    bar_line,
    goal_progress,
    return_progress,
)
from impala_lab.dashboard import terminal

STATS = {
    "sample_throughput": 7323.68, "train_throughput": 19093.798,
    "num_steps_sampled": 22400, "num_steps_trained": 58400, "num_steps_replayed": 7600,
    "time_total_s": 30.5, "episode_return_mean": 33.93, "episode_return_count": 100,
    "episodes_total": 916, "policy_lag": {"mean": 4.42, "max": 18}, "weights_version": 74,
    "pipeline": {"backend": "inline", "num_workers": 3, "in_flight": {"0": 2, "1": 1, "2": 0},
                 "learner_queue_len": 5, "learner_queue_size": 16},
}


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# ---------------------------------------------------------------------- fractions
def test_env_steps_fraction() -> None:
    p = goal_progress(STATS, StopGoal(max_env_steps=44_800), seconds=3.0)
    assert p == Progress(0.5, "env steps 22,400 / 44,800")
    assert goal_progress(STATS, StopGoal(max_env_steps=1000), 3.0).fraction == 1.0


def test_time_fraction() -> None:
    assert goal_progress(STATS, StopGoal(max_seconds=60), seconds=15.0) == Progress(
        0.25, "time 15 / 60 s")
    assert goal_progress(STATS, StopGoal(max_seconds=60), seconds=90.0).fraction == 1.0


def test_return_fraction_runs_from_the_lowest_mean_seen_to_the_target() -> None:
    assert return_progress(33.93, 475, low=22.0) == Progress(
        pytest.approx((33.93 - 22) / (475 - 22)), "mean return 33.9 / 475")
    assert return_progress(33.93, 475, low=None).fraction == 0.0  # the first mean: the start
    assert return_progress(480.0, 475, low=22.0).fraction == 1.0
    # Negative returns (Acrobot, Pendulum): from -500 towards -100, halfway at -300.
    assert return_progress(-300.0, -100, low=-500.0).fraction == pytest.approx(0.5)
    assert return_progress(float("nan"), 475, low=22.0) == Progress(0.0, "mean return – / 475")


def test_the_bar_follows_the_limit_furthest_along() -> None:
    goal = StopGoal(stop_return=475, max_env_steps=44_800, max_seconds=600)
    assert goal_progress(STATS, goal, seconds=60.0, low_return=22.0).label == (
        "env steps 22,400 / 44,800")
    assert goal_progress(STATS, goal, seconds=540.0, low_return=22.0).label == "time 540 / 600 s"
    assert goal_progress({**STATS, "episode_return_mean": 400.0}, goal, 60.0, 22.0).label == (
        "mean return 400.0 / 475")
    assert goal_progress(STATS, StopGoal(), seconds=5.0) is None


def test_bar_line() -> None:
    assert bar_line(Progress(0.5, "env steps 22,400 / 44,800"), 12.44, width=10) == (
        "progress [#####·····]  50%  env steps 22,400 / 44,800   12.4 s")
    assert bar_line(None, 3.0) == "progress: no stop condition, Ctrl-C ends the run   3.0 s"


# ---------------------------------------------------------------------- the view
def test_not_a_terminal_prints_exactly_the_progress_lines_of_before() -> None:
    out = io.StringIO()  # isatty() is False, as in a log or a pipe
    view = ProgressView(StopGoal(stop_return=475, max_env_steps=44_800), stream=out, title="t")
    assert not view.live
    view.update(STATS)
    view.update(STATS)  # no new samples: the line says so, as the terminal view's does
    view.close()
    assert out.getvalue().splitlines()[0] == (
        "   30.5s  steps    22,400  return    33.9  sample    7,324/s  train   19,094/s"
        "  queue  5/16  lag 4.4")
    before = io.StringIO()
    old = terminal.TerminalView(before, title="t", live=False)
    old.update(STATS)
    old.update(STATS)
    assert out.getvalue() == before.getvalue()
    assert "progress" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_a_terminal_gets_the_bar_over_the_panel_redrawn_in_place() -> None:
    out, clock = FakeTerminal(), FakeClock()
    view = ProgressView(StopGoal(max_env_steps=44_800), stream=out, title="CartPole-v1",
                        clock=clock)
    assert view.live
    clock.now += 2.0  # building the run: not counted
    view.begin()
    clock.now += 12.5
    view.update(STATS)
    first = out.getvalue()
    lines = first.split("\n")
    assert lines[0] == ("\x1b[2Kprogress [" + "#" * 15 + "·" * 15 + "]  50%  env steps "
                        "22,400 / 44,800   12.5 s")
    panel = terminal.render(STATS, "CartPole-v1").split("\n")
    assert lines[1:-1] == ["\x1b[2K" + line for line in panel]
    view.update({**STATS, "num_steps_sampled": 44_800})
    second = out.getvalue()[len(first):]
    assert second.startswith(f"\x1b[{len(panel) + 1}F")  # up over the bar and the panel
    assert "] 100%  env steps 44,800 / 44,800" in second


def test_forcing_live_mode_on_a_plain_stream() -> None:
    out = io.StringIO()
    ProgressView(StopGoal(max_seconds=60), stream=out, live=True).update(STATS)
    assert out.getvalue().startswith("\x1b[2Kprogress [")
