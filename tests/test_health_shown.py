"""Where learning health is shown: the CLI's progress line and panel, the dashboard's badges,
and a live run's stats and metrics rows; and the monitor lets a dropped run go."""

from __future__ import annotations

import copy
import gc
import io
import json
import weakref

from impala_lab.dashboard import terminal
from tests.configs import SMALL

# ---------------------------------------------------------------------- where it is shown
WARNING = {"status": "warning", "num_updates_skipped": 0,
           "flags": [{"code": "entropy_collapsed", "since_s": 41.0,
                      "message": "entropy collapsed: the policy's mean entropy ... (fix)"},
                     {"code": "value_loss_spike", "since_s": 40.0,
                      "message": "value-loss spike: a spike <3.2M> & more"}],
           "seen": {"value_loss_spike": {"first_s": 40.0, "last_s": 40.0, "times": 1,
                                         "message": "..."},
                    "entropy_collapsed": {"first_s": 41.0, "last_s": 41.0, "times": 1,
                                          "message": "..."}}}
OK_AFTER = {"status": "ok", "flags": [], "num_updates_skipped": 0,
            "seen": {"learner_starved": {"first_s": 3.0, "last_s": 5.0, "times": 1,
                                         "message": "..."}}}


def test_the_progress_line_and_the_panel_show_active_flags():
    from tests.dashboard_fakes import STATS

    plain = terminal.progress_line(STATS)
    ok = terminal.progress_line({**STATS, "health": OK_AFTER})
    assert ok == plain  # nothing to say
    line = terminal.progress_line({**STATS, "health": WARNING})
    assert line == plain + "  health: entropy collapsed, value-loss spike"
    lines = terminal.render({**STATS, "health": WARNING}).splitlines()
    assert len(lines) == 8 and lines[-1] == (
        "health      WARNING: entropy collapsed, value-loss spike")
    assert terminal.render({**STATS, "health": OK_AFTER}).splitlines()[-1] == "health      ok"
    out = io.StringIO()
    terminal.TerminalView(out, live=False).update({**STATS, "health": WARNING})
    assert out.getvalue() == line + "\n"


def test_the_dashboard_shows_a_warning_badge_per_flag_with_its_sentence():
    from impala_lab.dashboard.widgets import Dashboard
    from tests.dashboard_fakes import STATS, FakeRun, visible

    run = FakeRun({**copy.deepcopy(STATS), "health": WARNING})
    board = Dashboard(run, poll_hz=0)
    board.refresh()
    html = board.health.value
    assert "impala-health" in board.health._dom_classes
    assert html.count('class="impala-health-badge"') == 2
    assert "impala-health-entropy-collapsed" in html and "impala-health-value-loss-spike" in html
    text = " ".join(visible(html))
    assert "⚠ entropy collapsed entropy collapsed: the policy's mean entropy ... (fix)" in text
    assert "value-loss spike: a spike &lt;3.2M&gt; &amp; more" in html  # escaped
    run.snapshot["health"] = OK_AFTER
    board.refresh()
    assert " ".join(visible(board.health.value)) == (
        "✓ learning health: ok (earlier: learner starved at 3 s)")
    del run.snapshot["health"]  # a snapshot without the key (an older run): no badge
    board.refresh()
    assert board.health.value == ""


# ---------------------------------------------------------------------- a live run
def test_a_short_inline_run_has_health_in_its_stats_and_metrics_rows():
    from impala_lab import Impala, ImpalaConfig

    cfg = ImpalaConfig.tuned("CartPole-v1", backend="inline", num_workers=1, seed=0)
    with Impala(cfg) as run:
        result = run.train(lambda s: s["weights_version"] >= 10, max_seconds=120,
                           report_interval=0.2)
        assert result["stop_reason"] == "stop condition"
        h = result["health"]
        assert h["status"] in ("ok", "warning")
        assert set(h) == {"status", "flags", "seen", "num_updates_skipped"}
        assert h["status"] == ("warning" if h["flags"] else "ok")
        assert h["num_updates_skipped"] == 0
        json.dumps(h, allow_nan=False)
        run.stop()
        # The learner thread fed the monitor every one of its steps.
        assert run.health.num_learner_steps == run.learner.num_steps >= 10
        rows = run.history.rows()
    assert rows and all(r["health.status"] in ("ok", "warning") for r in rows)
    assert all(isinstance(r["health.flags"], str) for r in rows)
    assert not any(k.startswith("health.") and k not in ("health.status", "health.flags")
                   for r in rows for k in r)


def test_the_monitor_does_not_keep_a_dropped_run_alive():
    from impala_lab import Impala, ImpalaConfig

    run = Impala(ImpalaConfig(**SMALL), start_learner=False)
    assert run.learner.on_train_step == run.health.observe_learner_step
    ref = weakref.ref(run)
    run.stop()
    del run
    gc.collect()
    assert ref() is None
