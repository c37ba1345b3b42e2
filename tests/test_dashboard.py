"""The dashboard's widgets without a frontend: they show what the stats say, the controls
reach the run, the poller moves the widgets, and a real run drives the same.

A fake run (`tests.dashboard_fakes`) gives exact, hand-made figures; one real inline
`Impala` checks the same against live stats, the knobs, the buttons and
``train(dashboard=True)``. The drawings themselves are in test_dashboard_drawing.py.
"""

from __future__ import annotations

import copy
import gc
import os
import re
import xml.etree.ElementTree as ET

import pytest

from impala_lab.dashboard import plots
from impala_lab.dashboard.widgets import Dashboard, frontend_available
from impala_lab.knobs import LIVE_KNOBS
from tests.dashboard_fakes import STATS, FakeRun, png_size, svg_texts, visible, walk
from tests.waiting import wait_for


# ---------------------------------------------------------------------- widgets, fake run
def test_no_frontend_in_pytest():
    assert frontend_available() is False


def test_refresh_shows_every_figure_of_the_stats():
    run = FakeRun()
    board = Dashboard(run, poll_hz=0)
    shown = board.refresh()
    assert shown == STATS
    cards = {name: " ".join(visible(w.value)) for name, w in board.cards.items()}
    assert cards == {"sample_throughput": "sampled 7,324/s", "train_throughput": "trained 19,094/s",
                     "episode_return_mean": "return (last 100) 33.9",
                     "evaluation": "eval return off",
                     "num_steps_sampled": "env steps 22,400", "weights_version": "weights v74",
                     "policy_lag": "policy lag 4.4",
                     "policy_lag_at_training": "lag at training 9.1",
                     "time_total_s": "time 30 s"}
    # Gauges: level / capacity of each queue, from the pipeline view.
    expected = {"in_flight": (3, 6), "replay": (14, 20), "batch_buffer": (400, 500),
                "learner_queue": (5, 16), "minibatch": (1, 2)}
    for name, (level, capacity) in expected.items():
        assert board.gauges[name].value == pytest.approx(level / capacity), name
        assert visible(board.gauge_labels[name].value) == [str(level), "/", str(capacity)]
    assert board.gauges["learner_queue"].style.bar_color == "#2e9e44"
    assert "balanced" in board.hint.value
    # The diagram's counters.
    svg = board.diagram.value
    assert svg_texts(svg, "impala-count-sampled") == ["env steps 22,400"]
    assert svg_texts(svg, "impala-sample-rate") == ["7,324/s"]
    assert svg_texts(svg, "impala-train-rate") == ["19,094/s"]
    assert svg_texts(svg, "impala-weights-version") == ["v74"]
    assert svg_texts(svg, "impala-learner-queue") == ["5 / 16"]
    assert svg_texts(svg, "impala-replay") == ["14 / 20"]
    assert svg_texts(svg, "impala-batch-buffer") == ["400 / 500"]
    assert svg_texts(svg, "impala-in-flight") == ["3 / 6"]
    assert svg_texts(svg, "impala-broadcast") == [
        "weight broadcast: v74 · 25 broadcasts · every 3 returned samples · 61 syncs"]
    assert svg_texts(svg, "impala-policy-lag")[0].startswith(
        "policy lag 4.4 updates (max 18) at the driver, 9.1 (max 30) when trained on")
    # The timing bars, the knobs, the state of the buttons.
    assert svg_texts(board.timing.value, "impala-timer-learner-grad-time-ms") == ["6.71"]
    assert svg_texts(board.timing.value, "impala-timer-optimizer-step-time-ms") == ["249"]
    assert {k: w.value for k, w in board.knobs.items()} == STATS["knobs"]
    assert set(board.knobs) == set(LIVE_KNOBS)
    assert "impala-status-paused" in board.header.value
    assert "3 workers" in board.header.value and "inline backend" in board.header.value
    assert (board.start_button.disabled, board.pause_button.disabled,
            board.stop_button.disabled) == (False, True, False)
    assert run.calls == []  # showing a snapshot never changes the run


def test_full_learner_queue_and_no_replay_are_shown_as_such():
    stats = copy.deepcopy(STATS)
    stats["pipeline"].update(learner_queue_len=16, replay_stored=0, replay_capacity=0)
    stats["learner_queue"]["mean"] = 15.0
    stats["knobs"]["replay_proportion"] = 0.0
    run = FakeRun(stats)  # the dashboard holds its run weakly: keep a reference
    board = Dashboard(run, poll_hz=0)
    board.refresh()
    assert board.gauges["learner_queue"].value == 1.0
    assert board.gauges["learner_queue"].style.bar_color == "#c0392b"
    assert "the <b>learner</b> is the bottleneck" in board.hint.value
    assert visible(board.gauge_labels["replay"].value) == ["off"]
    assert svg_texts(board.diagram.value, "impala-replay") == ["off"]
    assert board.knobs["replay_proportion"].disabled is True
    assert board.knobs["lr"].disabled is False
    assert "replay_buffer_num_slots=0" in board.message.value


