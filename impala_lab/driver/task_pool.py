"""`SampleTaskPool`: the sample requests in flight, per worker, whatever the backend.

The driver keeps `max_sample_requests_in_flight_per_worker` sample requests queued on every
worker, so a worker never idles while the driver handles its previous batch. The pool
remembers which worker each request went to and hands back finished ones in the order they
finished, like RLlib's ``TaskPool`` over Ray object ids. A backend represents a request by a
future (`SampleFuture`) and supplies a `wait_fn` that blocks (on process pipes, or
``ray.wait``); the default, `poll_wait`, polls.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class SampleFuture(Protocol):
    """What a backend returns for one sample request; with ``completion_time`` (seconds,
    None until done) the pool hands futures back in that order."""

    def done(self) -> bool:
        """True once the result (or the worker's error) is available; never blocks."""
        ...

    def result(self) -> Any:
        """The value (e.g. a `SampleBatch`), or raises the worker's error."""
        ...


WaitFn = Callable[[list[Any], float | None], list[Any]]


class _Default:
    """Marks an argument left out (None already means "no limit")."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Any = _Default()


def poll_wait(futures: list[Any], timeout: float | None, *, min_sleep: float = 0.0005,
              max_sleep: float = 0.02, clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> list[Any]:
    """The default `wait_fn` (tests, inline futures): polls ``done()``, sleeping with a
    doubling backoff from `min_sleep` to `max_sleep` seconds. Returns the done futures in the
    order of `futures`, or [] if none finished within `timeout` (0: check once; None: forever).
    """
    if not futures:
        return []
    deadline = None if timeout is None else clock() + timeout
    pause = min_sleep
    while True:
        ready = [f for f in futures if f.done()]
        if ready:
            return ready
        if deadline is None:
            sleep(pause)
        else:
            left = deadline - clock()
            if left <= 0:
                return []
            sleep(min(pause, left))
        pause = min(pause * 2, max_sleep)


class SampleTaskPool:
    """Sample requests in flight, keyed by the worker (any hashable object) they went to.

    A request is in flight (added, not yet seen done: `__len__`, `count`,
    `in_flight_counts`), prefetched (seen done by `completed_prefetch`, not yet handed out:
    `num_prefetched`), or handed out. A request leaves the pool *before* its ``result()`` is
    called, so when the result raises (the worker's error) the pool holds exactly the other
    requests; the caller restarts the worker (`reset_workers`) or gives up. One driver thread
    consumes; another may read the counts (a lock guards the bookkeeping).
    """

    def __init__(self, wait_fn: WaitFn | None = None,
                 blocking_timeout: float | None = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """Creates an empty pool.

        Args:
          wait_fn: ``wait_fn(futures, timeout) -> done_futures``: as soon as one of `futures`
            is done or `timeout` seconds passed (0: do not block; None: no limit), every done
            future of the list. Defaults to `poll_wait`.
          blocking_timeout: the longest a ``blocking_wait=True`` call blocks by default (None:
            no limit), as RLlib's ``TaskPool`` (10 s), so the driver can check its stop
            conditions.
          clock: the time in seconds that `owed_since` tells.
        """
        self._clock = clock
        self._wait = wait_fn if wait_fn is not None else poll_wait
        self.blocking_timeout = blocking_timeout
        self._lock = threading.Lock()
        # id(future) -> (worker, future); the dict keeps the futures alive, so ids stay unique.
        self._in_flight: dict[int, tuple[Hashable, Any]] = {}
        self._prefetched: deque[tuple[Hashable, Any]] = deque()
        self._sent_at: dict[int, float] = {}  # id(future) -> the clock at add()
        self._last_answer: dict[Hashable, float] = {}  # worker -> when a request was seen done

    def add(self, worker: Hashable, future: Any) -> None:
        """Records a sample request sent to `worker`, represented by `future`."""
        with self._lock:
            self._in_flight[id(future)] = (worker, future)
            self._sent_at[id(future)] = self._clock()

    def _take(self, key: int) -> tuple[Hashable, Any] | None:
        """Removes a done request from in flight (caller holds the lock); notes the answer."""
        entry = self._in_flight.pop(key, None)
        self._sent_at.pop(key, None)
        if entry is not None:
            self._last_answer[entry[0]] = self._clock()
        return entry

    def _ready(self, block: bool, timeout: float | None) -> list[Any]:
        """Asks `wait_fn` which in-flight futures are done; by completion_time if all have
        one, else in `wait_fn`'s order."""
        with self._lock:
            pending = [fut for _, fut in self._in_flight.values()]
        if not pending:
            return []
        if timeout is DEFAULT:
            timeout = self.blocking_timeout
        ready = self._wait(pending, timeout if block else 0.0)
        times = [getattr(f, "completion_time", None) for f in ready]
        if ready and all(isinstance(t, (int, float)) for t in times):
            order = sorted(range(len(ready)), key=times.__getitem__)  # stable for ties
            ready = [ready[i] for i in order]
        return ready

    def completed(self, blocking_wait: bool = False,
                  timeout: float | None = DEFAULT) -> Iterator[tuple[Hashable, Any]]:
        """Yields ``(worker, result)`` for each in-flight request that is done.

        A generator: it asks `wait_fn` once, on the first ``next()``. Each request is removed
        just before its result is fetched, so stopping early (or an exception from
        ``result()``) leaves the rest in flight for the next call.

        Args:
          blocking_wait: if nothing is done, block up to `timeout` for one.
          timeout: seconds a blocking wait may last in this call (None: no limit); defaults
            to `blocking_timeout`. Ignored without `blocking_wait`.
        """
        for fut in self._ready(blocking_wait, timeout):
            with self._lock:
                entry = self._take(id(fut))
            if entry is None:  # dropped by reset_workers while this generator was suspended
                continue
            worker, fut = entry
            yield worker, fut.result()

    def completed_prefetch(self, blocking_wait: bool = False, max_yield: int = 999,
                           timeout: float | None = DEFAULT) -> Iterator[tuple[Hashable, Any]]:
        """Like `completed`, but hands out at most `max_yield` results per call.

        All done requests move to prefetched at the first ``next()``; up to `max_yield` of
        them (oldest first) are yielded, the rest wait for the next call, as in RLlib's
        ``TaskPool.completed_prefetch``. It blocks only when nothing is prefetched already.

        Args:
          blocking_wait: if nothing is done or prefetched, block up to `timeout`.
          max_yield: results to hand out in this call at most, >= 0.
          timeout: as in `completed`.
        """
        if max_yield < 0:
            raise ValueError(f"max_yield={max_yield!r} is invalid: it is how many results to "
                             f"hand out at most; use 0 or more")
        ready = self._ready(blocking_wait and not self._prefetched, timeout)
        with self._lock:
            for fut in ready:
                entry = self._take(id(fut))
                if entry is not None:
                    self._prefetched.append(entry)
        for _ in range(max_yield):
            with self._lock:
                if not self._prefetched:
                    return
                worker, fut = self._prefetched.popleft()
            yield worker, fut.result()

    def reset_workers(self, workers: Iterable[Hashable]) -> list[tuple[Hashable, Any]]:
        """Keeps only the requests (in flight or prefetched) of `workers`, as RLlib does:
        call it with the live workers after one died, whose futures would never finish (a
        running generator of this pool skips them too). Returns the dropped ``(worker,
        future)`` pairs."""
        keep = set(workers)
        with self._lock:
            dropped = [e for e in self._in_flight.values() if e[0] not in keep]
            self._in_flight = {k: e for k, e in self._in_flight.items() if e[0] in keep}
            self._sent_at = {k: t for k, t in self._sent_at.items() if k in self._in_flight}
            self._last_answer = {w: t for w, t in self._last_answer.items() if w in keep}
            dropped += [e for e in self._prefetched if e[0] not in keep]
            # Filter in place: a suspended completed_prefetch reads this same deque.
            kept = [e for e in self._prefetched if e[0] in keep]
            self._prefetched.clear()
            self._prefetched.extend(kept)
        return dropped

    def owed_since(self) -> dict[Hashable, float]:
        """``{worker: time since which it owes an answer}`` for every worker with an undone
        request: the later of when its oldest unanswered request was sent and when one of its
        requests was last seen done (a worker answers in order). Answers already arrived count.
        """
        with self._lock:
            entries = [(w, f, self._sent_at.get(k)) for k, (w, f) in self._in_flight.items()]
        if not entries:
            return {}
        self._wait([f for _, f, _ in entries], 0.0)
        now = self._clock()
        owed: dict[Hashable, float] = {}
        with self._lock:
            for worker, fut, sent in entries:
                if fut.done():
                    self._last_answer[worker] = now
                else:
                    owed[worker] = min(owed.get(worker, now), now if sent is None else sent)
            return {w: max(t, self._last_answer.get(w, t)) for w, t in owed.items()}

    def count(self, worker: Hashable) -> int:
        """Requests of `worker` in flight (prefetched ones not included)."""
        with self._lock:
            return sum(1 for w, _ in self._in_flight.values() if w == worker)

    def in_flight_counts(self) -> dict[Hashable, int]:
        """``{worker: requests in flight}`` for every worker with at least one."""
        with self._lock:
            return dict(Counter(w for w, _ in self._in_flight.values()))

    def prefetched_counts(self) -> dict[Hashable, int]:
        """``{worker: requests prefetched, not yet handed out}``."""
        with self._lock:
            return dict(Counter(w for w, _ in self._prefetched))

    @property
    def num_prefetched(self) -> int:
        """Requests seen done by `completed_prefetch` and not yet handed out."""
        return len(self._prefetched)

    def __len__(self) -> int:
        """Requests in flight (prefetched ones not included)."""
        return len(self._in_flight)
