"""The dashboard without a frontend: widgets show what the stats say, controls reach the run,
the poller moves the widgets, figures and the text view are right.

A fake run (the dashboard's whole interface to a run: stats, history, knob_changes, start,
pause, stop, set_knobs) gives exact, hand-made figures; one real inline `Impala` checks the
same against live stats, the knobs, the buttons and ``train(dashboard=True)``.
"""

from __future__ import annotations

import copy
import csv
import gc
import io
import os
import re
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from impala_lab.dashboard import controls, labels, live_plots, markup, plots, terminal
from impala_lab.dashboard.diagram import PipelineDiagram, pipeline_svg, timing_svg
from impala_lab.dashboard.format import fmt_float
from impala_lab.dashboard.widgets import Dashboard, frontend_available
from impala_lab.errors import ConfigError
from impala_lab.knobs import KNOBS, LIVE_KNOBS
from impala_lab.stats import StatsHistory, flatten
from tests.waiting import wait_for

STATS = {
    "sample_throughput": 7323.68, "train_throughput": 19093.798,
    "num_steps_sampled": 22400, "num_steps_trained": 58400, "num_weight_syncs": 61,
    "num_broadcasts": 25, "num_steps_replayed": 7600, "num_worker_failures": 0,
    "time_total_s": 30.5,
    "timing_breakdown": {"optimizer_step_time_ms": 248.568, "learner_grad_time_ms": 6.714,
                         "learner_load_time_ms": 0.0, "learner_load_wait_time_ms": 0.0,
                         "learner_dequeue_time_ms": 5.041, "batch_concat_time_ms": 0.5,
                         "broadcast_time_ms": 2.125},
    "learner_queue": {"mean": 1.7, "std": 2.2, "min": 0.0, "max": 8.0, "count": 50},
    "learner": {"total_loss": 49665.2, "policy_loss": 6266.47, "vf_loss": 86808.1,
                "entropy": 0.665, "grad_gnorm": 19137.3, "var_gnorm": 12.07,
                "mean_rho": 0.9998, "vf_explained_var": 0.0075, "policy_version": 74},
    "episode_return_mean": 33.93, "episode_len_mean": 33.93, "episode_return_count": 100,
    "episodes_total": 916, "policy_lag": {"mean": 4.42, "max": 18},
    "policy_lag_at_training": {"mean": 9.1, "max": 30}, "weights_version": 74,
    "pipeline": {"backend": "inline", "num_workers": 3, "in_flight": {"0": 2, "1": 1, "2": 0},
                 "max_in_flight": 2, "replay_stored": 14, "replay_capacity": 20,
                 "batch_buffer_steps": 400, "train_batch_size": 500, "learner_queue_len": 5,
                 "learner_queue_size": 16, "minibatch_slots": [[True, 2], [False, 0]],
                 "num_sgd_iter": 2, "broadcast_interval": 1, "num_train_batches": 37},
    "knobs": {"broadcast_interval": 3, "replay_proportion": 0.5, "num_sgd_iter": 2,
              "lr": 0.0005, "entropy_coeff": 0.01, "extra_policy_lag": 2, "max_policy_lag": 40},
    "num_samples_dropped_for_lag": 500,
    "policy_lag_distribution": {"at_arrival": {"2": 30, "3": 12, "41": 1},
                                "at_training": {"3": 20, "5": 7}},
}


class FakeRun:
    """Exactly the interface the dashboard uses; records the calls it gets."""

    def __init__(self, stats: dict | None = None) -> None:
        self.snapshot = copy.deepcopy(stats or STATS)
        self.history = StatsHistory(maxlen=1000)
        self.knob_changes: list[dict] = []
        self.calls: list[tuple] = []
        self.is_training = False
        self.stopped = False
        self.background_error: BaseException | None = None

    def stats(self) -> dict:
        return copy.deepcopy(self.snapshot)

    def record(self) -> None:
        self.history.append(flatten({k: v for k, v in self.snapshot.items()
                                     if k != "pipeline"}))

    def start(self, **kwargs) -> None:
        self.calls.append(("start", kwargs))
        self.is_training = True

    def pause(self) -> None:
        self.calls.append(("pause",))
        self.is_training = False

    def stop(self) -> None:
        self.calls.append(("stop",))
        self.is_training, self.stopped = False, True

    def set_knobs(self, **knobs) -> None:
        for name, value in knobs.items():
            if name == "replay_proportion" and value > 0 and \
                    self.snapshot["pipeline"]["replay_capacity"] == 0:
                raise ConfigError("replay_buffer_num_slots=0 is invalid: with "
                                  f"replay_proportion={value} the replay buffer needs slots")
        self.calls.append(("set_knobs", knobs))


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def svg_texts(svg: str, cls: str) -> list[str]:
    root = ET.fromstring(svg)
    return [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")
            if cls in (t.get("class") or "").split()]


