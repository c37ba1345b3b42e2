"""`MeanAndFreeLogStd`: the Keras policy head of a Gaussian policy whose log-std is free.

With ``ModelSpec.free_log_std`` (the default for a ``Box`` action space) the head computes the
D means, and one learned vector ``log_std`` [D] fills the other half of the distribution's
inputs [N, 2D]. Its weights, in the numpy model's order (`NumpyModel._policy_inputs`):
``kernel [H, D], bias [D], log_std [D]``. Only `keras_model` imports this module.
"""

from __future__ import annotations

from typing import Any

import keras

__all__ = ["MeanAndFreeLogStd"]


class MeanAndFreeLogStd(keras.layers.Layer):
    """features [N, H] -> inputs [N, 2D] = (features @ kernel + bias, log_std broadcast).

    Args:
      units: D, the number of means (the Box's flattened size).
      kernel_initializer: the kernel's initializer (the bias and log_std start at zeros).
    """

    def __init__(self, units: int, kernel_initializer: Any = "glorot_uniform",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.units = int(units)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def build(self, input_shape: Any) -> None:
        self.kernel = self.add_weight(shape=(int(input_shape[-1]), self.units), name="kernel",
                                      initializer=self.kernel_initializer)
        self.bias = self.add_weight(shape=(self.units,), name="bias", initializer="zeros")
        self.log_std = self.add_weight(shape=(self.units,), name="log_std",
                                       initializer="zeros")

    def call(self, features: Any) -> Any:
        mean = keras.ops.matmul(features, self.kernel) + self.bias
        return keras.ops.concatenate([mean, keras.ops.zeros_like(mean) + self.log_std], axis=-1)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return (*input_shape[:-1], 2 * self.units)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "units": self.units,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer)}
