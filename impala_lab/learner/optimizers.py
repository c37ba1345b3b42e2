"""`TF1RMSprop`: RMSProp exactly as TensorFlow 1's ``tf.train.RMSPropOptimizer`` computes it.

RLlib's IMPALA (``opt_type="rmsprop"``: decay 0.99, momentum 0, epsilon 0.1) and the IMPALA
paper (Espeholt et al. 2018) trained with TensorFlow 1's RMSProp. Per variable ``var`` with
gradient ``g`` it keeps a mean square ``ms`` and a momentum ``mom`` and does (the
``ApplyRMSProp`` kernel, non-centered)::

    ms  <- ms + (g^2 - ms) * (1 - rho)          # = rho * ms + (1 - rho) * g^2
    mom <- momentum * mom + lr * g / sqrt(ms + epsilon)
    var <- var - mom

with ``ms`` starting at **ones** and ``mom`` at zeros.

Keras's ``keras.optimizers.RMSprop`` starts its mean square (``velocity``) at **zeros**. With
RLlib's settings and small gradients the first step is then about
``sqrt((0.99 + 0.1) / 0.1)`` = 3.3x larger than TF1's: the early updates are larger than the
ones that RLlib's and the paper's learning rates were tuned for. With ``ms`` starting at one,
the first steps are about ``lr * g``, and the average only comes to the gradients' scale over
about ``1 / (1 - rho)`` = 100 steps.

Only the momentum slot is skipped when ``momentum == 0`` (TF1 always kept one): ``mom`` is then
the step itself and the update is the same, with fewer variables to save.

Each variable's update is that very kernel (``tf.raw_ops.ResourceApplyRMSProp``, TensorFlow 1's
own): TF1's arithmetic by construction, in one op. With ``momentum == 0`` the kernel still
writes a ``mom``: it goes to a buffer that is not an optimizer variable (nothing to save: it
only ever holds the last step).

`SingleReplicaGradients` (mixed into `TF1RMSprop` and `Adam`, the policy's two optimizers)
skips Keras's all-reduce of the gradients where no ``tf.distribute`` strategy is in effect (as
everywhere in impala_lab: the multi-GPU learner sums its towers' gradients itself). Keras calls
``ReplicaContext.all_reduce`` in every traced update; with one replica it returns the
gradients unchanged, but it is a ``tf.custom_gradient``, whose gradient function TensorFlow
registers globally and never releases in graph mode: each traced train step's graph then
stays alive after its run is gone (`tests/test_worker_faults.py` has the test).
`Adam` also keeps one name across runs (see there).
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras
import tensorflow as tf


class SingleReplicaGradients:
    """Mixin for a Keras optimizer (TensorFlow backend): no all-reduce of the gradients outside
    a ``tf.distribute`` strategy, where it is the identity but leaks the traced graph (see the
    module docs). Inside a strategy, Keras's own all-reduce runs as before."""

    def _all_reduce_sum_gradients(self, grads_and_vars):
        if not tf.distribute.has_strategy():
            return list(grads_and_vars)
        return super()._all_reduce_sum_gradients(grads_and_vars)


class Adam(SingleReplicaGradients, keras.optimizers.Adam):
    """``keras.optimizers.Adam`` (same arguments, variables and updates) without the leaking
    all-reduce (`SingleReplicaGradients`), and named ``"adam"`` unless told otherwise.

    Keras names an optimizer built without a name ``adam``, ``adam_1``, ``adam_2``, ... (a
    process-wide counter), and so its variables (``adam_7/hidden_0_kernel_momentum``); the
    TensorFlow runtime keeps native memory per distinct variable name it has seen, so every
    run built leaked a little. One fixed name: the variables of every run reuse the same names
    (nothing requires them unique; checkpoints save the arrays in order).
    """

    def __init__(self, *args, name: str = "adam", **kwargs) -> None:
        super().__init__(*args, name=name, **kwargs)


class TF1RMSprop(SingleReplicaGradients, keras.optimizers.Optimizer):
    """RMSProp with TensorFlow 1's semantics: mean square starts at ones (see the module docs).

    Args:
      learning_rate: the step size ``lr`` (a float, a schedule or a variable; the policy's
        live ``lr`` knob assigns ``optimizer.learning_rate``).
      rho: the decay of the mean square (TF1's ``decay``; RLlib's 0.99).
      momentum: the momentum (RLlib's 0.0); a momentum slot exists only when it is > 0.
      epsilon: added to the mean square inside the square root (RLlib's 0.1).
      name, **kwargs: as for any Keras optimizer (``clipnorm``, ``weight_decay``, ...).

    Optimizer variables (``optimizer.variables``, what a checkpoint saves): Keras's
    ``iterations`` and ``learning_rate``, one ``rms`` per trainable variable, and one
    ``momentum`` per trainable variable when ``momentum > 0``.
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
        self._momentums = []
        if self.momentum > 0:
            self._momentums = self.add_optimizer_variables(var_list, "momentum")
        # The kernel's mom when there is no momentum slot: set with object.__setattr__, out
        # of reach of Keras's variable tracking (it would become an optimizer variable) and
        # of TensorFlow's checkpoint tracking.
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
        config = super().get_config()
        config.update({"rho": self.rho, "momentum": self.momentum, "epsilon": self.epsilon})
        return config
