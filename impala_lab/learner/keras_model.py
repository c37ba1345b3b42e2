"""The learner's Keras network: the one a `impala_lab.model_spec.ModelSpec` describes (layers,
weight order, initialisation), the same as the actors' numpy model. `build_keras_model` builds
it with the layout's initial weights; `keras_forward` runs it eagerly.

A recurrent model (``use_lstm=True``) is one time step: (obs [N, *obs_shape], state_in
[N, 2, C]) -> (logits [N, A], value [N], state_out [N, 2, C]), a Keras ``LSTMCell`` "lstm" on
the trunk's "features". `lstm_unroll` runs the trunk once over all T x B observations, the
cell along T with the episode resets (as scalable_agent's ``_unroll``), the heads once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from impala_lab import model_spec
from impala_lab.model_spec import ModelSpec, NetworkLayout, network_layout

if TYPE_CHECKING:  # for annotations only
    import keras
    import tensorflow as tf


def build_keras_model(observation_space: Any, action_space: Any, spec: ModelSpec | None = None,
                      seed: int | None = None) -> keras.Model:
    """The Keras network ``spec`` (None: ``ModelSpec()``) describes for these spaces (a Box
    of rank 1 or 3; a space with an action distribution): obs [N, *obs_shape] -> [logits
    [N, A], value [N]]; a recurrent one takes [obs, state_in] and also returns state_out.

    Its weights start as `NetworkLayout.initial_weights(seed)` (None: fresh ones), so a
    learner and actors built with the same spec and seed agree. Raises ValueError for
    unsupported spaces.
    """
    import keras  # learner only: actors must not pay for TensorFlow

    layout = network_layout(ModelSpec() if spec is None else spec, observation_space,
                            action_space)
    obs = keras.Input(shape=layout.obs_shape, name="obs",
                      dtype="uint8" if layout.obs_dtype in (np.uint8, np.bool_)
                      else "float32")
    hidden_init = keras.initializers.Orthogonal(gain=model_spec.HIDDEN_GAIN, seed=seed)
    x = _keras_input_scaling(obs, layout.obs_dtype)
    if layout.normalize_obs:  # first layer: its weights lead get_weights()
        from impala_lab.learner.obs_normalizer import ObsNormalizer

        x = ObsNormalizer(name="obs_filter")(x)
    features = _keras_trunk(x, layout, hidden_init, "")
    value_features = (_keras_trunk(x, layout, hidden_init, "value_")
                      if layout.separate_value_trunk else features)
    inputs: Any = obs
    if layout.use_lstm:
        cell_size = layout.lstm_cell_size
        state_in = keras.Input(shape=(2, cell_size), dtype="float32", name="state_in")
        features = keras.layers.Identity(name="features")(features)
        lstm = keras.layers.LSTMCell(cell_size, name="lstm")
        features, (h, c) = lstm(features, [state_in[:, 0], state_in[:, 1]])
        value_features = features
        inputs = [obs, state_in]
    outputs = _keras_heads(features, value_features, layout.num_actions, seed,
                           free_log_std=layout.free_log_std)
    if layout.use_lstm:
        outputs.append(keras.ops.stack([h, c], axis=1))
    name = f"impala_{layout.kind}{'_lstm' if layout.use_lstm else ''}"
    model = keras.Model(inputs, outputs, name=name)
    model.set_weights(layout.initial_weights(seed))
    return model


def _keras_input_scaling(obs: Any, obs_dtype: np.dtype) -> Any:
    """Images (uint8 frames, and bool ones that batches hold as uint8 0/1) come in as uint8:
    uint8 is scaled by 1/255, bool's 0/1 read as 0.0/1.0; floats pass as they are."""
    import keras

    if obs_dtype == np.uint8:
        return keras.layers.Rescaling(1.0 / 255.0, name="scale_uint8")(obs)
    if obs_dtype == np.bool_:
        return keras.layers.Rescaling(1.0, name="bool_to_float")(obs)
    return obs


