"""A Box-action run's dashboard shows its Gaussian policy's action mean and std; a Discrete
run's looks as before.

Headless, as tests/test_dashboard.py: fake runs give exact figures for the cards, the plot, the
terminal view and report.png; one short inline Pendulum-v1 run checks the same against live
stats, and that metrics.csv and the TensorBoard summaries carry both figures.
"""

from __future__ import annotations

import copy
import csv
import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from impala_lab.dashboard import markup, plots, terminal
from impala_lab.dashboard.format import fmt_float
from impala_lab.dashboard.tensorboard import TensorBoardWriter, scalar_tags
from impala_lab.dashboard.widgets import Dashboard
from impala_lab.stats import flatten
from tests.dashboard_fakes import STATS, FakeRun, png_size, visible

BOX = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
BOX_STATS = copy.deepcopy(STATS)
BOX_STATS["learner"].update(action_mean=0.1234, action_std=0.8766)
CARDS_BEFORE = ["sample_throughput", "train_throughput", "episode_return_mean", "evaluation",
                "num_steps_sampled", "weights_version", "policy_lag",
                "policy_lag_at_training", "time_total_s"]


class BoxRun(FakeRun):
    """A fake run with an action space (a real run has one)."""

    def __init__(self, stats: dict, action_space) -> None:
        super().__init__(stats)
        self.action_space = action_space


def _classes(widget) -> set[str]:
    out, todo = set(), [widget]
    while todo:
        w = todo.pop()
        out |= set(w._dom_classes)
        todo.extend(getattr(w, "children", ()))
    return out


def _record(run: FakeRun, n: int) -> None:
    for i in range(n):
        run.snapshot["time_total_s"] = float(i)
        run.snapshot["learner"]["action_mean"] = 0.1 * i
        run.snapshot["learner"]["action_std"] = 1.0 - 0.05 * i
        run.record()


def test_box_actions_is_true_for_a_box_only():
    assert markup.box_actions(BOX) is True
    assert markup.box_actions(gym.spaces.Discrete(2)) is False
    assert markup.box_actions(None) is False


def test_a_box_run_shows_the_action_mean_and_std_in_cards_and_a_plot():
    run = BoxRun(BOX_STATS, BOX)
    board = Dashboard(run, poll_hz=0)
    assert board.box_actions
    board.refresh()
    cards = {name: " ".join(visible(w.value)) for name, w in board.cards.items()}
    assert list(cards) == [*CARDS_BEFORE, "action_mean", "action_std"]
    assert cards["action_mean"] == "action mean 0.123"
    assert cards["action_std"] == "action std 0.877"
    assert {"impala-stat-action-mean", "impala-stat-action-std",
            "impala-plot-actions"} <= _classes(board.widget)
    blank = board.plots["actions"].value
    _record(run, 5)
    board.refresh()
    png = board.plots["actions"].value
    assert png != blank and png_size(png) == (470, 230)
    # before the first learner step: the cards say there is no figure yet
    run.snapshot["learner"] = {}
    board.refresh()
    assert " ".join(visible(board.cards["action_std"].value)) == "action std –"


@pytest.mark.parametrize("space", [gym.spaces.Discrete(2), None])
def test_a_discrete_run_looks_as_before(space):
    run = BoxRun(STATS, space) if space is not None else FakeRun()
    board = Dashboard(run, poll_hz=0)
    board.refresh()
    assert not board.box_actions
    assert list(board.cards) == CARDS_BEFORE
    assert list(board.plots) == list(plots.LIVE_VIEWS)
    assert not {c for c in _classes(board.widget) if "action" in c}
    assert "actions" not in terminal.render(STATS)


def test_the_action_plot_draws_both_series_with_their_legend():
    run = FakeRun(BOX_STATS)
    _record(run, 8)
    fig = plots.view_figure("actions", run.history)
    ax = fig.axes[0]
    assert ax.get_title(loc="left") == "actions"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["mean", "std"]
    mean, std = (line.get_ydata() for line in ax.get_lines()[:2])
    np.testing.assert_allclose(mean, 0.1 * np.arange(8))
    np.testing.assert_allclose(std, 1.0 - 0.05 * np.arange(8))


