"""`TF1RMSprop`: RMSProp exactly as TensorFlow 1's ``tf.train.RMSPropOptimizer`` computes it.

RLlib's IMPALA (``opt_type="rmsprop"``: decay 0.99, momentum 0, epsilon 0.1) and the IMPALA
paper (Espeholt et al. 2018) trained with TensorFlow 1's RMSProp. Per variable ``var`` with
gradient ``g`` it keeps a mean square ``ms`` and a momentum ``mom`` and does (the
``ApplyRMSProp`` kernel, non-centered)::

    ms  <- ms + (g^2 - ms) * (1 - rho)          # = rho * ms + (1 - rho) * g^2
    mom <- momentum * mom + lr * g / sqrt(ms + epsilon)
    var <- var - mom

with ``ms`` starting at **ones** and ``mom`` at zeros. Keras's ``RMSprop`` starts its mean
square at **zeros**, which with RLlib's settings makes the first steps about
``sqrt((0.99 + 0.1) / 0.1)`` = 3.3x larger than the ones RLlib's and the paper's learning rates
were tuned for. Each update is that very kernel (``tf.raw_ops.ResourceApplyRMSProp``): TF1's
arithmetic by construction. With ``momentum == 0`` there is no momentum slot to save; the
kernel's ``mom`` goes to a buffer that is not an optimizer variable.

`SingleReplicaGradients` (mixed into `TF1RMSprop` and `Adam`) skips Keras's all-reduce of the
gradients (the multi-GPU learner sums its towers itself): with one replica it is the identity,
but Keras's is a globally registered ``tf.custom_gradient`` that kept every traced graph alive.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras
import tensorflow as tf


class SingleReplicaGradients:
    """Mixin for a Keras optimizer: no all-reduce of the gradients outside a ``tf.distribute``
    strategy (see the module docs); inside one, Keras's own runs."""

    def _all_reduce_sum_gradients(self, grads_and_vars):
        if not tf.distribute.has_strategy():
            return list(grads_and_vars)
        return super()._all_reduce_sum_gradients(grads_and_vars)


class Adam(SingleReplicaGradients, keras.optimizers.Adam):
    """``keras.optimizers.Adam`` (same arguments, variables and updates) without the leaking
    all-reduce (`SingleReplicaGradients`), and named ``"adam"`` unless told otherwise.

    Keras names unnamed optimizers ``adam``, ``adam_1``, ... (a process-wide counter), and so
    their variables, and TensorFlow keeps native memory per distinct variable name: every run
    leaked a little. With one name every run reuses the same names (checkpoints save arrays in
    order).
    """

    def __init__(self, *args, name: str = "adam", **kwargs) -> None:
        super().__init__(*args, name=name, **kwargs)


class TF1RMSprop(SingleReplicaGradients, keras.optimizers.Optimizer):
    """RMSProp with TensorFlow 1's semantics: mean square starts at ones (see the module docs).

    Args:
      learning_rate: the step size (the policy's live ``lr`` knob assigns it).
      rho: the decay of the mean square (TF1's ``decay``; RLlib's 0.99).
      momentum: RLlib's 0.0; a momentum slot exists only when it is > 0.
      epsilon: added to the mean square inside the square root (RLlib's 0.1).
      name, **kwargs: as for any Keras optimizer.

    Its variables (what a checkpoint saves): Keras's ``iterations`` and ``learning_rate``, an
    ``rms`` per trainable variable, and a ``momentum`` each when ``momentum > 0``.
    """

    def __init__(self, learning_rate: float = 0.001, rho: float = 0.9, momentum: float = 0.0,
                 epsilon: float = 1e-10, name: str = "TF1RMSprop", **kwargs) -> None:
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"rho={rho!r} is invalid: it must be in [0, 1]")
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum={momentum!r} is invalid: it must be in [0, 1]")
        if not epsilon > 0.0:
            raise ValueError(f"epsilon={epsilon!r} is invalid: it must be > 0")
        self.rho = rho
        self.momentum = momentum
        self.epsilon = epsilon

    def build(self, var_list: list) -> None:
        if self.built:
            return
        super().build(var_list)
        self._mean_squares = self.add_optimizer_variables(var_list, "rms", initializer="ones")
        self._momentums = (self.add_optimizer_variables(var_list, "momentum")
                           if self.momentum > 0 else [])
        # The kernel's mom without a momentum slot, set out of reach of Keras's variable
        # tracking and TensorFlow's checkpoint tracking.
        with tf.init_scope():  # eagerly, even when Keras builds inside a traced function
            buffers = ([] if self.momentum > 0 else
                       [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                                    name="rms_step") for v in var_list])
        object.__setattr__(self, "_step_buffers", buffers)

    def update_step(self, gradient, variable, learning_rate) -> None:
        """One TF1 RMSProp step on ``variable``: TensorFlow's ``ResourceApplyRMSProp`` kernel."""
        dtype = variable.dtype
        index = self._get_variable_index(variable)
        mom = (self._momentums if self.momentum > 0 else self._step_buffers)[index]
        tf.raw_ops.ResourceApplyRMSProp(
            var=variable.handle, ms=self._mean_squares[index].handle, mom=mom.handle,
            lr=tf.cast(learning_rate, dtype), rho=tf.constant(self.rho, dtype),
            momentum=tf.constant(self.momentum, dtype), epsilon=tf.constant(self.epsilon, dtype),
            grad=tf.cast(tf.convert_to_tensor(gradient), dtype))

    def get_config(self) -> dict:
        return {**super().get_config(), "rho": self.rho, "momentum": self.momentum,
                "epsilon": self.epsilon}
