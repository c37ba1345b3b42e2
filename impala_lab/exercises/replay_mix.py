"""Exercise 2: the replay mixer's rule, ``ReplayMixer.mix`` as a function.

The student writes a generator ``mix(pairs, store, replay_proportion, replay_threshold,
rng)``: for each new ``(worker, batch)`` it yields the pair, appends the batch to ``store``
(a ``collections.deque`` with ``maxlen=replay_buffer_num_slots``: the oldest batch drops
out by itself), and once ``len(store) > replay_threshold`` yields replays ``(None, batch)``
with RLlib's rule, using exactly these draws of ``rng`` (a ``random.Random``):

    f = replay_proportion
    while rng.random() < f:
        f -= 1
        yield None, rng.choice(store)

The checker gives the answer and the library's `impala_lab.replay.ReplayMixer` the same
batches and the same seed, and compares what they yield, item by item, and the store at the
end.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from impala_lab.exercises._common import (
    Case,
    CheckResult,
    Mismatch,
    call_answer,
    run_check,
    verbatim,
)

EXERCISE = "replay_mix"

DRAWS = ("make exactly RLlib's draws, in this order: rng.random() for each test of the "
         "while loop, then rng.choice(store) for each replay.")

# replay_proportion, slots, train_batch_size, sample_batch_size, new batches, seed, hint
_CASES = [
    (0.0, 0, 100, 50, 6, 0,
     "With replay_proportion=0 (and no store), yield the new pairs only, unchanged."),
    (0.0, 4, 100, 50, 8, 1,
     "With replay_proportion=0, store the new batches but never replay."),
    (1.0, 4, 100, 50, 8, 2,
     "With replay_proportion=1, exactly one replay per new batch once the store holds more "
     "than replay_threshold batches (counting the new one)."),
    (0.5, 10, 100, 50, 20, 3, "replay_proportion=0.5: a replay with probability 0.5. " + DRAWS),
    (1.5, 10, 100, 50, 20, 4, "replay_proportion=1.5: one replay surely, a second with "
     "probability 0.5 (f decreases by 1 after each replay). " + DRAWS),
    (3.0, 4, 150, 50, 12, 5, "A small store (4 slots, threshold 3): the oldest batch drops "
     "out, and replays are drawn from the batches stored now, including the new one."),
    (0.7, 3, 90, 50, 25, 6, "threshold ceil(90 / 50) = 2 with 3 slots: replays start at the "
     "third new batch. " + DRAWS),
]


class FakeBatch:
    """A stand-in for a `SampleBatch`: a name and a ``count`` (env steps)."""

    def __init__(self, name: str, count: int) -> None:
        self.name = name
        self.count = count

    def __repr__(self) -> str:
        return self.name


def _label(pair: Any) -> str:
    try:
        worker, batch = pair
    except (TypeError, ValueError):
        return f"not a (worker, batch) pair: {pair!r}"
    return f"({'None' if worker is None else worker}, {batch!r})"


def _window(seq: list[Any], i: int) -> str:
    lo = max(0, i - 3)
    head = "... " if lo else ""
    tail = " ..." if i + 2 < len(seq) else ""
    items = [("→ " if k == i else "") + _label(p) for k, p in enumerate(seq[lo:i + 2], lo)]
    if i >= len(seq):
        items.append("→ (nothing more)")
    return f"items {lo}..: {head}{', '.join(items)}{tail}"


def _diagnose(expected: list[Any], actual: list[Any], i: int) -> str:
    if i >= len(actual):
        return ("The answer stopped early: for every new pair, yield it, store its batch, "
                "then yield its replays.")
    if i >= len(expected):
        return "The answer yields more than the reference: too many replays? " + DRAWS
    exp_w, act = expected[i][0], actual[i]
    if not (isinstance(act, tuple | list) and len(act) == 2):
        return "Yield pairs: (worker, batch) for new batches, (None, batch) for replays."
    if exp_w is None and act[0] is not None:
        return ("A replay is missing here. Store the new batch before drawing its replays, "
                "and replay while rng.random() < f (f starts at replay_proportion, minus 1 "
                "after each replay) once len(store) > replay_threshold.")
    if exp_w is not None and act[0] is None:
        return ("The answer replays where the reference does not: replay only once "
                "len(store) > replay_threshold, and stop when rng.random() >= f. " + DRAWS)
    if exp_w is None:
        return ("A different batch was replayed: pick it with rng.choice(store) right after "
                "the rng.random() test; never store replayed batches.")
    return "Yield each new (worker, batch) pair unchanged and in order."


def _run_case(answer: Any, case: Case) -> None:
    from impala_lab.replay import ReplayMixer

    p = case.params
    workers = ["w0", "w1", "w2"]
    pairs = [(workers[k % 3], FakeBatch(f"b{k}", p["sample"])) for k in range(p["n_new"])]
    ref = ReplayMixer(p["rp"], p["slots"], p["train"], p["sample"], seed=p["seed"])
    expected = list(ref.mix(iter(pairs)))
    store: deque = deque(maxlen=p["slots"])
    rng = random.Random(p["seed"])
    gen = call_answer(answer, iter(pairs), store, p["rp"], ref.replay_threshold, rng)
    actual: list[Any] = []
    limit = 4 * len(expected) + 10  # an answer that never stops replaying
    try:
        iterator = iter(gen)
    except TypeError:
        raise Mismatch("what mix(...) returns", verbatim("a generator of (worker, batch)"),
                       verbatim(f"{type(gen).__name__}: {gen!r}"),
                       "mix must yield pairs (use `yield`), or return an iterable.") from None
    while len(actual) < limit:
        try:
            item = call_answer(next, iterator)
        except Exception as err:
            if isinstance(err.__cause__, StopIteration):
                break
            raise
        actual.append(tuple(item) if isinstance(item, list) else item)
    for i in range(max(len(expected), len(actual))):
        same = i < len(expected) and i < len(actual) and isinstance(actual[i], tuple) and (
            len(actual[i]) == 2 and actual[i][0] == expected[i][0]
            and getattr(actual[i][1], "name", None) == expected[i][1].name)
        if not same:
            raise Mismatch(f"item {i} of what mix yields ({len(expected)} items expected)",
                           verbatim(_window(expected, i)), verbatim(_window(actual, i)),
                           _diagnose(expected, actual, i))
    ref_store = [b.name for b in ref._store]
    ans_store = [getattr(b, "name", b) for b in store]
    if ans_store != ref_store:
        raise Mismatch("the store after the last batch", ref_store, ans_store,
                       "Append each new batch to store (never a replayed one); the deque's "
                       "maxlen drops the oldest by itself.")


def cases() -> list[Case]:
    """The checker's cases, simplest first."""
    out = []
    for rp, slots, train, sample, n_new, seed, hint in _CASES:
        threshold = -(-train // sample)
        out.append(Case(f"replay_proportion={rp}, store maxlen={slots}, replay_threshold="
                        f"{threshold}, {n_new} new batches b0, b1, ... from workers w0, w1, "
                        f"w2, rng=random.Random({seed})", hint,
                        {"rp": rp, "slots": slots, "train": train, "sample": sample,
                         "n_new": n_new, "seed": seed}))
    return out


def check_replay_mix(answer: Any, *, show: bool = True) -> CheckResult:
    """Checks ``mix(pairs, store, replay_proportion, replay_threshold, rng)`` against
    `impala_lab.replay.ReplayMixer.mix` on seeded cases.

    Args:
      answer: the student's generator function.
      show: print the message.
    """
    label = getattr(answer, "__name__", "the answer")
    return run_check(EXERCISE, label, cases(), lambda c: _run_case(answer, c), show=show)
