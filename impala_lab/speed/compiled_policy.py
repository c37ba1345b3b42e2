"""`CompiledPolicy`: `VTracePolicy` with its hot calls dispatched straight to traced graphs.

On a small model TensorFlow's generic paths cost more than the work itself: a
``tf.function`` call matches its arguments against the traced signatures every time, and
``model.get_weights()`` reads one variable at a time. Here each train-step signature is traced
once (``get_concrete_function``) and its graph called directly, and the same graph reads every
weight into one flat float32 vector after the update. That vector is the snapshot the driver
broadcasts: `get_weights` takes it without the lock, so a broadcast never waits for the
learner's next step. Results equal the plain calls' (tests hold them equal).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from impala_lab.learner.vtrace_policy import VTracePolicy

__all__ = ["CompiledPolicy"]


class CompiledPolicy(VTracePolicy):
    """A `VTracePolicy` (same arguments, same results) with the fast paths above."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._graphs: dict[tuple, Any] = {}  # input signature -> its traced train step
        self._shapes = [tuple(int(d) for d in w.shape) for w in self.model.weights]
        self._flat = all(w.dtype == "float32" for w in self.model.weights)
        self._flat_read = tf.function(self._read_flat, autograph=False)
        self._step_and_read = tf.function(
            lambda tensors: (self._train_step_impl(tensors), self._read_flat()),
            autograph=False)
        self._stepped: tf.Tensor | None = None  # the weights the last step left
        self._snapshot: tuple[tf.Tensor, int] | None = None  # ... with their version

    def _read_flat(self) -> tf.Tensor:
        """All of ``model.weights`` as one float32 vector [num_params], in their order."""
        if not self._flat:
            return tf.zeros([0])
        return tf.concat([tf.reshape(w, [-1]) for w in self.model.weights], axis=0)

    def run_train_step(self, tensors: dict[str, tf.Tensor]) -> tf.Tensor:
        # final_obs has one row per truncated step: one graph serves any number of rows.
        signature = tuple((k, (None, *v.shape[1:]) if k == "final_obs" else tuple(v.shape),
                           v.dtype) for k, v in tensors.items())
        step = self._graphs.get(signature)
        if step is None:
            specs = {k: tf.TensorSpec(shape, dtype) for k, shape, dtype in signature}
            step = self._graphs[signature] = self._step_and_read.get_concrete_function(specs)
        packed, self._stepped = step(tensors)
        return packed

    def count_update(self, stats: dict[str, float]) -> bool:
        landed = super().count_update(stats)
        # Only a step of run_train_step leaves weights read after it (not the towers').
        stepped, self._stepped = self._stepped, None
        self._snapshot = (stepped, self.version) if stepped is not None and self._flat else None
        return landed

    def get_weights(self) -> tuple[list[np.ndarray], int]:
        snapshot = self._snapshot  # one read: a step in flight leaves the last one valid
        if snapshot is not None and snapshot[1] == self.version:
            return self._split(snapshot[0].numpy()), snapshot[1]
        return super().get_weights()

    def set_weights(self, weights: list[np.ndarray], version: int | None = None) -> None:
        self._snapshot = None
        super().set_weights(weights, version)

    def read_weights(self) -> list[np.ndarray]:
        if not self._flat:
            return super().read_weights()
        return self._split(self._flat_read().numpy())

    def _split(self, flat: np.ndarray) -> list[np.ndarray]:
        out, offset = [], 0
        for shape in self._shapes:
            size = int(np.prod(shape, dtype=np.int64))
            out.append(flat[offset: offset + size].reshape(shape))
            offset += size
        return out
