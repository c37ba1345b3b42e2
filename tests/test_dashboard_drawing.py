"""The dashboard's drawings from a snapshot: card and badge markup, the label table, the
knob sliders, the pipeline diagram, the terminal view, the plots and the frame strip.

Every figure comes from the hand-made `STATS` of `tests.dashboard_fakes`, so each check
compares against exact text; the widgets that hold these drawings are in test_dashboard.py.
"""

from __future__ import annotations

import copy
import csv
import io
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from impala_lab.dashboard import controls, labels, live_plots, markup, plots, terminal
from impala_lab.dashboard.diagram import PipelineDiagram, pipeline_svg, timing_svg
from impala_lab.dashboard.format import fmt_float
from impala_lab.dashboard.widgets import Dashboard
from impala_lab.knobs import KNOBS, LIVE_KNOBS
from impala_lab.stats import StatsHistory
from tests.dashboard_fakes import STATS, FakeRun, history_rows, png_size, svg_texts, visible, walk
from tests.waiting import wait_for


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
    panel = next(w for w in walk(board.widget) if "impala-frame-strip" in w._dom_classes)
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
    panel = next(w for w in walk(plain.widget) if "impala-frame-strip" in w._dom_classes)
    assert panel.layout.display == "none"