def test_the_lr_slider_is_disabled_while_a_schedule_sets_the_rate():
    stats = copy.deepcopy(STATS)
    stats["lr_schedule"] = [[0, 0.01], [1000, 0.001]]
    stats["knobs"]["lr"] = stats["cur_lr"] = 0.0055
    run = FakeRun(stats)
    board = Dashboard(run, poll_hz=0)
    board.refresh()
    assert board.knobs["lr"].disabled is True
    assert board.knobs["entropy_coeff"].disabled is False
    run.snapshot["lr_schedule"] = None
    board.refresh()
    assert board.knobs["lr"].disabled is False


def test_empty_learner_queue_names_the_actors():
    stats = copy.deepcopy(STATS)
    stats["learner_queue"]["mean"] = 0.5
    run = FakeRun(stats)
    board = Dashboard(run, poll_hz=0)
    board.refresh()
    assert "the <b>actors</b> are the bottleneck" in board.hint.value


def test_a_snapshot_before_the_first_step_draws_without_errors():
    bare = {"num_steps_sampled": 0, "pipeline": {}, "learner": {}, "knobs": {},
            "episode_return_mean": float("nan"), "policy_lag": {"mean": float("nan"), "max": 0}}
    run = FakeRun(bare)
    board = Dashboard(run, poll_hz=0)
    board.refresh()
    assert " ".join(visible(board.cards["episode_return_mean"].value)) == "return (last 100) –"
    assert all(g.value == 0.0 for g in board.gauges.values())
    ET.fromstring(board.diagram.value)  # well-formed


def test_knob_controls_call_set_knobs_and_errors_are_shown():
    run = FakeRun()
    board = Dashboard(run, poll_hz=0)
    board.refresh()
    board.knobs["lr"].value = 0.001
    board.knobs["num_sgd_iter"].value = 4
    assert run.calls == [("set_knobs", {"lr": 0.001}), ("set_knobs", {"num_sgd_iter": 4})]
    assert "num_sgd_iter = 4: applied" in board.message.value
    # The run has not applied them yet: a refresh must not pull the sliders back.
    board.refresh()
    assert board.knobs["lr"].value == 0.001 and board.knobs["num_sgd_iter"].value == 4
    # Once applied, the run's values show; a change made in code shows too.
    run.snapshot["knobs"].update(lr=0.001, num_sgd_iter=4, entropy_coeff=0.02)
    run.knob_changes.append({"time_s": 31.25, "num_steps_sampled": 23000, "knob": "lr",
                             "value": 0.001})
    board.refresh()
    assert board.knobs["entropy_coeff"].value == 0.02
    assert " ".join(visible(board.knob_log.value)).endswith("31.2 s, step 23,000: lr = 0.001")
    assert len(run.calls) == 2  # syncing from the stats never calls set_knobs
    # A value the run refuses: the message names it, the slider returns to the run's value.
    run.snapshot["pipeline"]["replay_capacity"] = 0
    board.knobs["replay_proportion"].value = 1.5
    assert "replay_buffer_num_slots=0 is invalid" in board.message.value
    assert "#c0392b" in board.message.value
    board.refresh()
    assert board.knobs["replay_proportion"].value == 0.5


def test_buttons_follow_the_run_state_and_call_the_run():
    run = FakeRun()
    board = Dashboard(run, poll_hz=0, start_kwargs={"max_seconds": 60})
    board.refresh()
    board.start_button.click()
    assert run.calls[-1] == ("start", {"max_seconds": 60})
    assert "impala-status-training" in board.header.value
    assert (board.start_button.disabled, board.pause_button.disabled) == (True, False)
    board.pause_button.click()
    assert run.calls[-1] == ("pause",)
    assert (board.start_button.disabled, board.pause_button.disabled) == (False, True)
    run.background_error = RuntimeError("worker 1 died")
    board.refresh()
    assert "background training failed: RuntimeError: worker 1 died" in board.message.value
    assert "impala-status-failed" in board.header.value
    run.background_error = None
    board.stop_button.click()
    assert run.calls[-1] == ("stop",)
    assert "impala-status-stopped" in board.header.value
    assert all(b.disabled for b in (board.start_button, board.pause_button,
                                    board.stop_button))
    assert all(w.disabled for w in board.knobs.values())


