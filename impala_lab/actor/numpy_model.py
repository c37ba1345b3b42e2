"""`NumpyModel`: the policy/value network's forward pass in numpy, for the actors.

It builds the network a `impala_lab.model_spec.ModelSpec` describes (that module's docstring
has the layers, the weight order and the initialisation) for an env's spaces; the learner's
`impala_lab.learner.keras_model.build_keras_model` builds the same network in Keras, with the
same weights. The layers' math is in `impala_lab.actor.layers`; how actions are drawn from
the policy head's outputs is the action distribution's (`impala_lab.actor.distributions`).

`logits` runs the policy's path alone (what an actor needs at every step); `__call__` adds
the value; `step` is one time step of a recurrent model, `unroll` a [T, B] sequence with the
resets at episode ends. Actor processes import this module: never TensorFlow or Keras.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from impala_lab import model_spec
from impala_lab.actor.distributions import pick_distribution
from impala_lab.actor.layers import forward_trunk, lstm_step
from impala_lab.model_spec import OBS_NORM_CLIP, OBS_NORM_EPSILON, ModelSpec, network_layout

__all__ = ["NumpyModel"]

_UINT8_SCALE = np.float32(1.0 / 255.0)


class NumpyModel:
    """The Keras network's forward pass in numpy, for actor processes.

    Usage::

        model = NumpyModel(env.observation_space, env.action_space, ModelSpec(hiddens=(64,)))
        model.set_weights(model.initial_weights(seed))   # or the learner's broadcast
        logits, values = model(obs)                      # obs [N, *obs_shape]
        actions = model.distribution.sample(logits, rng)

    A recurrent model (``spec.use_lstm``) carries its state instead::

        state = model.initial_state(N)                   # [N, 2, C] zeros
        logits, values, state = model.step(obs, state)

    Args: the env's ``observation_space`` (a Box of rank 1 or 3) and ``action_space`` (one
    with an action distribution), and the ``spec`` (default ``ModelSpec()``: two tanh layers
    of 64). Unsupported spaces raise a ValueError naming them and what is supported.
    """

    def __init__(self, observation_space: Any, action_space: Any,
                 spec: ModelSpec | None = None) -> None:
        spec = ModelSpec() if spec is None else spec
        if not isinstance(spec, ModelSpec):
            raise TypeError(f"spec={spec!r} must be a ModelSpec, e.g. ModelSpec(hiddens=(64, 64))")
        self.spec = spec
        #: what the spec builds for these spaces: trunk, heads, weight shapes and gains
        self.layout = layout = network_layout(spec, observation_space, action_space)
        #: the action distribution the policy head parameterises (numpy side)
        self.distribution = pick_distribution(action_space)
        self.num_actions = layout.num_actions
        self.free_log_std = layout.free_log_std
        self.use_lstm = layout.use_lstm
        self._log_std: np.ndarray | None = None
        self._obs_shift: np.ndarray | None = None  # the running mean, and 1 / std
        self._obs_scale: np.ndarray | None = None
        self._scale_uint8 = layout.obs_dtype == np.uint8  # bool images are read as 0.0/1.0
        self._shapes = list(layout.shapes)
        self._weights: list[np.ndarray] | None = None

    def weight_shapes(self) -> list[tuple[int, ...]]:
        """The shape of every weight array, in `keras_model.get_weights()` order."""
        return list(self._shapes)

    def initial_weights(self, seed: int | None) -> list[np.ndarray]:
        """Fresh weights in `weight_shapes()` order (`NetworkLayout.initial_weights`)."""
        return self.layout.initial_weights(seed)

    def initial_state(self, n: int) -> np.ndarray:
        """The state of ``n`` envs at an episode's start: float32 zeros [n, 2, C] (h, c)."""
        return np.zeros((n, 2, self.layout.lstm_cell_size), np.float32)

    def set_weights(self, weights: Sequence[np.ndarray]) -> None:
        """Loads weights in `weight_shapes()` order (e.g. the learner's broadcast); a
        ValueError for a wrong count or shape names the index, both shapes and the network."""
        arrays = self._checked_weights(weights)
        self._weights = arrays
        if self.layout.normalize_obs:
            mean, var = arrays[0], arrays[1]
            self._obs_shift = mean
            self._obs_scale = (1.0 / np.sqrt(var + OBS_NORM_EPSILON)).astype(np.float32)
            arrays = arrays[3:]
        heads = 4 + self.free_log_std  # [policy kernel, bias, (log_std), value kernel, bias]
        trunk_end = len(arrays) - heads - (3 if self.use_lstm else 0)
        # kernel [F, 4C], recurrent kernel [C, 4C], bias [4C].
        self._lstm = tuple(arrays[trunk_end: trunk_end + 3]) if self.use_lstm else None
        # (kernel, bias) of each layer; with a value trunk of its own every layer is followed
        # by its value twin.
        layers = [(arrays[i], arrays[i + 1]) for i in range(0, trunk_end, 2)]
        separate = self.layout.separate_value_trunk
        pi_layers = layers[0::2] if separate else layers
        v_layers = layers[1::2] if separate else layers
        self._pi_conv = self._conv_layers(pi_layers)
        self._pi_dense = pi_layers[len(self._pi_conv):]
        self._v_conv = self._conv_layers(v_layers)
        self._v_dense = v_layers[len(self._v_conv):]
        self._pi_head = (arrays[-heads], arrays[-heads + 1])
        self._log_std = arrays[-3] if self.free_log_std else None
        self._v_head = (arrays[-2], arrays[-1])

    def _checked_weights(self, weights: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``weights`` as contiguous float32 arrays, each checked against its shape."""
        layout = self.layout
        network = (f"this {layout.kind} network (obs {layout.obs_shape}, {self.num_actions} "
                   f"actions, hiddens {layout.hiddens})")
        if len(weights) != len(self._shapes):
            raise ValueError(
                f"weights has {len(weights)} arrays but {network} needs {len(self._shapes)}: "
                f"expected shapes {self._shapes}; build both models from the same spaces and "
                "ModelSpec")
        arrays = []
        for i, (w, shape) in enumerate(zip(weights, self._shapes, strict=True)):
            arr = np.ascontiguousarray(w, dtype=np.float32)
            if arr.shape != shape:
                raise ValueError(f"weights[{i}] has shape {arr.shape} but {network} expects "
                                 f"{shape}: expected shapes {self._shapes}")
            arrays.append(arr)
        return arrays

    def _conv_layers(self, layers: list[tuple[np.ndarray, np.ndarray]]) -> list[tuple]:
        """The conv layers among ``layers``: (kernel [kh*kw*C, F], bias, size, stride) for the
        small CNN, (kernel [9*C, F], bias) for the IMPALA network's."""
        # [kh, kw, C, F] -> [kh*kw*C, F], rows in the (kh, kw, C) order of the patches.
        if self.layout.kind == "cnn":
            return [(kernel.reshape(-1, kernel.shape[-1]), bias, size, stride)
                    for (kernel, bias), (_, size, stride)
                    in zip(layers, self.layout.conv_filters, strict=False)]
        if self.layout.kind == "impala":
            count = len(self.layout.impala_channels) * (1 + 2 * model_spec.RESIDUAL_BLOCKS)
            return [(kernel.reshape(-1, kernel.shape[-1]), bias)
                    for kernel, bias in layers[:count]]
        return []

    def get_weights(self) -> list[np.ndarray]:
        """Copies of the loaded weights, in `weight_shapes()` order."""
        self._check_weights()
        return [w.copy() for w in self._weights]

    def __call__(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Forward pass: obs [N, *obs_shape] (uint8 images scaled by 1/255) -> (logits,
        values), fresh float32 [N, A] and [N]; a RuntimeError for a recurrent model (use
        `step`)."""
        self._check_feed_forward("__call__")
        x = self._input(obs)
        features = self._features(x, self._pi_conv, self._pi_dense)
        value_features = (self._features(x, self._v_conv, self._v_dense)
                          if self.layout.separate_value_trunk else features)
        return self._heads(features, value_features)

    def _heads(self, features: np.ndarray, value_features: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """(the distribution's inputs [N, A], values [N]) from the trunks' features."""
        v_kernel, v_bias = self._v_head
        values = value_features @ v_kernel[:, 0]
        values += v_bias[0]
        return self._policy_inputs(features), values

    def _policy_inputs(self, features: np.ndarray) -> np.ndarray:
        """The distribution's inputs [N, A] from the policy trunk's features: the head's
        output, or its means with the free log-std appended to every row."""
        kernel, bias = self._pi_head
        head = features @ kernel
        head += bias
        if self._log_std is None:
            return head
        return np.concatenate([head, np.broadcast_to(self._log_std, head.shape)], axis=1)

    def logits(self, obs: np.ndarray) -> np.ndarray:
        """The policy's logits alone: float32 [N, A], equal to ``self(obs)[0]`` (an actor
        needs values only at the rare truncated step)."""
        self._check_feed_forward("logits")
        return self._policy_inputs(self._features(self._input(obs), self._pi_conv,
                                                  self._pi_dense))

    def _check_feed_forward(self, method: str) -> None:
        if self.use_lstm:
            raise RuntimeError(
                f"NumpyModel.{method} needs no state, but this model is recurrent "
                "(use_lstm=True): call step(obs, state) with state [N, 2, C], e.g. "
                "model.initial_state(N) at an episode's start")

    def step(self, obs: np.ndarray, state: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One time step of the recurrent model (``use_lstm=True``): obs [N, *obs_shape]
        and state float32 [N, 2, C], each env's (h, c) before this step (never written to),
        -> (logits, values, next_state): float32 [N, A], [N] and a fresh [N, 2, C]."""
        if not self.use_lstm:
            raise RuntimeError("NumpyModel.step is for a recurrent model (use_lstm=True); "
                               "call model(obs) or model.logits(obs) on this one")
        x = self._features(self._input(obs), self._pi_conv, self._pi_dense)
        cell = self.layout.lstm_cell_size
        if state.shape != (x.shape[0], 2, cell):
            raise ValueError(
                f"state has shape {state.shape} but {x.shape[0]} observations with "
                f"lstm_cell_size={cell} need [N, 2, C] = [{x.shape[0]}, 2, {cell}]")
        next_state = lstm_step(x, state, *self._lstm)
        h = next_state[:, 0]
        return (*self._heads(h, h), next_state)

    def unroll(self, obs: np.ndarray, state_in: np.ndarray, dones: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The recurrent model over a time-major sequence, the state zeroed before step t
        wherever ``dones[t - 1]`` (as the actor does) and after the last step.

        Args:
          obs: [T, B, *obs_shape].
          state_in: float32 [B, 2, C], the state before step 0 (a batch's ``state_in``).
          dones: bool [T, B], the episode ended at this step (terminated or truncated).

        Returns:
          (logits, values, state_out): float32 [T, B, A], [T, B] and [B, 2, C], the state
          after the last step (what the next unroll starts from).
        """
        T, B = dones.shape
        logits = np.empty((T, B, self.num_actions), np.float32)
        values = np.empty((T, B), np.float32)
        state = state_in
        for t in range(T):
            logits[t], values[t], state = self.step(obs[t], state)
            state[dones[t]] = 0.0
        return logits, values, state

    def _input(self, obs: np.ndarray) -> np.ndarray:
        """obs [N, *obs_shape] as float32 (uint8 scaled by 1/255), after the checks."""
        self._check_weights()
        if obs.shape[1:] != self.layout.obs_shape:
            raise ValueError(
                f"obs has shape {obs.shape} but this model expects [N, *obs_shape] = "
                f"[N, {', '.join(map(str, self.layout.obs_shape))}]; add a batch axis for "
                "one observation (obs[None])")
        if self._scale_uint8:
            x = obs.astype(np.float32)
            x *= _UINT8_SCALE
            return x
        if self._obs_scale is not None:  # fresh array: the caller's obs stay as they were
            x = np.subtract(obs, self._obs_shift, dtype=np.float32)
            x *= self._obs_scale
            return np.clip(x, -OBS_NORM_CLIP, OBS_NORM_CLIP, out=x)
        return obs if obs.dtype == np.float32 else obs.astype(np.float32)

    def _check_weights(self) -> None:
        if self._weights is None:
            raise RuntimeError("NumpyModel has no weights yet: call set_weights(...) first, "
                               "e.g. model.set_weights(model.initial_weights(seed))")

    def _features(self, x: np.ndarray, conv: list[tuple], dense: list[tuple]) -> np.ndarray:
        """The trunk (`layers.forward_trunk`): float32 [N, *obs_shape] -> fresh [N, F]."""
        return forward_trunk(x, self.layout.kind, conv, dense, len(self.layout.impala_channels))
