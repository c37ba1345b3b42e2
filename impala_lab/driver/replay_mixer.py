"""`ReplayMixer`: mixes replayed sample batches into the stream of new ones.

IMPALA can train on a mix of fresh and replayed experience (the paper's "replay" runs;
RLlib's ``replay_proportion``). After each new batch the mixer yields on average
`replay_proportion` batches drawn uniformly from a FIFO store of recent new batches, with
RLlib's rule::

    f = replay_proportion
    while random() < f:          # with f = 1.5: one replay surely, a second with p = 0.5
        f -= 1
        yield None, random.choice(store)

so the number of replays per new batch is ``floor(f) + Bernoulli(f - floor(f))``, whose mean
is exactly `replay_proportion`. Replays start only once the store holds more batches than one
train batch needs (``ceil(train_batch_size / sample_batch_size)``), so a train batch is never
made of a few batches repeated. Batches only need a ``count`` attribute (env steps).
"""

from __future__ import annotations

import math
import numbers
import random
from collections import deque
from collections.abc import Hashable, Iterable, Iterator
from typing import Any

from impala_lab.errors import ConfigError


class ReplayMixer:
    """A FIFO store of recent new batches and RLlib's replay rule.

    Attributes:
      num_replayed: env steps replayed so far (sum of the replayed batches' ``count``),
        RLlib's ``num_steps_replayed``.
      num_replayed_batches: batches replayed so far.
      replay_threshold: ``ceil(train_batch_size / sample_batch_size)``; replays start once
        `num_stored` exceeds it.
    """

    def __init__(self, replay_proportion: float, replay_buffer_num_slots: int,
                 train_batch_size: int, sample_batch_size: int,
                 seed: int | None = None) -> None:
        """Creates an empty mixer.

        Args:
          replay_proportion: replayed batches per new batch, on average, >= 0.
          replay_buffer_num_slots: batches the store keeps (FIFO), >= 0; 0 disables replay.
          train_batch_size: env steps per learner batch, >= 1.
          sample_batch_size: env steps per stored batch, >= 1.
          seed: seeds the mixer's own ``random.Random`` (same seed and inputs: same replays).

        Raises:
          ConfigError (a ValueError): a bad size or `replay_proportion`, or a store too small
            to ever replay (see `replay_proportion`).
        """
        for name, value, low in (("replay_buffer_num_slots", replay_buffer_num_slots, 0),
                                 ("train_batch_size", train_batch_size, 1),
                                 ("sample_batch_size", sample_batch_size, 1)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
                raise ConfigError(f"{name}={value!r} is invalid: it must be an integer >= {low}")
        self.replay_buffer_num_slots = int(replay_buffer_num_slots)
        self.train_batch_size = int(train_batch_size)
        self.sample_batch_size = int(sample_batch_size)
        self.replay_threshold = -(-self.train_batch_size // self.sample_batch_size)  # ceil
        self._store: deque[Any] = deque(maxlen=self.replay_buffer_num_slots)
        self._rng = random.Random(seed)
        self.num_replayed = 0
        self.num_replayed_batches = 0
        self.replay_proportion = replay_proportion  # validated by the setter

    @property
    def replay_proportion(self) -> float:
        """Replayed batches per new batch, on average; settable while mixing (the dashboard).

        A value > 0 needs a store of more than `replay_threshold` slots, or it would never
        replay (RLlib let such sizes through).
        """
        return self._replay_proportion

    @replay_proportion.setter
    def replay_proportion(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
                value >= 0 and math.isfinite(value)):
            raise ConfigError(f"replay_proportion={value!r} is invalid: it must be a finite "
                              f"number >= 0 (replayed batches per new batch; 0 disables replay)")
        if value > 0 and self.replay_buffer_num_slots <= self.replay_threshold:
            slots, s, t = (self.replay_buffer_num_slots, self.sample_batch_size,
                           self.train_batch_size)
            raise ConfigError(
                f"replay_buffer_num_slots={slots} is too small for replay_proportion={value}: "
                f"the replay buffer replays only once it holds more than "
                f"ceil(train_batch_size / sample_batch_size) = ceil({t} / {s}) = "
                f"{self.replay_threshold} batches (replay_buffer_num_slots * sample_batch_size "
                f"= {slots * s} env steps vs train_batch_size = {t}); set "
                f"replay_buffer_num_slots to at least {self.replay_threshold + 1}, "
                f"or replay_proportion=0")
        self._replay_proportion = float(value)

    @property
    def capacity(self) -> int:
        """Batches the store keeps at most (``replay_buffer_num_slots``)."""
        return self.replay_buffer_num_slots

    @property
    def num_stored(self) -> int:
        """Batches in the store now."""
        return len(self._store)

    def can_replay(self) -> bool:
        """True once the store holds more than `replay_threshold` batches (RLlib's rule)."""
        return len(self._store) > self.replay_threshold

    def mix(self, pairs: Iterable[tuple[Hashable, Any]]) -> Iterator[tuple[Hashable | None, Any]]:
        """Yields each new ``(worker, batch)`` pair, then its replays as ``(None, batch)``.

        For each new pair, as RLlib's ``_augment_with_replay`` with its driver loop: yield
        the pair; store its batch (the oldest drops out of a full store); then, if
        `can_replay()` (counting the new batch, as in RLlib), draw the replays with RLlib's
        rule. A replayed batch is never stored again; ``worker is None`` tells the driver to
        train on it without counting it as sampled or answering a worker.
        """
        for worker, batch in pairs:
            yield worker, batch
            if self.replay_buffer_num_slots > 0:
                self._store.append(batch)
            if self.can_replay():
                f = self._replay_proportion
                while self._rng.random() < f:
                    f -= 1
                    replay = self._rng.choice(self._store)
                    self.num_replayed += replay.count
                    self.num_replayed_batches += 1
                    yield None, replay
