"""`HealthMonitor`: says when learning looks wrong, in words and figures.

Each figure the run measures is held against a threshold (the constants below); what crosses
one is named by a flag (docs/training.md, "Learning health", says when each is raised and
clears, and what ``stats()["health"]`` holds). A loss or gradient spike counts only while the
mean return has stayed low for `SPIKE_CONFIRM_S` (near the top one failed episode spikes a
healthy value loss harmlessly); a pipeline flag must hold for `PIPELINE_PERSIST_S` (on a shared
machine a healthy learner may wait a report or two).
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# The flags' words live in the shared vocabulary (the views read them).
from impala_lab.health_flags import LABELS as LABELS
from impala_lab.health_flags import describe_seen as describe_seen
from impala_lab.health_flags import flag_codes as flag_codes
from impala_lab.health_flags import flag_labels as flag_labels

#: Entropy collapsed: below this fraction of log(num_actions) (CartPole: 0.069 nats) ...
ENTROPY_COLLAPSE_FRACTION = 0.1
#: ... as the mean of this many learner steps (one step's entropy is noisy).
ENTROPY_WINDOW = 20
#: The return is "low" below the mark this fraction of the way back from the best trailing
#: mean so far to the first (a fraction of the best alone made every negative return low).
LOW_RETURN_FRACTION = 0.5
#: Episodes a trailing mean needs before it counts (for the best, and for "low").
RETURN_MIN_EPISODES = 20
#: A spike: one step's vf_loss or grad_gnorm this many times the median of the previous
#: `SPIKE_WINDOW` steps (healthy runs reach it too: hence the return test).
SPIKE_RATIO = 20.0
#: Seconds the return must have stayed low for a spike to raise its flag.
SPIKE_CONFIRM_S = 10.0
SPIKE_WINDOW = 100
#: Steps of history before spikes are looked for (the first steps move a lot).
SPIKE_MIN_STEPS = 20
MEDIAN_REFRESH_STEPS = 10
#: Seconds a spike flag stays up after the latest spike.
SPIKE_HOLD_S = 30.0
#: Learner steps in the learner_queue window before starved/overfed are judged.
PIPELINE_MIN_STEPS = 20
PIPELINE_PERSIST_S = 10.0
#: Starved: mean queue length at most this fraction of learner_queue_size, and the learner
#: waiting for data at least `STARVED_WAIT_FRACTION` of its time. Overfed: the queue at least
#: `OVERFED_QUEUE_FRACTION` full, the driver blocked on it `OVERFED_BLOCKED_FRACTION` of the time.
STARVED_QUEUE_FRACTION = 0.1
STARVED_WAIT_FRACTION = 0.8
OVERFED_QUEUE_FRACTION = 0.9
OVERFED_BLOCKED_FRACTION = 0.5
#: Seconds of training without a sample reaching the driver: ``no_samples``.
NO_SAMPLES_S = 10.0
#: A worker is stalled once its last sample is this fraction of ``sample_timeout_s`` ago, or
#: `WORKER_STALLED_S` with ``sample_timeout_s=None``: a warning before the driver ends it.
WORKER_STALLED_FRACTION = 0.25
WORKER_STALLED_S = 15.0

#: The spike flags and the learner stat each watches.
SPIKE_STATS = {"value_loss_spike": "vf_loss", "grad_norm_spike": "grad_gnorm"}
SPIKE_CODES = tuple(SPIKE_STATS)
PIPELINE_CODES = ("learner_starved", "learner_overfed")


def stalled_after_s(sample_timeout_s: float | None) -> float:
    """Seconds without a sample after which a worker is marked stalled."""
    return (WORKER_STALLED_S if sample_timeout_s is None
            else WORKER_STALLED_FRACTION * sample_timeout_s)


def _num(x: float) -> str:
    """A figure for a sentence: 3 significant digits, thousands separated, big ones as 1.2e+06."""
    if not math.isfinite(x):
        return str(x)
    if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
        return f"{x:.2e}"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}"


class _Series:
    """The recent values of one learner stat, its cached median and the spikes seen in it."""

    def __init__(self) -> None:
        self.values: deque[float] = deque(maxlen=SPIKE_WINDOW)
        self.median = math.nan
        self.until_refresh = 0
        # (t, value, median, number) of every spike, whether or not it raised the flag
        self.spikes: deque[tuple[float, float, float, int]] = deque(maxlen=100)
        self.num_spikes = 0
        self.num_noted = 0  # spikes 1..num_noted are in the monitor's `seen`

    def recent(self, now: float) -> list[tuple[float, float, float, int]]:
        """The spikes of the last `SPIKE_HOLD_S` seconds, oldest first."""
        return [spike for spike in self.spikes if now - spike[0] <= SPIKE_HOLD_S]

    def push(self, value: float, now: float) -> None:
        """Add one step's value, noting a spike against the previous steps."""
        if not math.isfinite(value):
            return
        if (len(self.values) >= SPIKE_MIN_STEPS and self.median > 0
                and value >= SPIKE_RATIO * self.median):
            self.num_spikes += 1
            self.spikes.append((now, value, self.median, self.num_spikes))
        self.values.append(value)
        self.until_refresh -= 1
        if self.until_refresh <= 0 or len(self.values) <= SPIKE_MIN_STEPS:
            self.median = statistics.median(self.values)
            self.until_refresh = MEDIAN_REFRESH_STEPS


