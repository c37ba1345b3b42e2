"""What the dashboard's tests share: a snapshot of hand-made stats and a fake run.

`FakeRun` has exactly the interface the dashboard uses on a run (stats, history,
knob_changes, start, pause, stop, set_knobs) and records the calls it gets, so the tests can
check the figures shown against `STATS` digit for digit.
"""

from __future__ import annotations

import copy
import re
import struct
import xml.etree.ElementTree as ET

from impala_lab.errors import ConfigError
from impala_lab.stats import StatsHistory, flatten

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


def walk(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from walk(child)


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