def test_plots_are_drawn_only_when_the_history_has_new_rows():
    run = FakeRun()
    board = Dashboard(run, poll_hz=0)
    blank = {v: img.value for v, img in board.plots.items()}
    board.refresh()
    assert {v: img.value for v, img in board.plots.items()} == blank  # no rows yet
    for i in range(5):
        run.snapshot["time_total_s"] = float(i)
        run.snapshot["sample_throughput"] = 1000.0 * (i + 1)
        run.record()
    board.refresh()
    drawn = {v: img.value for v, img in board.plots.items()}
    assert all(drawn[v] != blank[v] for v in drawn)
    for view, img in board.plots.items():
        w, h = plots.SIZES[view]
        assert png_size(img.value) == (round(w * plots.DPI), round(h * plots.DPI))
    renders = board.plot_renders
    board.refresh()
    assert board.plot_renders == renders  # same rows: nothing redrawn
    run.snapshot["time_total_s"] = 5.0
    run.record()
    board.refresh()
    assert board.plot_renders == renders + len(board.plots)
    assert board.plots["throughput"].value != drawn["throughput"]


def test_stable_css_classes_for_the_browser_test():
    board = Dashboard(FakeRun(), poll_hz=0)
    classes = {c for w in walk(board.widget) for c in w._dom_classes}
    assert {"impala-dashboard", "impala-diagram", "impala-timing", "impala-gauge-learner-queue",
            "impala-gauge-batch-buffer", "impala-gauge-replay", "impala-gauge-in-flight",
            "impala-gauge-minibatch", "impala-plot-throughput", "impala-plot-return",
            "impala-plot-queues", "impala-plot-learner", "impala-plot-learner-losses",
            "impala-button-start", "impala-button-pause", "impala-button-stop",
            "impala-stat-sample-throughput", "impala-knob-lr"} <= classes



def test_the_poller_updates_widgets_from_its_thread_and_ends_with_the_run():
    run = FakeRun()
    board = Dashboard(run, poll_hz=5)
    board.start_polling()
    try:
        run.snapshot["num_steps_sampled"] = 99_999
        wait_for(lambda: "99,999" in board.cards["num_steps_sampled"].value,
                 "the poller's update of the card")
        assert board.polling and board.poll_errors == 0
        run.stop()
        wait_for(lambda: not board.polling, "the poller's end with the run")
        assert "impala-status-stopped" in board.header.value
    finally:
        board.stop_polling()


def test_the_poller_draws_plots_in_a_child_process_and_ends_it():
    run = FakeRun()
    for i in range(3):
        run.snapshot["time_total_s"] = float(i)
        run.record()
    board = Dashboard(run, poll_hz=5, plot_interval=0.2)
    blank = board.plots["throughput"].value
    board.start_polling()
    try:
        wait_for(lambda: board.plot_renders >= 3,
                 lambda: f"3 plots drawn (last poll error: {board.last_poll_error!r})")
        child = board._scheduler.child.process
        assert board.plot_process and child.is_alive() and child.pid != os.getpid()
        assert board.plots["throughput"].value != blank
        assert png_size(board.plots["throughput"].value) == (470, 230)
        run.stop()  # the poller ends, and the child with it
        wait_for(lambda: not board.polling, "the poller's end with the run")
        assert board._scheduler.child is None
        child.join(5)
        assert not child.is_alive(), (child.exitcode, board.last_poll_error)
    finally:
        board.close()


def test_without_the_plot_process_the_poller_draws_in_its_thread():
    run = FakeRun()
    run.record()
    board = Dashboard(run, poll_hz=5, plot_process=False)
    board.start_polling()
    try:
        wait_for(lambda: board.plot_renders >= 1,
                 lambda: f"a plot drawn (last poll error: {board.last_poll_error!r})")
        assert board._scheduler.child is None
    finally:
        board.close()


def test_the_dashboard_holds_the_run_weakly():
    run = FakeRun()
    board = Dashboard(run, poll_hz=0)
    del run
    gc.collect()
    assert board.impala is None
    assert board.tick() is False  # the poller would end
    assert "garbage-collected" in board.header.value
    with pytest.raises(RuntimeError, match="keep a reference to it"):
        board.refresh()


def test_show_without_a_frontend_prints_the_text_view(capsys):
    run = FakeRun()
    board = Dashboard(run)
    board.show()
    out = capsys.readouterr().out
    assert out.splitlines()[1] == ("throughput  sample 7,324/s   train 19,094/s   "
                                   "replayed 7,600 steps")
    assert "IMPALA · env" in out and "learner queue" not in out
    assert not board.polling