def visible(html: str) -> str:
    return re.sub(r"<[^>]+>", " ", html).split()


# ---------------------------------------------------------------------- markup, labels, controls
def test_markup_writes_the_figures_of_a_snapshot():
    assert visible(markup.card_html("sample_throughput", STATS)) == ["sampled", "7,324/s"]
    assert visible(markup.card_html("policy_lag", STATS)) == ["policy", "lag", "4.4"]
    assert visible(markup.card_html("time_total_s", STATS)) == ["time", "30", "s"]
    header = markup.header_html("IMPALA · CartPole-v1", STATS, "training")
    assert " ".join(visible(header)) == \
        "IMPALA · CartPole-v1 · inline backend · 3 workers ● training"
    assert 'class="impala-status impala-status-training"' in header
    assert markup.gauges(STATS) == {
        "in_flight": (0.5, "#1f77b4", '<span style="font-size:15px">3 / 6</span>'),
        "replay": (0.7, "#1f77b4", '<span style="font-size:15px">14 / 20</span>'),
        "batch_buffer": (0.8, "#1f77b4", '<span style="font-size:15px">400 / 500</span>'),
        "learner_queue": (5 / 16, "#2e9e44", '<span style="font-size:15px">5 / 16</span>'),
        "minibatch": (0.5, "#1f77b4", '<span style="font-size:15px">1 / 2</span>')}
    assert markup.gauge_text("replay", 0, 0) == '<span style="font-size:15px">off</span>'
    assert [markup.gauge_color("learner_queue", f) for f in (0.5, 0.8, 1.0)] == \
        ["#2e9e44", "#e67e22", "#c0392b"]
    assert "balanced" in markup.bottleneck_html(STATS)
    assert "no learner step yet" in markup.bottleneck_html({})
    log = markup.knob_log_html([{"time_s": 1.0 * i, "num_steps_sampled": 1000 * i,
                                 "knob": "lr", "value": 0.001 * i} for i in range(1, 8)])
    assert " ".join(visible(log)) == (
        "knob changes (newest first) 7.0 s, step 7,000: lr = 0.007 6.0 s, step 6,000: "
        "lr = 0.006 5.0 s, step 5,000: lr = 0.005 4.0 s, step 4,000: lr = 0.004 "
        "3.0 s, step 3,000: lr = 0.003")
    assert markup.knob_log_html([]) == ""


def test_markup_messages_escape_text_and_say_the_first_that_applies():
    error = markup.message_html(error=RuntimeError("a <b> c"), blocking_train=True)
    assert "background training failed: RuntimeError: a &lt;b&gt; c" in error
    assert "train() holds this cell" in markup.message_html(blocking_train=True,
                                                            replay_off=True)
    assert "replay_buffer_num_slots=0" in markup.message_html(replay_off=True)
    note = markup.message_html(replay_off=True, note="lr = 0.001: applied now")
    assert "lr = 0.001: applied now" in note and "#333" in note
    assert markup.RED in markup.message_html(note="lr: bad", note_error=True)


def test_markup_health_badges():
    assert markup.health_html(None) == ""
    warning = markup.health_html({"flags": [{"code": "entropy_collapsed",
                                             "message": "entropy <0.07"}]})
    assert 'class="impala-health-flag impala-health-entropy-collapsed"' in warning
    assert "⚠ entropy collapsed" in warning and "entropy &lt;0.07" in warning
    assert "✓ learning health: ok" in markup.health_html({"flags": [], "seen": {}})


def test_one_label_table_names_the_timers_everywhere():
    text = terminal.render(STATS)
    svg = timing_svg(STATS)
    bars = [t.get_text() for t in
            plots.view_figure("timing", history_rows(2)).axes[0].get_yticklabels()]
    assert set(labels.TIMERS) == set(STATS["timing_breakdown"])
    for label in labels.TIMERS.values():
        assert f"{label.short} " in text.splitlines()[4]
        assert f">{label.name}</text>" in svg
        assert label.name in bars and label.unit == "ms" and label.help
    for key, label in labels.LEARNER.items():
        assert f"{label.short} " in text.splitlines()[5], key
    assert set(labels.LEARNER) <= set(STATS["learner"])
    # every label's top-level key is explained in the metrics table of docs/training.md
    page = (Path(__file__).parents[1] / "docs" / "training.md").read_text()
    table = page[page.index("## Logged metrics explained"):]
    table = table[:table.index("\n## ", 10)]
    for key in labels.LABELS:
        assert f"`{key.split('.')[0]}`" in table, key