class HealthMonitor:
    """Watches one run's learning and pipeline figures; `check` names what looks wrong.

    Args:
      num_actions: size of the discrete action space (the entropy's maximum is its log).
      learner_queue_size: capacity of the learner queue.
      clock: the run's elapsed seconds (``Impala.elapsed_s``); flag times are on it.
    """

    def __init__(self, num_actions: int, learner_queue_size: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entropy = math.log(num_actions) if num_actions > 1 else 0.0
        self.learner_queue_size = learner_queue_size
        self._clock = clock
        self._lock = threading.Lock()
        self._series = {code: _Series() for code in SPIKE_CODES}
        self._entropy: deque[float] = deque(maxlen=ENTROPY_WINDOW)
        self.num_learner_steps = 0
        self.best_return_mean = -math.inf
        self.first_return_mean = math.nan  # the first trailing mean that counts
        self.low_return_mark = math.nan  # below it the run does badly (LOW_RETURN_FRACTION)
        self._low_since = math.nan  # when the mean return last went low (nan: it is not)
        self._active: dict[str, float] = {}  # code -> since_s
        self._pipeline_since: dict[str, float] = {}  # code -> when its condition began
        self.seen: dict[str, dict[str, Any]] = {}
        self._num_skipped = 0
        self._last_skip_s = math.nan

    def observe_learner_step(self, stats: Mapping[str, float]) -> None:
        """Take one learner step's stats (``learn_on_batch``'s dict); cheap, any thread."""
        with self._lock:
            now = self._clock()
            self.num_learner_steps += 1
            entropy = stats.get("entropy")
            if entropy is not None and math.isfinite(entropy):
                self._entropy.append(float(entropy))
            for code, series in self._series.items():
                value = stats.get(SPIKE_STATS[code])
                if value is not None:  # a spike is judged with the return, in `check`
                    series.push(float(value), now)

    def check(self, *, episode_return_mean: float = math.nan, episode_return_count: int = 0,
              learner_queue: Mapping[str, float] | None = None,
              learner_wait_ms: float = 0.0, learner_grad_ms: float = 0.0,
              driver_blocked_fraction: float = 0.0, policy_lag: float = math.nan,
              num_updates_skipped: int = 0, seconds_since_sample: float = math.nan,
              stalled_workers: Sequence[Mapping[str, Any]] = (),
              sample_timeout_s: float | None = 60.0) -> dict[str, Any]:
        """Judge the run now; returns the ``health`` dict (see the module docs).

        The arguments are ``stats()`` figures: the trailing mean return and its episode count,
        ``learner_queue`` (the queue length after each step), the mean ms per learner step
        waiting for data and training, the recent share of time the driver waited on the full
        queue, the mean policy lag, non-finite updates skipped so far, seconds since a sample
        reached the driver (NaN: not judged), the workers marked stalled and the run's
        ``sample_timeout_s``.
        """
        with self._lock:
            now = self._clock()
            flags: dict[str, str] = {}
            low = self._low_return(episode_return_mean, episode_return_count, now)
            self._check_entropy(flags, episode_return_mean, low)
            self._check_spikes(flags, now, low)
            self._check_skipped(flags, num_updates_skipped, now)
            self._check_pipeline(flags, learner_queue or {}, learner_wait_ms, learner_grad_ms,
                                 driver_blocked_fraction, policy_lag)
            self._hold_back_pipeline(flags, now)
            self._check_sampling(flags, seconds_since_sample, stalled_workers, sample_timeout_s)
            out = self._raise_flags(flags, now)
            return {"status": "warning" if out else "ok", "flags": out,
                    "seen": {code: dict(entry) for code, entry in self.seen.items()},
                    "num_updates_skipped": self._num_skipped}

    def _raise_flags(self, flags: dict[str, str], now: float) -> list[dict[str, Any]]:
        """The health dict's ``flags``: the gone ones cleared, the new ones noted in ``seen``."""
        self._active = {code: since for code, since in self._active.items() if code in flags}
        out = []
        for code, message in flags.items():
            new = code not in self._active
            if new:
                self._active[code] = self._since(code, now)
            since = self._active[code]
            if code not in SPIKE_CODES:  # spikes are noted by the learner thread
                self._note(code, since, now, message, new)
            out.append({"code": code, "message": message, "since_s": round(since, 2)})
        return out

    def _check_skipped(self, flags: dict[str, str], num_updates_skipped: int, now: float) -> None:
        if num_updates_skipped > self._num_skipped:
            self._num_skipped = int(num_updates_skipped)
            self._last_skip_s = now
        if self._num_skipped:
            flags["updates_skipped"] = (
                f"non-finite updates skipped: {self._num_skipped} update(s) since the "
                f"start had a NaN or infinite loss or gradient norm (the latest noticed at "
                f"{self._last_skip_s:.1f} s); check the env's rewards and observations, "
                f"or lower lr or grad_clip")

    def _low_return(self, ret: float, count: int, now: float) -> bool | None:
        """Whether the mean return is below `low_return_mark` (updating the first and best
        means and when it went low); None while too few episodes ended."""
        if not (count >= RETURN_MIN_EPISODES and math.isfinite(ret)):
            return None
        if math.isnan(self.first_return_mean):
            self.first_return_mean = float(ret)
        best = self.best_return_mean = max(self.best_return_mean, float(ret))
        self.low_return_mark = best - LOW_RETURN_FRACTION * (best - self.first_return_mean)
        low = bool(ret < self.low_return_mark)
        if not low:
            self._low_since = math.nan
        elif math.isnan(self._low_since):
            self._low_since = now
        return low

    def _low_words(self) -> str:
        return (f"below {_num(self.low_return_mark)}, {LOW_RETURN_FRACTION:.0%} of the way back "
                f"from the best trailing mean so far ({_num(self.best_return_mean)}) to the "
                f"first ({_num(self.first_return_mean)})")

    def _check_entropy(self, flags: dict[str, str], ret: float, low: bool | None) -> None:
        if low is None or len(self._entropy) < ENTROPY_WINDOW or self.max_entropy <= 0:
            return
        entropy = sum(self._entropy) / len(self._entropy)
        limit = ENTROPY_COLLAPSE_FRACTION * self.max_entropy
        if entropy < limit and low:
            flags["entropy_collapsed"] = (
                f"entropy collapsed: the policy's mean entropy over the last {ENTROPY_WINDOW} "
                f"learner steps is {_num(entropy)} nats, below {_num(limit)} "
                f"({ENTROPY_COLLAPSE_FRACTION:.0%} of the maximum {_num(self.max_entropy)}), "
                f"while the mean return {_num(ret)} is {self._low_words()}; a near-deterministic "
                f"policy that does badly no longer explores (raise entropy_coeff or lower lr)")

    def _check_spikes(self, flags: dict[str, str], now: float, low: bool | None) -> None:
        """Raise each spike flag with spikes in the last `SPIKE_HOLD_S` seconds while the
        return is low for `SPIKE_CONFIRM_S` (or not known yet); note each spike in ``seen``
        once, at its own time."""
        if low is False or (low and not now - self._low_since >= SPIKE_CONFIRM_S):
            return
        for code, series in self._series.items():
            recent = series.recent(now)
            if not recent:
                continue
            flags[code] = message = self._spike_message(code, recent, low, now)
            for t, _, _, number in recent:
                if number > series.num_noted:
                    self._note(code, t, t, message, True)
                    series.num_noted = number

    def _spike_message(self, code: str, recent: list[tuple[float, float, float, int]],
                       low: bool | None, now: float) -> str:
        t, value, median, _ = max(recent, key=lambda s: s[1] / s[2])
        name = "value losses" if code == "value_loss_spike" else "gradient norms"
        key = SPIKE_STATS[code]
        times = f"{len(recent)} spikes" if len(recent) > 1 else "a spike"
        fell = (f"while the mean return has stayed {self._low_words()} for "
                f"{now - self._low_since:.0f} s" if low
                else "before enough episodes ended to judge the return")
        return (f"{LABELS[code]}: {times} in the last {SPIKE_HOLD_S:.0f} s, the largest "
                f"{key}={_num(value)} at {t:.1f} s, {_num(value / median)}x the median "
                f"{_num(median)} of the previous {SPIKE_WINDOW} learner steps (threshold "
                f"{SPIKE_RATIO:g}x), {fell}; large {name} can wreck the policy (lower lr or "
                f"vf_loss_coeff, or grad_clip)")

    def _since(self, code: str, now: float) -> float:
        if code in SPIKE_CODES:
            recent = self._series[code].recent(now)
            return recent[0][0] if recent else now
        if code == "updates_skipped":
            return self._last_skip_s
        return self._pipeline_since.get(code, now)

    def _hold_back_pipeline(self, flags: dict[str, str], now: float) -> None:
        """Drop a pipeline flag whose condition has not yet held `PIPELINE_PERSIST_S`."""
        for code in PIPELINE_CODES:
            if code not in flags:
                self._pipeline_since.pop(code, None)
                continue
            began = self._pipeline_since.setdefault(code, now)
            if now - began < PIPELINE_PERSIST_S:
                del flags[code]

    def _check_pipeline(self, flags: dict[str, str], q: Mapping[str, float], wait_ms: float,
                        grad_ms: float, blocked: float, lag: float) -> None:
        size = self.learner_queue_size
        mean = q.get("mean", math.nan)
        if q.get("count", 0) < PIPELINE_MIN_STEPS or size <= 0 or not math.isfinite(mean):
            return
        busy = wait_ms + grad_ms
        wait_fraction = wait_ms / busy if busy > 0 else 0.0
        if mean <= STARVED_QUEUE_FRACTION * size and wait_fraction >= STARVED_WAIT_FRACTION:
            flags["learner_starved"] = (
                f"learner starved: it waited for data {wait_fraction:.0%} of its time "
                f"({_num(wait_ms)} ms per step against {_num(grad_ms)} ms of training) and the "
                f"learner queue held {mean:.1f} of {size} batches on average; the actors are "
                f"the bottleneck (add workers or envs per worker, or raise num_sgd_iter)")
        elif mean >= OVERFED_QUEUE_FRACTION * size and blocked >= OVERFED_BLOCKED_FRACTION:
            lag_text = f", policy lag {lag:.1f} updates" if math.isfinite(lag) else ""
            flags["learner_overfed"] = (
                f"learner overfed: the learner queue held {mean:.1f} of {size} batches on "
                f"average and the driver waited on it {blocked:.0%} of the time{lag_text}; "
                f"the learner is the bottleneck and batches grow stale while they wait (lower "
                f"num_sgd_iter, minibatch_buffer_size or learner_queue_size, or use fewer workers)")

    @staticmethod
    def _check_sampling(flags: dict[str, str], seconds: float,
                        stalled: Sequence[Mapping[str, Any]], timeout: float | None) -> None:
        ends = (f"sample_timeout_s={timeout:g} ends and replaces such a worker"
                if timeout is not None else "sample_timeout_s=None: it is never ended")
        if math.isfinite(seconds) and seconds >= NO_SAMPLES_S:
            flags["no_samples"] = (
                f"no samples: no worker's sample reached the driver for {seconds:.1f} s of "
                f"training (threshold {NO_SAMPLES_S:g} s); the envs may hang ({ends}) or "
                f"every worker fails while starting")
        if stalled:
            names = ", ".join(f"{w.get('index')} ({w.get('seconds_since_sample', 0.0):.1f} s)"
                              for w in stalled)
            s = "s" if len(stalled) > 1 else ""
            flags["worker_stalled"] = (
                f"worker stalled: worker{s} {names} sent no sample for at least "
                f"{stalled_after_s(timeout):g} s; its env may hang in step() or reset() ({ends})")

    def _note(self, code: str, first: float, last: float, message: str, new: bool) -> None:
        """Keep ``code`` in ``seen``: first and last time, times raised, the first message."""
        entry = self.seen.get(code)
        if entry is None:
            self.seen[code] = {"first_s": round(first, 2), "last_s": round(last, 2),
                               "times": 1, "message": message}
            return
        if new:
            entry["times"] += 1
        entry["last_s"] = max(entry["last_s"], round(last, 2))
