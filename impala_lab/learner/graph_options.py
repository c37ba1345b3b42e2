"""`GraphOptions`: run the train step's graph without Grappler where its rewrites do not pay.

TensorFlow optimizes a function's graph with Grappler (constant folding, arithmetic
simplification, op fusion, ...) the first time the function runs. For the learner that is
part of the first train step, the last thing between a run's start and its first update.
Measured on this project's 2-core machine, one process per setting, the tuned presets'
train batches (first step / median step later), with RMSProp still written out in ops:

    model                          Grappler on         Grappler off
    CartPole MLP                   0.39 s / 0.96 ms    0.31 s / 0.94 ms
    MinAtar Breakout CNN           0.42 s / 3.79 ms    0.33 s / 3.81 ms
    Pendulum MLP (Gaussian)        0.60 s / 1.83 ms    0.47 s / 1.81 ms
    StatelessCartPole LSTM         0.62 s / 5.0 ms     0.46 s / 5.4 ms

So the feed-forward policies run their train step without it (0.08-0.13 s sooner, later steps
as fast), and the recurrent one keeps it: its rewrites make every later step about 8% faster,
which pays for the first step's 0.15 s within about 2 s of training.

TensorFlow has no public switch for one function: the options Grappler reads travel with each
call, taken from the calling thread's ``FunctionCallOptions`` (``tensorflow.python.eager.
context``). `GraphOptions` swaps the calling thread's options for the duration of a call and
puts the caller's back, so nothing else in the process (a notebook's own functions, the
dashboard) is affected. Should a TensorFlow release move that API, `GraphOptions` leaves the
options alone (Grappler on, as before) and `available` says so; ``tests/test_graph_options.py``
checks that it works with the TensorFlow installed.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

try:  # not public API: see the module docstring
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.eager import context as _context

    _context.FunctionCallOptions  # noqa: B018 (an AttributeError here means: not available)
    available = True
except (ImportError, AttributeError):  # pragma: no cover - depends on the TensorFlow release
    available = False

__all__ = ["GraphOptions", "available"]


class GraphOptions:
    """A context manager: calls of TF functions inside it run with ``grappler`` on or off.

    Args:
      grappler: False turns Grappler off for the calls made inside (each function is
        optimized, or not, on its first call; later calls must use the same setting).

    Use one instance per policy; entering and leaving cost about 1.3 us together.
    """

    def __init__(self, grappler: bool) -> None:
        self.grappler = grappler
        self._options: Any = None
        self._saved = threading.local()  # the caller's options, per thread
        if grappler or not available:
            return
        default = _context.context().function_call_options  # from the context's config
        proto = _config_proto(default)
        proto.graph_options.rewrite_options.disable_meta_optimizer = True
        self._options = _context.FunctionCallOptions(executor_type=default.executor_type,
                                                     config_proto=proto)

    @property
    def active(self) -> bool:
        """Whether entering changes anything (Grappler off and the API available)."""
        return self._options is not None

    def __enter__(self) -> GraphOptions:
        if self._options is not None:
            ctx = _context.context()
            self._saved.options = ctx.function_call_options
            ctx.function_call_options = self._options
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._options is not None:
            _context.context().function_call_options = self._saved.options


def grappler_disabled_in_this_thread() -> bool:
    """Whether calls from this thread now run with Grappler off (for tests and debugging)."""
    if not available:
        return False
    proto = _config_proto(_context.context().function_call_options)
    return bool(proto.graph_options.rewrite_options.disable_meta_optimizer)


def _config_proto(options: Any) -> Any:
    """The ``ConfigProto`` that ``options`` (a ``FunctionCallOptions``) carry, as a message."""
    proto = config_pb2.ConfigProto()
    proto.ParseFromString(options.config_proto_serialized)
    return proto