def _keras_heads(features: Any, value_features: Any, num_outputs: int, seed: int | None,
                 free_log_std: bool = False) -> list[Any]:
    """[logits [N, A], value [N]] from the policy and value heads; with ``free_log_std`` the
    A / 2 means and a learned log-std (`policy_head.MeanAndFreeLogStd`)."""
    import keras

    policy_init = keras.initializers.Orthogonal(gain=model_spec.POLICY_GAIN, seed=seed)
    if free_log_std:
        from impala_lab.learner.policy_head import MeanAndFreeLogStd

        logits = MeanAndFreeLogStd(num_outputs // 2, kernel_initializer=policy_init,
                                   name="logits_head")(features)
    else:
        logits = keras.layers.Dense(num_outputs, kernel_initializer=policy_init,
                                    name="logits_head")(features)
    value_init = keras.initializers.Orthogonal(gain=model_spec.VALUE_GAIN, seed=seed)
    value = keras.layers.Dense(1, kernel_initializer=value_init, name="value_head")(value_features)
    # Both outputs one layer past their heads: equal depth keeps get_weights() in
    # [..., logits_head, value_head] order (Keras orders layers by depth).
    logits = keras.layers.Identity(name="logits")(logits)
    value = keras.layers.Reshape((), name="value")(value)
    return [logits, value]


def _keras_trunk(x: Any, layout: NetworkLayout, init: Any, prefix: str) -> Any:
    """One trunk's hidden layers on ``x`` (for images the conv trunk and a flatten, then the
    dense layers), named with ``prefix`` (``"value_"`` for the value trunk)."""
    import keras

    kind, hiddens = layout.kind, layout.hiddens
    if kind == "impala":
        x = _keras_impala_stacks(x, layout.impala_channels, init, prefix)
        x = keras.layers.Flatten(name=f"{prefix}flatten")(x)
    if kind == "cnn":
        for i, (filters, kernel, stride) in enumerate(layout.conv_filters):
            x = keras.layers.Conv2D(filters, kernel, strides=stride, padding="valid",
                                    data_format="channels_last", activation="relu",
                                    kernel_initializer=init, name=f"{prefix}conv_{i}")(x)
        x = keras.layers.Flatten(name=f"{prefix}flatten")(x)
    activation = "tanh" if kind == "mlp" else "relu"
    for i, size in enumerate(hiddens):
        x = keras.layers.Dense(size, activation=activation, kernel_initializer=init,
                               name=f"{prefix}hidden_{i}")(x)
    return x


def _keras_impala_stacks(x: Any, channels: Sequence[int], init: Any, prefix: str) -> Any:
    """The IMPALA network's stacks (conv, max-pool, two residual blocks) and the final relu."""
    import keras

    def conv(name: str, width: int) -> Any:
        return keras.layers.Conv2D(width, 3, padding="same", kernel_initializer=init,
                                   name=f"{prefix}{name}")

    for s, width in enumerate(channels):
        x = conv(f"stack_{s}_conv", width)(x)
        x = keras.layers.MaxPooling2D(3, strides=2, padding="same",
                                      name=f"{prefix}stack_{s}_pool")(x)
        for r in range(model_spec.RESIDUAL_BLOCKS):
            name = f"stack_{s}_res_{r}"
            y = keras.layers.ReLU(name=f"{prefix}{name}_relu_0")(x)
            y = conv(f"{name}_conv_0", width)(y)
            y = keras.layers.ReLU(name=f"{prefix}{name}_relu_1")(y)
            y = conv(f"{name}_conv_1", width)(y)
            x = keras.layers.Add(name=f"{prefix}{name}_add")([x, y])
    return keras.layers.ReLU(name=f"{prefix}stacks_relu")(x)