def test_knob_sliders_follow_the_knob_table():
    sliders = controls.KnobSliders(lambda name, value: None).sliders
    assert list(sliders) == list(LIVE_KNOBS)
    for name, w in sliders.items():
        knob = KNOBS[name]
        kind = ("IntSlider" if knob.kind == "int" else
                "FloatLogSlider" if knob.log else "FloatSlider")
        assert type(w).__name__ == kind, name
        assert w.tooltip == knob.help and f"impala-knob-{name.replace('_', '-')}" in \
            w._dom_classes
        if knob.log:
            assert (w.base, w.min, w.max) == (10, np.log10(knob.low), np.log10(knob.high))
        else:
            assert (w.min, w.max, w.step) == (knob.low, knob.high, knob.step)
        if knob.readout:
            assert w.readout_format == knob.readout
    assert (sliders["lr"].min, sliders["lr"].max, sliders["lr"].value) == (-5, -1, 0.0005)


def test_knob_sliders_report_moves_cast_and_never_echo_the_run():
    moves = []
    knob_sliders = controls.KnobSliders(lambda name, value: moves.append((name, value)))
    knob_sliders.follow({"lr": 0.2, "broadcast_interval": 40})  # beyond the slider ranges
    assert knob_sliders.sliders["lr"].max == 0 and knob_sliders.sliders["lr"].value == 0.2
    assert knob_sliders.sliders["broadcast_interval"].max == 40
    assert moves == []
    knob_sliders.sliders["entropy_coeff"].value = 0.0200000001
    knob_sliders.sliders["lr"].value = 0.2  # the run's value already
    assert moves == [("entropy_coeff", 0.02)]


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
    classes = {c for w in _walk(board.widget) for c in w._dom_classes}
    assert {"impala-dashboard", "impala-diagram", "impala-timing", "impala-gauge-learner-queue",
            "impala-gauge-batch-buffer", "impala-gauge-replay", "impala-gauge-in-flight",
            "impala-gauge-minibatch", "impala-plot-throughput", "impala-plot-return",
            "impala-plot-queues", "impala-plot-learner", "impala-plot-learner-losses",
            "impala-button-start", "impala-button-pause", "impala-button-stop",
            "impala-stat-sample-throughput", "impala-knob-lr"} <= classes


