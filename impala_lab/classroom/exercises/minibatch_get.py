"""Exercise 1: ``MinibatchBuffer.get``, the learner's ring with a ttl ramp.

The student subclasses `impala_lab.learner.minibatch_buffer.MinibatchBuffer` and writes
``get()``. The checker compares, call by call on scripted items, what the learner sees: the
``(item, released)`` returned and the items taken. The ring's state is shown, not graded.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from impala_lab.classroom.exercises._common import (
    AnswerRaised,
    Case,
    CheckResult,
    Mismatch,
    call_answer,
    loaded,
    same,
    verbatim,
)
from impala_lab.classroom.exercises._guard import Raised, portable
from impala_lab.classroom.exercises._spec import Spec, run_check

# (size, num_sgd_iter, calls of get()): simplest first.
_CASES = [
    (1, 1, 5, "This case catches an item kept past its only pass: with one slot and one pass, "
     "every call takes a new item and releases it."),
    (1, 3, 10, "This case catches a missing ttl ramp: with one slot and three passes, the items "
     "stay for 1, 2, then 3 calls."),
    (2, 1, 6, "This case catches a slot order that does not alternate (two slots, one pass: each "
     "item is used once)."),
    (2, 3, 14, "This case catches the ramp and the slot order together: the README example (0,T) "
     "(1,F) (2,F) (1,T) ..."),
    (3, 2, 15, "This case catches a ramp that overshoots: with two passes it reaches num_sgd_iter "
     "after one item and stays there."),
    (4, 4, 30, "This case catches slots released at the wrong call: four slots on a long ramp."),
    (2, 6, 40, "This case catches cur_max_ttl growing past num_sgd_iter (two slots, six passes)."),
]


class QueueExhausted(Exception):
    """The answer asked the queue for more items than the case holds."""


class ScriptedQueue:
    """A queue of the items ``item0, item1, ...`` that never blocks (and counts the takes)."""

    def __init__(self, num_items: int) -> None:
        self.items = [f"item{k}" for k in range(num_items)]
        self.taken = 0

    def get(self, block: bool = True, timeout: float | None = None) -> str:
        if self.taken >= len(self.items):
            raise QueueExhausted(
                f"get() asked the queue for item number {self.taken + 1}, but the reference "
                f"needs only {len(self.items)} items for the whole case")
        item = self.items[self.taken]
        self.taken += 1
        return item

    def get_nowait(self) -> str:
        return self.get(block=False)

    def qsize(self) -> int:
        return len(self.items) - self.taken

    def empty(self) -> bool:
        return self.qsize() == 0


def _state(buf: Any, q: ScriptedQueue) -> dict[str, Any]:
    return portable({"ttl": list(getattr(buf, "ttl", [])), "idx": getattr(buf, "idx", None),
                     "cur_max_ttl": getattr(buf, "cur_max_ttl", None),
                     "buffers": list(getattr(buf, "buffers", [])), "items_taken": q.taken})


def _show(out: Any, state: dict[str, Any]) -> Any:
    return verbatim(f"returned {out!r}; ttl={state['ttl']} idx={state['idx']} "
                    f"cur_max_ttl={state['cur_max_ttl']} buffers={state['buffers']} "
                    f"items taken from the queue={state['items_taken']}")


def _diagnose(exp_out: tuple, out: Any, exp: dict[str, Any], act: dict[str, Any]) -> str:
    """A hint on the first field of the call that differs (released last)."""
    if not (isinstance(out, tuple) and len(out) == 2):
        return "get() must return a pair (item, released)."
    if act["idx"] != exp["idx"]:  # a slot served twice in a row: items and takes go wrong
        return ("Wrong slot: this catches an index that does not move on. Move to the next "
                "slot on every call, wrapping around: "
                "self.idx = (self.idx + 1) % len(self.buffers).")
    if act["items_taken"] != exp["items_taken"]:
        return ("Wrong number of items taken: this catches fetching while the slot still has "
                "passes left, or not fetching into an empty one. "
                "Take a new item from self.inqueue only when the current slot is empty, i.e. "
                "self.ttl[self.idx] <= 0, and then only one.")
    if not same(out[0], exp_out[0]):
        return ("Wrong item: this catches serving another slot's item. Serve the item of the "
                "current slot, self.buffers[self.idx].")
    if act["cur_max_ttl"] != exp["cur_max_ttl"] or act["ttl"] != exp["ttl"]:
        return ("Wrong ttl: this catches a missing or unbounded ramp. "
                "A new item's ttl is self.cur_max_ttl; after that, cur_max_ttl grows by 1 "
                "until it reaches self.num_sgd_iter (the ramp). Each call then uses one pass: "
                "self.ttl[self.idx] -= 1, and released is True when that was the last one.")
    return ("Wrong released flag: this catches releasing an item a call early or late. "
            "released is True when this call used the item's last pass (its ttl is now "
            "0); then empty the slot (self.buffers[self.idx] = None).")


def _serve(buffer_cls: Any, case: Case, answer: bool = True) -> list[Any]:
    """A buffer of `buffer_cls` on scripted items, get() called as often as the case says:
    one (out, state) per call; a `Mismatch` or `Raised` ends the list."""
    size, passes, calls = case.params["size"], case.params["passes"], case.params["calls"]
    q = ScriptedQueue(calls)
    calls_out: list[Any] = []
    try:
        buf = call_answer(buffer_cls, q, size, passes)
        for call in range(1, calls + 1):
            try:
                out = call_answer(buf.get)
            except AnswerRaised as err:
                if isinstance(err.__cause__, QueueExhausted):
                    calls_out.append(Mismatch(
                        f"call {call} of get()", None, verbatim(str(err.__cause__)),
                        "Too many items taken: this catches fetching on a call whose slot "
                        "still holds an item. Take a new item from self.inqueue only when "
                        "the current slot is empty (self.ttl[self.idx] <= 0)."))
                    break
                raise
            if isinstance(out, list):
                out = tuple(out)
            calls_out.append((portable(out), _state(buf, q)))
    except AnswerRaised as raised:
        if not answer:
            raise raised.exc from None
        calls_out.append(Raised.of(raised))
    return calls_out


def _reference_trace(case: Case) -> list[Any]:
    from impala_lab.learner.minibatch_buffer import MinibatchBuffer

    return _serve(MinibatchBuffer, case, answer=False)


def compare_calls(expected: list[Any], actual: list[Any], show: Callable[..., Any],
                  diagnose: Callable[..., str]) -> None:
    """Raises at the first call of get() whose result or items taken differ: `show(out,
    state)` shows a call, `diagnose(exp_out, out, exp_state, state)` gives the hint."""
    for call, (exp, act) in enumerate(zip(expected, actual), start=1):
        exp_out, exp_state = exp
        if isinstance(act, Raised):
            raise act
        if isinstance(act, Mismatch):
            act.expected = show(exp_out, exp_state)
            raise act
        out, state = act
        if not same(out, exp_out) or not same(state["items_taken"], exp_state["items_taken"]):
            raise Mismatch(f"call {call} of get()", show(exp_out, exp_state), show(out, state),
                           diagnose(exp_out, out, exp_state, state))
    if len(actual) < len(expected):  # cut short: an honest run makes every call or raises
        raise Mismatch(f"call {len(actual) + 1} of get()", expected[len(actual)][0],
                       verbatim("no call"), "")


def _case(size: int, passes: int, calls: int, hint: str) -> Case:
    return Case(f"size={size}, num_sgd_iter={passes}: the queue holds item0, item1, ...; "
                f"get() is called {calls} times", hint,
                {"size": size, "passes": passes, "calls": calls})


def draw(rng: random.Random) -> Case:
    """A case drawn at random (the grader's fresh cases)."""
    return _case(rng.randint(1, 5), rng.randint(1, 6), rng.randint(10, 40),
                 "A case drawn at random: it catches slips in the ttl ramp or the slot "
                 "order that the fixed cases happen to miss.")


SPEC = Spec("minibatch_get", lambda: [_case(*row) for row in _CASES], _serve,
            _reference_trace, lambda case, exp, act: compare_calls(exp, act, _show, _diagnose),
            lambda: loaded("impala_lab.learner.minibatch_buffer", "MinibatchBuffer.get"),
            {"MinibatchBuffer": "the library's MinibatchBuffer"}, draw)


def check_minibatch_get(answer_cls: Any, *, show: bool = True) -> CheckResult:
    """Checks the ``get()`` of a `MinibatchBuffer` subclass, built as ``answer_cls(inqueue,
    size, num_sgd_iter)``, against the library's."""
    label = f"{getattr(answer_cls, '__name__', 'the answer')}.get"
    return run_check(SPEC, answer_cls, label=label, show=show)
