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

The checker compares what it yields, and the store at the end, with
`impala_lab.driver.replay_mixer.ReplayMixer` on the same batches and seed.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from impala_lab.classroom.exercises._common import (
    Case,
    CheckResult,
    Mismatch,
    call_answer,
    loaded,
    same,
    verbatim,
    window,
)
from impala_lab.classroom.exercises._guard import portable
from impala_lab.classroom.exercises._spec import Spec, run_check

DRAWS = ("make exactly RLlib's draws, in this order: rng.random() for each test of the "
         "while loop, then rng.choice(store) for each replay.")

# replay_proportion, slots, train_batch_size, sample_batch_size, new batches, seed, hint
_CASES = [
    (0.0, 0, 100, 50, 6, 0,
     "This case catches a change to the new pairs: with replay_proportion=0 (and no "
     "store), yield them only, unchanged."),
    (0.0, 4, 100, 50, 8, 1,
     "This case catches a replay at replay_proportion=0, or a new batch not stored: store "
     "the new batches but never replay."),
    (1.0, 4, 100, 50, 8, 2,
     "This case catches replays drawn before the new batch is stored, or a wrong "
     "threshold: with replay_proportion=1, exactly one replay per new batch once the store "
     "holds more than replay_threshold batches (counting the new one)."),
    (0.5, 10, 100, 50, 20, 3, "This case catches extra or missing draws of rng: "
     "replay_proportion=0.5 is a replay with probability 0.5. " + DRAWS),
    (1.5, 10, 100, 50, 20, 4, "This case catches f not decreasing after each replay: "
     "replay_proportion=1.5 is one replay surely, a second with probability 0.5 (f "
     "decreases by 1 after each replay). " + DRAWS),
    (3.0, 4, 150, 50, 12, 5, "This case catches replays drawn from a store of your own or "
     "from dropped batches: a small store (4 slots, threshold 3): the oldest batch drops "
     "out, and replays are drawn from the batches stored now, including the new one."),
    (0.7, 3, 90, 50, 25, 6, "This case catches an off-by-one in the threshold: ceil(90 / "
     "50) = 2 with 3 slots, so replays start at the third new batch. " + DRAWS),
]


@dataclass(eq=False)
class FakeBatch:
    """A stand-in for a `SampleBatch`: a name and a ``count`` (env steps)."""

    name: str
    count: int

    def __repr__(self) -> str:
        return self.name


def _label(pair: Any) -> str:
    if not (isinstance(pair, tuple) and len(pair) == 2):
        return f"not a (worker, batch) pair: {pair!r}"
    worker, batch = pair
    return f"({'None' if worker is None else worker}, {batch})"


def _window(seq: list[Any], i: int) -> str:
    return f"items {max(0, i - 3)}..: " + window([_label(p) for p in seq], i, 3, 2,
                                                   "(nothing more)")


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


def _pairs(p: dict[str, Any]) -> list[tuple[str, FakeBatch]]:
    return [(f"w{k % 3}", FakeBatch(f"b{k}", p["sample"])) for k in range(p["n_new"])]


def _named(item: Any) -> Any:
    """A yielded item as (worker, batch name), the form both traces keep."""
    if isinstance(item, list):
        item = tuple(item)
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], FakeBatch):
        return (portable(item[0]), item[1].name)
    return portable(item)


def _answer_trace(answer: Any, case: Case) -> dict[str, Any]:
    p = case.params
    store: deque = deque(maxlen=p["slots"])
    rng = random.Random(p["seed"])
    threshold = -(-p["train"] // p["sample"])
    gen = call_answer(answer, iter(_pairs(p)), store, p["rp"], threshold, rng)
    try:
        iterator = iter(gen)
    except TypeError:
        raise Mismatch("what mix(...) returns", verbatim("a generator of (worker, batch)"),
                       verbatim(f"{type(gen).__name__}: {portable(gen)!r}"),
                       "mix must yield pairs (use `yield`), or return an iterable.") from None
    # At most ceil(replay_proportion) replays follow a new batch: more means it never stops.
    limit = p["n_new"] * (2 + int(np.ceil(p["rp"]))) + 10
    items: list[Any] = []
    end = object()
    while len(items) < limit:
        item = call_answer(next, iterator, end)
        if item is end:
            break
        items.append(_named(item))
    return {"items": items, "store": [portable(getattr(b, "name", b)) for b in store]}


def _reference_trace(case: Case) -> dict[str, Any]:
    from impala_lab.driver.replay_mixer import ReplayMixer

    p = case.params
    ref = ReplayMixer(p["rp"], p["slots"], p["train"], p["sample"], seed=p["seed"])
    items = [_named(item) for item in ref.mix(iter(_pairs(p)))]
    return {"items": items, "store": [b.name for b in ref._store]}


def _compare(case: Case, expected: dict[str, Any], actual: dict[str, Any]) -> None:
    exp_items, act_items = expected["items"], actual["items"]
    for i in range(max(len(exp_items), len(act_items))):
        if not (i < len(exp_items) and i < len(act_items) and same(act_items[i], exp_items[i])):
            raise Mismatch(f"item {i} of what mix yields ({len(exp_items)} items expected)",
                           verbatim(_window(exp_items, i)), verbatim(_window(act_items, i)),
                           _diagnose(exp_items, act_items, i))
    if not same(actual["store"], expected["store"]):
        raise Mismatch("the store after the last batch", expected["store"], actual["store"],
                       "Append each new batch to store (never a replayed one); the deque's "
                       "maxlen drops the oldest by itself.")


def _case(rp: float, slots: int, train: int, sample: int, n_new: int, seed: int,
          hint: str) -> Case:
    threshold = -(-train // sample)
    return Case(f"replay_proportion={rp}, store maxlen={slots}, replay_threshold="
                f"{threshold}, {n_new} new batches b0, b1, ... from workers w0, w1, "
                f"w2, rng=random.Random({seed})", hint,
                {"rp": rp, "slots": slots, "train": train, "sample": sample,
                 "n_new": n_new, "seed": seed})


def draw(rng: random.Random) -> Case:
    """A case drawn at random (the grader's fresh cases)."""
    train = rng.choice([50, 100, 150])
    slots = train // 50 + rng.randint(1, 7)  # ReplayMixer: the store outgrows the threshold
    return _case(round(rng.uniform(0.0, 2.5), 2), slots, train, 50, rng.randint(5, 25),
                 rng.randrange(10**6), "A case drawn at random: it catches slips in the "
                 "threshold or the draws that the fixed cases miss. " + DRAWS)


SPEC = Spec("replay_mix", lambda: [_case(*row) for row in _CASES], _answer_trace,
            _reference_trace, _compare,
            lambda: loaded("impala_lab.driver.replay_mixer", "ReplayMixer.mix"),
            {"ReplayMixer": "the library's ReplayMixer", ".mix": "the library's ReplayMixer.mix",
             "_augment_with_replay": "the library's replay"}, draw)


def check_replay_mix(answer: Any, *, show: bool = True) -> CheckResult:
    """Checks the generator ``mix(pairs, store, replay_proportion, replay_threshold, rng)``
    against `impala_lab.driver.replay_mixer.ReplayMixer.mix`."""
    return run_check(SPEC, answer, show=show)