def _walk(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from _walk(child)


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


# ---------------------------------------------------------------------- diagram, terminal
def test_diagram_arrows_move_only_where_data_flowed():
    diagram = PipelineDiagram()
    first = ET.fromstring(diagram.render(STATS))
    assert not [e for e in first.iter() if "impala-edge-flowing" in (e.get("class") or "")]
    later = copy.deepcopy(STATS)
    later["num_steps_sampled"] += 800
    later["num_broadcasts"] += 1
    root = ET.fromstring(diagram.render(later))
    flowing = sorted(e.get("class").split()[1] for e in root.iter()
                     if "impala-edge-flowing" in (e.get("class") or ""))
    # sampled steps cross actors -> pool -> replay -> buffer; no batch reached the learner
    assert flowing == ["impala-edge-broadcast", "impala-edge-mix", "impala-edge-sample",
                       "impala-edge-sample"]
    assert diagram.phase == {"sample": 1, "mix": 1, "batch": 0, "train": 0, "broadcast": 1}


def test_diagram_draws_many_workers_and_large_queues_compactly():
    stats = copy.deepcopy(STATS)
    stats["pipeline"].update(num_workers=12, in_flight={str(i): 1 for i in range(12)},
                             learner_queue_size=64, learner_queue_len=32,
                             minibatch_slots=[[True, 1]] * 10)
    svg = pipeline_svg(stats)
    root = ET.fromstring(svg)
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "+8 more workers" in texts and "10 / 10" in texts
    assert svg_texts(svg, "impala-learner-queue") == ["32 / 64"]
    assert 'class="impala-learner-queue-bar"' in svg


# Snapshots that reach every branch of the drawing: stalled and idle workers, moving and
# still arrows, replay on and off, queue cells and a queue bar, ring cells and a count.
SVG_CASES = {
    "pipeline_small.svg": (
        {**STATS, "workers": [{"index": 1, "stalled": True, "seconds_since_sample": 21.4}]},
        {"sample": True, "mix": True, "batch": False, "train": True, "broadcast": True},
        {"sample": 3, "mix": 1, "batch": 0, "train": 7, "broadcast": 2}),
    "pipeline_large.svg": (
        {**STATS, "pipeline": {**STATS["pipeline"], "num_workers": 12, "max_in_flight": 8,
                               "in_flight": {str(i): i % 3 for i in range(12)},
                               "replay_capacity": 0, "replay_stored": 0,
                               "learner_queue_size": 64, "learner_queue_len": 32,
                               "minibatch_slots": [[i % 2 == 0, 1] for i in range(10)]}},
        None, None),
}


@pytest.mark.parametrize("name", sorted(SVG_CASES))
def test_the_pipeline_svg_is_the_recorded_drawing(name):
    # The recorded files are the drawing as it was built; if you change the drawing on
    # purpose, write pipeline_svg(*SVG_CASES[name]) to tests/data/<name> and look at it.
    stats, flowing, phase = SVG_CASES[name]
    recorded = (Path(__file__).parent / "data" / name).read_text()
    assert pipeline_svg(stats, flowing=flowing, phase=phase) == recorded


def test_timing_svg_scales_to_the_largest_timer():
    svg = timing_svg(STATS)
    root = ET.fromstring(svg)
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "scale 0-300 ms" in texts  # 248.6 * 1.15 rounded up to a nice number
    assert svg_texts(svg, "impala-timer-batch-concat-time-ms") == ["0.500"]


def test_terminal_views():
    assert terminal.progress_line(STATS) == (
        "   30.5s  steps    22,400  return    33.9  sample    7,324/s  train   19,094/s"
        "  queue  5/16  lag 4.4")
    text = terminal.render(STATS, "CartPole-v1 (inline, 3 workers)")
    lines = text.splitlines()
    assert len(lines) == 7 and max(map(len, lines)) <= 100
    assert lines[3] == ("pipeline    in flight [2 1 0] > replay 14/20 > buffer 400/500 > queue "
                        "[##······] 5/16 > ring [2 ·]")
    assert lines[5] == ("learner     loss 49,665  pi 6,266  vf 86,808  ent 0.665  "
                        "gnorm 19,137  rho 1.000  expl.var 0.00750")
    out = io.StringIO()
    view = terminal.TerminalView(out, title="t", live=True)
    view.update(STATS)
    view.update(STATS)
    assert out.getvalue().count("\x1b[7F") == 1  # the second panel overwrites the first
    plain = io.StringIO()
    terminal.TerminalView(plain, live=False).update(STATS)
    assert plain.getvalue() == terminal.progress_line(STATS) + "\n"


@pytest.mark.parametrize("value, text", [(33.93, "33.9"), (6266.47, "6,266"), (0.665, "0.665"),
                                         (0.0075, "0.00750"), (1.2e-4, "1.20e-04"),
                                         (2.5e7, "2.50e+07"), (0, "0"), (float("nan"), "–"),
                                         (None, "–")])
def test_fmt_float(value, text):
    assert fmt_float(value) == text


# ---------------------------------------------------------------------- plots
def history_rows(n: int, knob_change_at: int | None = None) -> list[dict]:
    rows = []
    for i in range(n):
        row = flatten({k: v for k, v in STATS.items() if k != "pipeline"})
        row["time_total_s"] = float(i)
        row["sample_throughput"] = 1000.0 + 10 * i
        if knob_change_at is not None and i >= knob_change_at:
            row["knobs.lr"] = 0.001
            row["knobs.num_sgd_iter"] = 3
        rows.append(row)
    return rows


def test_knob_marks_find_changes_in_the_metrics():
    cols = plots.columns(history_rows(10, knob_change_at=4), plots.KNOB_KEYS)
    assert plots.knob_marks(cols) == [(4.0, "num_sgd_iter=3, lr=0.001")]


def test_columns_decimate_long_runs_and_keep_the_last_row():
    rows = history_rows(1500)
    cols = plots.columns(rows, ["sample_throughput"], max_points=600)
    assert len(cols["time_total_s"]) == 600
    assert cols["time_total_s"][0] == 0.0 and cols["time_total_s"][-1] == 1499.0
    history = StatsHistory(maxlen=2000)
    for row in rows:
        history.append(row)
    same = plots.columns(history, ["sample_throughput"], max_points=600)
    np.testing.assert_array_equal(same["sample_throughput"], cols["sample_throughput"])


def test_live_figure_blits_until_the_limits_must_change():
    live = live_plots.LiveFigure("throughput")
    rows = history_rows(5)
    first = live.render(rows)
    assert (live.renders, live.full_draws) == (1, 1)
    rows.append({**rows[-1], "time_total_s": 5.0, "sample_throughput": 1100.0})
    second = live.render(rows)
    assert (live.renders, live.full_draws) == (2, 1)  # inside the limits: lines only
    assert second != first
    rows.append({**rows[-1], "time_total_s": 500.0})
    live.render(rows)
    assert live.full_draws == 2  # beyond the x limit: axes redrawn
    assert live.panels[0].ax.get_xlim()[1] >= 500.0


def test_report_from_a_metrics_csv(tmp_path):
    rows = history_rows(30, knob_change_at=12)
    path = tmp_path / "metrics.csv"
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    read = plots.read_metrics_csv(path)
    assert read[12]["knobs.lr"] == 0.001 and read[0]["sample_throughput"] == 1000.0
    out = plots.save_report(read, tmp_path / "report.png", title="test")
    assert png_size(out.read_bytes()) == (1160, 840)
    fig = plots.report_figure(read, title="test")
    assert png_size(fig._repr_png_())[0] > 0
    labels = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "num_sgd_iter=3, lr=0.001" in labels
    assert png_size(plots.view_figure("timing", read)._repr_png_()) == (470, 230)
    with pytest.raises(ValueError, match="view='nope' is unknown"):
        plots.view_figure("nope", read)


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


# ---------------------------------------------------------------------- the frame strip
class FramesRun(FakeRun):
    """A fake run with an observation space and frames to show."""

    def __init__(self, space, frames=None) -> None:
        super().__init__()
        self.observation_space = space
        self.frames = frames

    def latest_frames(self):
        return self.frames


def _minatar_frames(version: int, seed: int):
    from impala_lab.envs.frames import Frames

    obs = (np.random.default_rng(seed).random((3, 10, 10, 4)) < 0.3).astype(np.uint8)
    return Frames(obs=obs, env_steps=np.array([1200, 1200, 1234]),
                  ends=np.array([False, True, False]), worker_index=0, column=0,
                  kind="channels", version=version)


def _png_pixels(data: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_the_frame_strip_shows_new_frames_and_encodes_only_when_they_change():
    import gymnasium as gym

    from impala_lab.envs.frames import strip_rgb

    run = FramesRun(gym.spaces.Box(0, 1, (10, 10, 4), bool))
    board = Dashboard(run, poll_hz=5, plot_process=False)
    board.refresh(plots=False)
    panel = next(w for w in _walk(board.widget) if "impala-frame-strip" in w._dom_classes)
    assert panel.layout.display is None and board.frame_strip.layout.display == "none"
    assert " ".join(visible(board.frame_caption.value)) == (
        "frames appear when the first batch of the lowest-numbered worker arrives")

    run.frames = _minatar_frames(1, seed=0)
    board.refresh(plots=False)
    np.testing.assert_array_equal(_png_pixels(board.frame_strip.value),
                                  strip_rgb(run.frames))
    assert board.frame_strip.layout.display is None
    assert " ".join(visible(board.frame_caption.value)) == (
        "frames : worker 0, env 0, its last 3 steps (newest at 1,234 env steps); "
        "red gap: a new episode")
    shown = board.frame_strip.value
    board.refresh(plots=False)  # the same frames: no new PNG
    assert board._frame_view.encodes == 1 and board.frame_strip.value is shown

    board.start_polling()  # the poller shows newer frames at its cadence
    try:
        run.frames = _minatar_frames(2, seed=1)
        wait_for(lambda: board._frame_view.encodes >= 2,
                 lambda: f"a new strip (last poll error: {board.last_poll_error!r})")
        np.testing.assert_array_equal(_png_pixels(board.frame_strip.value),
                                      strip_rgb(run.frames))
    finally:
        board.close()


def test_the_frame_strip_says_in_one_line_when_observations_are_not_images():
    import gymnasium as gym

    from impala_lab.envs.frames import not_image_reason

    space = gym.spaces.Box(-1, 1, (4,), np.float32)
    run = FramesRun(space)
    board = Dashboard(run, poll_hz=0)
    board.refresh(plots=False)
    assert board.frame_caption.value.count("<span") == 1
    assert " ".join(visible(board.frame_caption.value)) == " ".join(
        not_image_reason(space).split())
    assert board.frame_strip.layout.display == "none" and board._frame_view.encodes == 0
    # a run without an observation space (this fake): no panel at all
    fake = FakeRun()
    plain = Dashboard(fake, poll_hz=0)
    plain.refresh(plots=False)
    assert plain.frame_strip.layout.display == "none" and plain.frame_caption.value == ""
    panel = next(w for w in _walk(plain.widget) if "impala-frame-strip" in w._dom_classes)
    assert panel.layout.display == "none"
