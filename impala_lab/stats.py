"""The pipeline's measuring instruments, after RLlib's ``TimerStat`` and ``WindowStat``:
timers, windowed statistics, throughput meters and a bounded history for plots.

The learner thread writes while the driver reads, so each instrument holds a small lock. An
empty one gives ``0.0``, never NaN (its ``count`` of 0 says there was no data), so values stay
JSON-friendly. No TensorFlow: actor processes import this module.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

Clock = Callable[[], float]

# Where the OS cannot say when the process started: this module is imported early.
_IMPORTED_AT = time.monotonic()


def process_start() -> float:
    """When this process started (`time.monotonic` seconds). Linux says it in /proc/self/stat
    (clock ticks since boot); elsewhere it is when this module was imported."""
    try:
        with open("/proc/self/stat") as fh:
            # after "pid (comm)": the command name may hold spaces
            fields = fh.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, IndexError, ValueError, AttributeError):  # no /proc, no CLOCK_BOOTTIME
        return _IMPORTED_AT
    return min(time.monotonic() - age, _IMPORTED_AT)


def seconds_since_process_start(at: float | None) -> float | None:
    """``at`` (a `time.monotonic` reading) as seconds since this process started; None
    stays None."""
    return None if at is None else round(at - process_start(), 3)


def _mean(values: deque[float]) -> float:
    """An exact mean (``fsum``); 0.0 of nothing."""
    return math.fsum(values) / len(values) if values else 0.0


class TimerStat:
    """Durations of a repeated operation, in seconds, like RLlib's ``TimerStat``: ``with
    timer: learn_on_batch(batch)``, or `push` durations measured elsewhere. Each thread keeps
    its own start time; nesting a timer inside itself in one thread is an error. ``clock``:
    seconds now (tests inject a fake one).

    Attributes:
      window_size: how many recent durations (>= 1) the windowed figures look at.
      count, total: operations timed and seconds spent in them since creation (or `reset`).
    """

    def __init__(self, window_size: int = 10, clock: Clock = time.perf_counter) -> None:
        if window_size < 1:
            raise ValueError(
                f"window_size={window_size!r} is invalid: a TimerStat needs a window of at "
                f"least 1 duration; use e.g. window_size=10")
        self.window_size = window_size
        self._clock = clock
        self._lock = threading.Lock()
        self._local = threading.local()
        self._samples: deque[float] = deque(maxlen=window_size)
        self._units: deque[float] = deque(maxlen=window_size)
        self.count = 0
        self.total = 0.0

    def __enter__(self) -> TimerStat:
        if getattr(self._local, "start", None) is not None:
            raise RuntimeError("TimerStat entered again before it was exited in the same thread; "
                               "use a separate TimerStat for a nested operation")
        self._local.start = self._clock()
        return self

    def __exit__(self, *exc_info: object) -> None:
        elapsed = self._clock() - self._local.start
        self._local.start = None
        self.push(elapsed)

    def push(self, seconds: float) -> None:
        """Records one operation that took `seconds`."""
        seconds = float(seconds)
        with self._lock:
            self._samples.append(seconds)
            self.count += 1
            self.total += seconds

    def push_units_processed(self, n: float) -> None:
        """Records how many units (e.g. env steps) the latest operation processed."""
        with self._lock:
            self._units.append(float(n))

    def samples(self) -> list[float]:
        """The durations in the window, oldest first, in seconds."""
        with self._lock:
            return list(self._samples)

    @property
    def mean(self) -> float:
        """Mean duration over the window, in seconds; 0.0 before the first push."""
        with self._lock:
            return _mean(self._samples)

    @property
    def median(self) -> float:
        """Median duration over the window, in seconds; 0.0 before the first push."""
        s = self.samples()
        return float(np.median(s)) if s else 0.0

    @property
    def max(self) -> float:
        """Longest duration in the window, in seconds; 0.0 before the first push."""
        s = self.samples()
        return max(s) if s else 0.0

    @property
    def last(self) -> float:
        """The latest duration, in seconds; 0.0 before the first push."""
        with self._lock:
            return self._samples[-1] if self._samples else 0.0

    @property
    def mean_units_processed(self) -> float:
        """Mean of the last `window_size` `push_units_processed` values; 0.0 if none."""
        with self._lock:
            return _mean(self._units)

    @property
    def mean_throughput(self) -> float:
        """Units per second over the window: sum(units) / sum(durations); 0.0 if no time."""
        with self._lock:
            seconds = math.fsum(self._samples)
            return math.fsum(self._units) / seconds if seconds > 0 else 0.0

    def reset(self) -> None:
        """Forgets every duration, unit count and total."""
        with self._lock:
            self._samples.clear()
            self._units.clear()
            self.count = 0
            self.total = 0.0


class WindowStat:
    """Mean, std, min and max of the last `n` (>= 1) pushed numbers, like RLlib's
    ``WindowStat``; the keys are plain (``"mean"``), `name` says what was measured."""

    def __init__(self, name: str, n: int) -> None:
        if n < 1:
            raise ValueError(f"n={n!r} is invalid: a WindowStat keeps the last n values, "
                             f"so n must be >= 1; use e.g. n=50")
        self.name = name
        self.n = n
        self.total_count = 0  # pushes ever, not limited by the window
        self._items: deque[float] = deque(maxlen=n)
        self._lock = threading.Lock()

    def push(self, x: float) -> None:
        """Adds one value; the oldest drops out once `n` are held."""
        with self._lock:
            self._items.append(float(x))
            self.total_count += 1

    def stats(self) -> dict[str, float | int]:
        """``"mean"``, ``"std"`` (population std, ``ddof=0``), ``"min"``, ``"max"`` and
        ``"count"`` (values in the window) of the window; count 0 and 0.0 when empty."""
        with self._lock:
            items = np.fromiter(self._items, dtype=np.float64, count=len(self._items))
        if items.size == 0:
            return {"mean": 0.0, "std": 0.0, "min": 0.0, "max": 0.0, "count": 0}
        return {"mean": float(items.mean()), "std": float(items.std()),
                "min": float(items.min()), "max": float(items.max()), "count": int(items.size)}


class ThroughputMeter:
    """Counts units (env steps, batches) and says how fast they arrive: `rate()` over the
    last ``window_s`` seconds, `mean_rate` since creation (or `reset`), `pop_interval_rate()`
    since its previous call (RLlib's ``get_mean_stats_and_reset``). It keeps an entry per
    `add` in the window: add per batch, not per step. ``clock``: seconds now (tests fake it)."""

    def __init__(self, window_s: float = 10.0, clock: Clock = time.monotonic) -> None:
        if not (window_s > 0 and math.isfinite(window_s)):
            raise ValueError(f"window_s={window_s!r} is invalid: the sliding window needs a "
                             f"positive finite length in seconds, e.g. window_s=10.0")
        self.window_s = float(window_s)
        self._clock = clock
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Forgets everything and restarts the clock."""
        with self._lock:
            self._start = self._interval_start = self._clock()
            self._events: deque[tuple[float, float]] = deque()
            self._total = self._interval_sum = 0.0

    def add(self, n: float = 1) -> None:
        """Records `n` units arriving now."""
        with self._lock:
            now = self._clock()
            self._events.append((now, n))
            self._total += n
            self._interval_sum += n
            self._prune(now)

    def _prune(self, now: float) -> None:
        while self._events and self._events[0][0] <= now - self.window_s:
            self._events.popleft()

    def rate(self) -> float:
        """Units per second over the last `window_s` seconds, or over the meter's age while it
        is younger (a fresh meter does not under-report); 0.0 at age 0."""
        with self._lock:
            now = self._clock()
            self._prune(now)
            span = min(self.window_s, now - self._start)
            return math.fsum(n for _, n in self._events) / span if span > 0 else 0.0

    @property
    def total(self) -> float:
        """Units added since creation (or `reset`)."""
        with self._lock:
            return self._total

    @property
    def elapsed(self) -> float:
        """Seconds since creation (or `reset`)."""
        return self._clock() - self._start

    @property
    def mean_rate(self) -> float:
        """`total` / `elapsed`: units per second since creation; 0.0 at age 0."""
        with self._lock:
            span = self._clock() - self._start
            return self._total / span if span > 0 else 0.0

    def pop_interval_rate(self) -> float:
        """Units per second since the previous call (or creation), then starts a new interval."""
        with self._lock:
            now = self._clock()
            span = now - self._interval_start
            value = self._interval_sum / span if span > 0 else 0.0
            self._interval_start = now
            self._interval_sum = 0.0
            return value


def flatten(nested: Mapping[str, Any], sep: str = ".") -> dict[str, Any]:
    """Nested dicts in one level, keys joined with `sep` and made ``str``: ``{"t": {"ms":
    5.0}, "n": 1}`` becomes ``{"t.ms": 5.0, "n": 1}``."""
    out: dict[str, Any] = {}
    for key, value in nested.items():
        if isinstance(value, Mapping):
            out.update({f"{key}{sep}{k}": v for k, v in flatten(value, sep).items()})
        else:
            out[str(key)] = value
    return out


class StatsHistory:
    """The last `maxlen` (>= 1) stats snapshots, flattened, for plots over time; ``clock``
    stamps a row that has no ``"time"`` of its own."""

    def __init__(self, maxlen: int = 1000, clock: Clock = time.time) -> None:
        if maxlen < 1:
            raise ValueError(f"maxlen={maxlen!r} is invalid: the history must keep at least "
                             f"one row; use e.g. maxlen=1000")
        self.maxlen = maxlen
        self._clock = clock
        self._rows: deque[dict[str, Any]] = deque(maxlen=maxlen)
        self._lock = threading.Lock()

    def append(self, snapshot: Mapping[str, Any]) -> dict[str, Any]:
        """Stores and returns a flattened copy of `snapshot`, stamped with ``"time"`` if it
        has none."""
        row = flatten(snapshot)
        if "time" not in row:
            row["time"] = self._clock()
        with self._lock:
            self._rows.append(row)
        return row

    def rows(self) -> list[dict[str, Any]]:
        """Copies of the rows, oldest first."""
        with self._lock:
            return [dict(r) for r in self._rows]

    def keys(self) -> list[str]:
        """Every key seen in the kept rows, in order of first appearance."""
        with self._lock:
            return list(dict.fromkeys(key for r in self._rows for key in r))

    def column(self, key: str) -> np.ndarray:
        """One key's values over the kept rows, oldest first: float64 [len(self)], NaN where
        a row lacks it (a gap in a plot); an object array (None where missing) if a value is
        not a number."""
        with self._lock:
            values = [r.get(key) for r in self._rows]
        try:
            return np.array([np.nan if v is None else v for v in values], dtype=np.float64)
        except (TypeError, ValueError):
            return np.array(values, dtype=object)

    def clear(self) -> None:
        """Drops every row."""
        with self._lock:
            self._rows.clear()

    def __len__(self) -> int:
        return len(self._rows)


def csv_number(text: str | None) -> float:
    """A metrics.csv field as a number; NaN where it is empty or not one."""
    try:
        return float(text or "nan")
    except ValueError:
        return math.nan


def jsonable(value: Any) -> Any:
    """A stats snapshot made JSON-ready: NaN/inf become null, numpy scalars plain numbers."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return jsonable(value.item())
    return value