def test_the_terminal_view_adds_an_actions_line_for_a_box_run():
    lines = terminal.render(BOX_STATS, "Pendulum-v1 (inline, 3 workers)").splitlines()
    assert len(lines) == 8 and max(map(len, lines)) <= 100
    assert lines[5].startswith("learner     loss 49,665")  # the learner line as before
    assert lines[6] == "actions     mean 0.123  std 0.877"


def test_report_png_has_an_actions_panel_only_for_a_box_run():
    def rows(stats: dict) -> list[dict]:
        flat = flatten({k: v for k, v in stats.items() if k != "pipeline"})
        return [{**flat, "time_total_s": float(i)} for i in range(10)]

    box, discrete = rows(BOX_STATS), rows(STATS)
    assert plots.has_actions(box) and not plots.has_actions(discrete)
    titles = [ax.get_title(loc="left") for ax in plots.report_figure(box).axes]
    assert "actions" in titles and len(titles) == 9  # 4 above, 5 in the learner row
    titles = [ax.get_title(loc="left") for ax in plots.report_figure(discrete).axes]
    assert "actions" not in titles and len(titles) == 8


def test_the_metrics_table_explains_the_action_figures():
    page = (Path(__file__).parents[1] / "docs" / "training.md").read_text()
    table = page[page.index("## Logged metrics explained"):]
    table = table[:table.index("\n## ", 10)]
    row = next(line for line in table.splitlines() if line.startswith("| `learner` |"))
    assert "`action_mean`" in row and "`action_std`" in row


# ---------------------------------------------------------------------- a real Box run
def test_a_live_pendulum_run_shows_and_logs_its_action_mean_and_std(tmp_path):
    from impala_lab import Impala
    from impala_lab.cli.run_folder import RunFolder

    with Impala(env="Pendulum-v1", backend="inline", num_workers=1, num_envs_per_worker=2,
                sample_batch_size=20, train_batch_size=80, model=(32, 32), seed=0) as run:
        def trained(stats: dict) -> bool:  # the learner stats come with its first updates
            return (stats.get("learner") or {}).get("policy_version", 0) >= 2 and \
                stats["num_steps_sampled"] >= 800

        assert run.train(trained, max_seconds=60, report_interval=0.05)["stop_reason"] != \
            "max_seconds"
        board = Dashboard(run, poll_hz=0)
        s = board.refresh()
        learner = s["learner"]
        assert math.isfinite(learner["action_mean"]) and learner["action_std"] > 0
        assert board.box_actions and "actions" in board.plots
        assert " ".join(visible(board.cards["action_mean"].value)) == \
            f"action mean {fmt_float(learner['action_mean'])}"
        assert " ".join(visible(board.cards["action_std"].value)) == \
            f"action std {fmt_float(learner['action_std'])}"
        assert board.plot_renders == len(board.plots)  # the actions plot drawn too
        assert "actions     mean " in board.text(s)
        # metrics.csv: a column each, as impala-lab train writes it
        folder = RunFolder(tmp_path / "run")
        try:
            assert folder.append_metrics(run.history.rows())
        finally:
            folder.close()
        with open(tmp_path / "run" / "metrics.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert math.isfinite(float(rows[-1]["learner.action_mean"]))
        assert float(rows[-1]["learner.action_std"]) > 0
        # TensorBoard: a scalar each
        tags = scalar_tags(s)
        assert tags["learner/action_mean"] == pytest.approx(learner["action_mean"])
        assert tags["learner/action_std"] == pytest.approx(learner["action_std"])
        with TensorBoardWriter(tmp_path / "tb") as writer:
            writer.write(s)
        from tests.test_tensorboard import read_events

        acc = read_events(tmp_path / "tb")
        assert {"learner/action_mean", "learner/action_std"} <= set(acc.Tags()["tensors"])