def keras_forward(model: keras.Model, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eager forward of a `build_keras_model` model (tests, notebooks): obs [N, *obs_shape]
    -> (logits, values), numpy float32 [N, A] and [N]."""
    logits, values = model(obs, training=False)
    return np.asarray(logits), np.asarray(values)


def trunk_model(model: keras.Model) -> keras.Model:
    """The trunk of a recurrent model from `build_keras_model`, sharing its layers: obs
    [N, *obs_shape] -> the LSTM's input features [N, F]."""
    import keras

    return keras.Model(model.inputs[0], model.get_layer("features").output,
                       name=f"{model.name}_trunk")


def lstm_unroll(model: keras.Model, trunk: keras.Model, obs: tf.Tensor, state_in: tf.Tensor,
                dones: tf.Tensor, bootstrap_obs: tf.Tensor,
                final: tuple[tf.Tensor, tf.Tensor] | None = None
                ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """A recurrent model over a [T, B] batch, the state zeroed before step t wherever
    ``dones[t - 1]`` (as the actor did), then one more step on ``bootstrap_obs`` for the
    bootstrap value.

    Args:
      model: a recurrent model from `build_keras_model`.
      trunk: `trunk_model(model)`.
      obs: [T, B, *obs_shape].
      state_in: float32 [B, 2, C], the state before step 0.
      dones: float32 [T, B], 1 where the episode ended at this step (terminated or truncated).
      bootstrap_obs: [B, *obs_shape], the observation after the last step.
      final: optional (final_obs [N, *obs_shape], index [N, 2] of (t, b)): truncated
        episodes' final observations, each stepped from the state after step t in column b.

    Returns:
      (logits [T, B, A], values [T, B], bootstrap_value [B] (then ``final``'s N values),
      state_out [B, 2, C], the state after the last step, before the bootstrap step).
    """
    import tensorflow as tf

    T, B = tf.shape(obs)[0], tf.shape(obs)[1]
    flat_obs = tf.reshape(obs, tf.concat([[T * B], tf.shape(obs)[2:]], axis=0))
    # The trunk and the input half of the gates for every step at once: one gemm each.
    extra = [] if final is None else [final[0]]
    features = trunk(tf.concat([flat_obs, bootstrap_obs, *extra], axis=0))
    lstm = model.get_layer("lstm")
    cell = lstm.units
    all_gates_x = tf.matmul(features, lstm.kernel) + lstm.bias
    gates_x = tf.reshape(all_gates_x[: (T + 1) * B], [T + 1, B, 4 * cell])
    # keep[t] = 0 where the state is zeroed before step t: where an episode ended at t - 1.
    ended = tf.cast(dones, tf.float32)[:, :, None]  # [T, B, 1]
    keep = tf.concat([tf.ones_like(ended[:1]), 1.0 - ended], axis=0)  # [T + 1, B, 1]

    def step(carry: tuple[tf.Tensor, tf.Tensor], inputs: tuple[tf.Tensor, tf.Tensor]
             ) -> tuple[tf.Tensor, tf.Tensor]:
        (h, c), (gates, keep_t) = carry, inputs
        h, c = h * keep_t, c * keep_t
        i, f, g, o = tf.split(gates + tf.matmul(h, lstm.recurrent_kernel), 4, axis=-1)
        c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
        return tf.sigmoid(o) * tf.tanh(c), c

    # A graph loop (tf.scan), not a Python one: the trace stays small for any T.
    hs, cs = tf.scan(step, (gates_x, keep), initializer=(state_in[:, 0], state_in[:, 1]))
    state_out = tf.stack([hs[T - 1], cs[T - 1]], axis=1) * keep[T][:, None]
    flat_h = tf.reshape(hs, [(T + 1) * B, cell])
    if final is not None:  # hs[t], cs[t]: the state after step t, before any reset
        state = (tf.gather_nd(hs, final[1]), tf.gather_nd(cs, final[1]))
        flat_h = tf.concat([flat_h, step(state, (all_gates_x[(T + 1) * B:], 1.0))[0]], 0)
    logits = model.get_layer("logits_head")(flat_h)
    values = tf.reshape(model.get_layer("value_head")(flat_h), [-1])
    num_actions = tf.shape(logits)[-1]
    return (tf.reshape(logits[: T * B], [T, B, num_actions]),
            tf.reshape(values[: T * B], [T, B]), values[T * B:], state_out)
