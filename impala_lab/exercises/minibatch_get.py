"""Exercise 1: ``MinibatchBuffer.get``, the learner's ring with a ttl ramp.

The student subclasses `impala_lab.minibatch_buffer.MinibatchBuffer` and writes ``get()``
(no arguments; it may block on ``self.inqueue.get()`` like RLlib's). The checker builds
the student's class and the library's ``MinibatchBuffer`` on the same items, calls ``get()``
on both and compares, after every call, the returned ``(item, released)`` and the ring's
state: ``ttl``, ``idx``, ``cur_max_ttl``, ``buffers`` and how many items were taken from
the queue.
"""

from __future__ import annotations

from typing import Any

from impala_lab.exercises._common import (
    Case,
    CheckResult,
    Mismatch,
    call_answer,
    run_check,
    verbatim,
)

EXERCISE = "minibatch_get"

# (size, num_sgd_iter, calls of get()): simplest first.
_CASES = [
    (1, 1, 5, "one slot, one pass: every call takes a new item and releases it."),
    (1, 3, 10, "one slot, three passes: an item stays for its ttl, the ttl ramps 1, 2, 3."),
    (2, 1, 6, "two slots, one pass: the slots alternate, each item is used once."),
    (2, 3, 14, "two slots, three passes: the README example (0,T) (1,F) (2,F) (1,T) ..."),
    (3, 2, 15, "three slots, two passes: the ramp reaches num_sgd_iter after one item."),
    (4, 4, 30, "four slots, four passes: a long ramp, slots released at different calls."),
    (2, 6, 40, "two slots, six passes: cur_max_ttl must stop at num_sgd_iter."),
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
    return {"ttl": list(getattr(buf, "ttl", [])), "idx": getattr(buf, "idx", None),
            "cur_max_ttl": getattr(buf, "cur_max_ttl", None),
            "buffers": list(getattr(buf, "buffers", [])), "items_taken": q.taken}


def _show(out: Any, state: dict[str, Any]) -> Any:
    return verbatim(f"returned {out!r}; ttl={state['ttl']} idx={state['idx']} "
                    f"cur_max_ttl={state['cur_max_ttl']} buffers={state['buffers']} "
                    f"items taken from the queue={state['items_taken']}")


def _diagnose(exp_out: tuple, out: Any, exp: dict[str, Any], act: dict[str, Any]) -> str:
    if not (isinstance(out, tuple) and len(out) == 2):
        return "get() must return a pair (item, released)."
    if act["items_taken"] != exp["items_taken"]:
        return ("Take a new item from self.inqueue only when the current slot is empty, i.e. "
                "self.ttl[self.idx] <= 0, and then only one.")
    if out[0] != exp_out[0]:
        return "Serve the item of the current slot, self.buffers[self.idx]."
    if act["cur_max_ttl"] != exp["cur_max_ttl"] or (
            act["ttl"] != exp["ttl"] and out[1] == exp_out[1]):
        return ("A new item's ttl is self.cur_max_ttl; after that, cur_max_ttl grows by 1 "
                "until it reaches self.num_sgd_iter (the ramp). Each call then uses one pass: "
                "self.ttl[self.idx] -= 1.")
    if out[1] != exp_out[1] or act["ttl"] != exp["ttl"]:
        return ("released is True when this call used the item's last pass (its ttl is now "
                "0); then empty the slot (self.buffers[self.idx] = None).")
    if act["idx"] != exp["idx"]:
        return ("Move to the next slot on every call, wrapping around: "
                "self.idx = (self.idx + 1) % len(self.buffers).")
    return "A released slot must hold None (self.buffers[self.idx] = None)."


def _run_case(answer_cls: Any, case: Case) -> None:
    from impala_lab.minibatch_buffer import MinibatchBuffer

    size, passes, calls = case.params["size"], case.params["passes"], case.params["calls"]
    ref_q, ans_q = ScriptedQueue(calls), ScriptedQueue(calls)
    ref = MinibatchBuffer(ref_q, size, passes)
    ans = call_answer(answer_cls, ans_q, size, passes)
    for call in range(1, calls + 1):
        exp_out = ref.get()
        try:
            out = call_answer(ans.get)
        except Exception as err:
            if isinstance(err.__cause__, QueueExhausted):
                raise Mismatch(f"call {call} of get()", _show(exp_out, _state(ref, ref_q)),
                               verbatim(str(err.__cause__)),
                               "Take a new item from self.inqueue only when the current slot "
                               "is empty (self.ttl[self.idx] <= 0).") from None
            raise
        exp, act = _state(ref, ref_q), _state(ans, ans_q)
        if isinstance(out, list):
            out = tuple(out)
        if out != exp_out or act != exp:
            raise Mismatch(f"call {call} of get()", _show(exp_out, exp), _show(out, act),
                           _diagnose(exp_out, out, exp, act))


def cases() -> list[Case]:
    """The checker's cases, simplest first."""
    return [Case(f"size={size}, num_sgd_iter={passes}: the queue holds item0, item1, ...; "
                 f"get() is called {calls} times", hint,
                 {"size": size, "passes": passes, "calls": calls})
            for size, passes, calls, hint in _CASES]


def check_minibatch_get(answer_cls: Any, *, show: bool = True) -> CheckResult:
    """Checks a `MinibatchBuffer` subclass's ``get()`` against the library's.

    Args:
      answer_cls: the student's class, built as ``answer_cls(inqueue, size, num_sgd_iter)``
        (a subclass of `impala_lab.minibatch_buffer.MinibatchBuffer` that overrides ``get``).
      show: print the message.

    Returns:
      A `CheckResult`; its message is the pass line or the first call that differs.
    """
    label = f"{getattr(answer_cls, '__name__', 'the answer')}.get"
    return run_check(EXERCISE, label, cases(), lambda c: _run_case(answer_cls, c), show=show)