@pytest.mark.parametrize("kwargs, message", [
    ({"poll_hz": 20}, "poll_hz=20 is invalid: use 2-5 updates per second"),
    ({"plot_interval": 0}, "plot_interval=0 is invalid"),
    ({"plot_budget": 1.5}, "plot_budget=1.5 is invalid"),
])
def test_bad_arguments_name_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Dashboard(FakeRun(), **kwargs)


def test_a_non_run_is_refused():
    with pytest.raises(TypeError, match="Dashboard\\(impala\\) needs an Impala run; dict has"):
        Dashboard({})


# ---------------------------------------------------------------------- a real run
@pytest.fixture(scope="module")
def run():
    from impala_lab import Impala

    with Impala(backend="inline", num_workers=2, num_envs_per_worker=2, sample_batch_size=10,
                train_batch_size=40, seed=0) as impala:
        yield impala


def test_refresh_matches_a_live_runs_stats(run):
    run.train(max_env_steps=400, report_interval=0.05)
    board = Dashboard(run, poll_hz=0)
    s = board.refresh()
    p = s["pipeline"]
    assert " ".join(visible(board.cards["num_steps_sampled"].value)) == \
        f"env steps {s['num_steps_sampled']:,}"
    assert svg_texts(board.diagram.value, "impala-weights-version") == \
        [f"v{s['weights_version']}"]
    assert board.gauges["learner_queue"].value == pytest.approx(
        p["learner_queue_len"] / p["learner_queue_size"])
    assert board.gauges["batch_buffer"].value == pytest.approx(
        p["batch_buffer_steps"] / p["train_batch_size"])
    assert visible(board.gauge_labels["in_flight"].value) == [
        str(sum(p["in_flight"].values())), "/", str(p["num_workers"] * p["max_in_flight"])]
    assert {k: w.value for k, w in board.knobs.items()} == s["knobs"]
    assert board.plot_renders == len(board.plots)  # the history had rows: every plot drawn


def test_knobs_and_buttons_drive_a_live_run(run):
    board = Dashboard(run, poll_hz=0, start_kwargs={"max_seconds": 30})
    board.refresh()
    board.knobs["entropy_coeff"].value = 0.02
    board.start_button.click()
    assert run.is_training and "impala-status-training" in board.header.value
    wait_for(lambda: run.knob_changes, "the driver's applying the knob")
    board.pause_button.click()
    assert not run.is_training
    assert run.knob_changes[-1]["knob"] == "entropy_coeff"
    assert run.knob_changes[-1]["value"] == 0.02
    board.refresh()
    assert board.knobs["entropy_coeff"].value == 0.02
    assert "entropy_coeff = 0.02" in board.knob_log.value


def test_train_with_dashboard_prints_the_text_view_without_a_frontend(run, capsys):
    before = run.num_steps_sampled
    result = run.train(max_env_steps=before + 2000, report_interval=0.05, dashboard=True)
    out = capsys.readouterr().out.splitlines()
    assert result["stop_reason"] == "max_env_steps"
    assert out[0].startswith("IMPALA · CartPole-v1")  # show(): the text view
    assert len([line for line in out if " steps " in line and "queue" in line]) >= 1
    assert run._background is None and not run.is_training
    run.train(max_env_steps=run.num_steps_sampled + 40)  # the run is usable afterwards


def test_the_lag_histogram_draws_both_distributions_the_limits_and_the_drops():
    from impala_lab.dashboard.lag_histogram import lag_histogram_svg

    run = FakeRun()
    board = Dashboard(run, poll_hz=0)
    board.refresh()
    svg = board.lag_histogram.value
    assert svg == lag_histogram_svg(STATS, width=470)
    root = ET.fromstring(svg)
    bars = {r.get("class"): float(r.get("height"))
            for r in root.iter("{http://www.w3.org/2000/svg}rect") if r.get("class")}
    # fractions of each series, scaled so the tallest (20 of 27 at training) is 110 px high
    peak = 20 / 27
    expected = {"impala-lag-at-arrival-2": 30 / 43, "impala-lag-at-arrival-3": 12 / 43,
                "impala-lag-at-arrival-41": 1 / 43, "impala-lag-at-training-3": 20 / 27,
                "impala-lag-at-training-5": 7 / 27}
    assert bars == pytest.approx({k: 110 * v / peak for k, v in expected.items()}, abs=0.06)
    assert svg_texts(svg, "impala-lag-dropped") == ["dropped 500 env steps"]
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "extra_policy_lag 2" in texts and "max_policy_lag 40" in texts
    # an empty run draws the axes and no bars
    empty = ET.fromstring(lag_histogram_svg({}))
    assert not [r for r in empty.iter("{http://www.w3.org/2000/svg}rect") if r.get("class")]
