"""`CompiledPolicy`: `VTracePolicy` with its hot calls dispatched straight to traced graphs.

On a small model TensorFlow's generic paths cost more than the work itself: a
``tf.function`` call matches its arguments against the traced signatures every time, and
``model.get_weights()`` reads one variable at a time. Here each train-step signature is traced
once (``get_concrete_function``) and its graph called directly, and one traced op reads every
weight into a flat float32 vector split into views. Both return exactly what the plain calls
return (tests hold them equal).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from impala_lab.learner.vtrace_policy import VTracePolicy

__all__ = ["CompiledPolicy"]


class CompiledPolicy(VTracePolicy):
    """A `VTracePolicy` (same arguments, same results) with the two fast paths above."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._graphs: dict[tuple, Any] = {}  # input signature -> its traced train step
        weights = self.model.weights
        self._shapes = [tuple(int(d) for d in w.shape) for w in weights]
        self._flat_read = None
        if all(w.dtype == "float32" for w in weights):
            self._flat_read = tf.function(
                lambda: tf.concat([tf.reshape(w, [-1]) for w in self.model.weights], axis=0),
                autograph=False)

    def run_train_step(self, tensors: dict[str, tf.Tensor]) -> tf.Tensor:
        # final_obs has one row per truncated step: one graph serves any number of rows.
        signature = tuple((k, (None, *v.shape[1:]) if k == "final_obs" else tuple(v.shape),
                           v.dtype) for k, v in tensors.items())
        step = self._graphs.get(signature)
        if step is None:
            specs = {k: tf.TensorSpec(shape, dtype) for k, shape, dtype in signature}
            step = self._graphs[signature] = self._train_step.get_concrete_function(specs)
        return step(tensors)

    def read_weights(self) -> list[np.ndarray]:
        if self._flat_read is None:
            return super().read_weights()
        flat = self._flat_read().numpy()
        out, offset = [], 0
        for shape in self._shapes:
            size = int(np.prod(shape, dtype=np.int64))
            out.append(flat[offset: offset + size].reshape(shape))
            offset += size
        return out
