"""The learner's Keras network: the same network as `impala_lab.models.NumpyModel`, whose
module docstring describes both (layers, weight order, initialisation).

`build_keras_model` builds it for an env's spaces and loads `NumpyModel`'s initial weights,
so a learner and actors built with the same seed start from the same weights;
`keras_forward` runs it eagerly. Keras is imported inside the functions: importing this
module stays cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from impala_lab.models import CONV_LAYERS, HIDDEN_GAIN, POLICY_GAIN, VALUE_GAIN, NumpyModel

if TYPE_CHECKING:  # for annotations only
    import keras


def build_keras_model(
    observation_space: Any,
    action_space: Any,
    hiddens: Sequence[int] = (64, 64),
    seed: int | None = None,
    vf_share_layers: bool = False,
) -> keras.Model:
    """Builds the Keras network (the learner's) for these spaces.

    The model maps an observation batch [N, *obs_shape] to (logits [N, A], value [N]);
    its weights start as `NumpyModel(...).initial_weights(seed)`, so a learner and actors
    built with the same seed start from the same weights.

    Args:
      observation_space: a gymnasium Box of rank 1 (MLP) or rank 3 (HxWxC, CNN).
      action_space: a gymnasium Discrete.
      hiddens: sizes of the dense hidden layers (after the convs, for images).
      seed: seed of the initial weights; None draws fresh ones.
      vf_share_layers: one trunk under both heads (True) or a value trunk of its own.

    Returns:
      A functional `keras.Model` with outputs [logits, value].

    Raises:
      ValueError: unsupported spaces or hiddens.
    """
    import keras  # learner only: actors must not pay for TensorFlow

    numpy_model = NumpyModel(observation_space, action_space, hiddens, vf_share_layers)
    kind, hiddens = numpy_model.kind, numpy_model.hiddens
    input_dtype = "uint8" if numpy_model.obs_dtype == np.uint8 else "float32"
    obs = keras.Input(shape=numpy_model.obs_shape, dtype=input_dtype, name="obs")
    x = obs
    if input_dtype == "uint8":
        x = keras.layers.Rescaling(1.0 / 255.0, name="scale_uint8")(x)
    hidden_init = keras.initializers.Orthogonal(gain=HIDDEN_GAIN, seed=seed)
    features = _keras_trunk(x, kind, hiddens, hidden_init, "")
    value_features = (_keras_trunk(x, kind, hiddens, hidden_init, "value_")
                      if numpy_model.separate_value_trunk else features)
    logits = keras.layers.Dense(
        numpy_model.num_actions,
        kernel_initializer=keras.initializers.Orthogonal(gain=POLICY_GAIN, seed=seed),
        name="logits_head",
    )(features)
    value = keras.layers.Dense(
        1,
        kernel_initializer=keras.initializers.Orthogonal(gain=VALUE_GAIN, seed=seed),
        name="value_head",
    )(value_features)
    # Both outputs one layer past their heads: equal depth keeps get_weights() in
    # [..., logits_head, value_head] order (Keras orders layers by depth).
    logits = keras.layers.Identity(name="logits")(logits)
    value = keras.layers.Reshape((), name="value")(value)
    model = keras.Model(obs, [logits, value], name=f"impala_{kind}")
    model.set_weights(numpy_model.initial_weights(seed))
    return model


def _keras_trunk(x: Any, kind: str, hiddens: Sequence[int], init: Any, prefix: str) -> Any:
    """The hidden layers of one trunk on the Keras tensor ``x``: for ``"cnn"`` the convs and a
    flatten, then the dense layers; layer names start with ``prefix`` (``"value_"`` for the
    value trunk)."""
    import keras

    if kind == "cnn":
        for i, (filters, kernel, stride) in enumerate(CONV_LAYERS):
            x = keras.layers.Conv2D(
                filters,
                kernel,
                strides=stride,
                padding="valid",
                data_format="channels_last",
                activation="relu",
                kernel_initializer=init,
                name=f"{prefix}conv_{i}",
            )(x)
        x = keras.layers.Flatten(name=f"{prefix}flatten")(x)
    activation = "relu" if kind == "cnn" else "tanh"
    for i, size in enumerate(hiddens):
        x = keras.layers.Dense(
            size, activation=activation, kernel_initializer=init, name=f"{prefix}hidden_{i}",
        )(x)
    return x


def keras_forward(model: keras.Model, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eager Keras forward (for tests and notebooks; about 6 ms, never in an actor loop).

    Args:
      model: a model from `build_keras_model`.
      obs: An array of shape [N, *obs_shape].

    Returns:
      (logits, values): numpy float32 arrays of shape [N, A] and [N].
    """
    logits, values = model(obs, training=False)
    return np.asarray(logits), np.asarray(values)
