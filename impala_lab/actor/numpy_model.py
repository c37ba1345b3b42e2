"""`NumpyModel`: the policy/value network's forward pass in numpy, for the actors.

It builds the network a `impala_lab.model_spec.ModelSpec` describes (that module's docstring
has the layers, the weight order and the initialisation) for an env's spaces;
`impala_lab.learner.keras_model.build_keras_model` builds the same network in Keras for the
learner, from the same spec, with the same weights. The layers' numpy math is in
`impala_lab.actor.layers`; what the policy head's outputs mean (logits of a Discrete space)
and how actions are drawn from them is the action distribution's
(`impala_lab.actor.distributions`).

The forward pass fuses a separate value trunk with the policy's into one network of twice
the width (the first layer's kernels side by side, later kernels block-diagonal), so the
actors still run one gemm per layer. `NumpyModel.step` is one time step of a recurrent model,
`NumpyModel.unroll` a [T, B] sequence with the resets at episode ends.

Actor processes import this module; it must never import TensorFlow or Keras (a test holds
that).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from impala_lab import model_spec
from impala_lab.actor.distributions import pick_distribution
from impala_lab.actor.layers import (
    conv_out,
    forward_trunk,
    fuse_after_flatten,
    fuse_pair,
    lstm_step,
    orthogonal,
)
from impala_lab.model_spec import OBS_NORM_CLIP, OBS_NORM_EPSILON, ModelSpec

__all__ = ["CONV_LAYERS", "HIDDEN_GAIN", "LSTM_GAIN", "POLICY_GAIN", "VALUE_GAIN",
           "NumpyModel", "check_spaces"]

# (filters, kernel, stride) of the small CNN's conv layers for images of at least 20x20,
# 'valid' padding (`impala_lab.model_spec` picks the layers for smaller images).
CONV_LAYERS: tuple[tuple[int, int, int], ...] = model_spec.ATARI_FILTERS

_SUPPORTED_OBS = "supported: Box observations of rank 1 (MLP) or rank 3 (HxWxC images, CNN)"
# Orthogonal-init gains: hidden and conv layers, the policy head (a near-uniform first
# policy), the value head, the LSTM's kernels.
HIDDEN_GAIN = math.sqrt(2.0)
POLICY_GAIN = 0.01
VALUE_GAIN = 1.0
LSTM_GAIN = 1.0
# The last conv of each residual block starts at zero, so each block starts as the identity
# (Goyal et al. 2017; Fixup): with sqrt(2) there too, six blocks in a row blew the first
# values up to about 19 on MinAtar's images.
RESIDUAL_GAIN = 0.0
_UINT8_SCALE = np.float32(1.0 / 255.0)


def check_spaces(observation_space: Any, action_space: Any,
                 conv_filters: Sequence[Sequence[int]] | None = None) -> str:
    """Checks that the spaces are supported and says which network they get.

    Args:
      observation_space: a gymnasium space; Box of rank 1 (vector) or rank 3 (HxWxC image).
      action_space: a gymnasium space with an action distribution
        (`impala_lab.actor.distributions.pick_distribution`: Discrete(n) starting at 0).
      conv_filters: the small CNN's layers (filters, kernel, stride) the image must fit;
        None: the layers `model_spec.default_conv_filters` picks for its size.

    Returns:
      ``"mlp"`` for rank-1 observations, ``"cnn"`` for rank-3 observations.

    Raises:
      ValueError: the space is not supported; the message names it and what is supported
        (a `ConfigError` for the action space).
    """
    pick_distribution(action_space)
    if not isinstance(observation_space, spaces.Box):
        raise ValueError(
            f"observation space {observation_space} is not supported: {_SUPPORTED_OBS}; "
            "wrap the env with gymnasium.wrappers.FlattenObservation to turn Discrete, "
            "Dict or Tuple observations into a rank-1 Box"
        )
    shape = tuple(observation_space.shape)
    if len(shape) == 1:
        return "mlp"
    if len(shape) == 3:
        height, width, _ = shape
        layers = (tuple(tuple(f) for f in conv_filters) if conv_filters is not None
                  else model_spec.default_conv_filters(height, width))
        need = model_spec.min_image_size(layers)
        if height < need or width < need:
            raise ValueError(
                f"observation space {observation_space} is not supported: images must be at "
                f"least {need}x{need} (HxWxC) for the CNN's conv layers {layers}; resize "
                "with gymnasium.wrappers.ResizeObservation, or choose smaller conv_filters"
            )
        return "cnn"
    raise ValueError(
        f"observation space {observation_space} with shape {shape} (rank {len(shape)}) is not "
        f"supported: {_SUPPORTED_OBS}; flatten it with gymnasium.wrappers.FlattenObservation, "
        "or give images a channel axis"
    )


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

    `__call__` reuses no output buffers, but is meant for one thread at a time (like an
    actor's env loop).

    Args:
      observation_space: a Box of rank 1 or 3 (`check_spaces`).
      action_space: a space with an action distribution (``self.distribution``).
      spec: the architecture; the default is ``ModelSpec()`` (two tanh layers of 64).

    Raises:
      ValueError: unsupported spaces (naming the space and what is supported).
    """

    def __init__(self, observation_space: Any, action_space: Any,
                 spec: ModelSpec | None = None) -> None:
        spec = ModelSpec() if spec is None else spec
        if not isinstance(spec, ModelSpec):
            raise TypeError(f"spec={spec!r} must be a ModelSpec, e.g. ModelSpec(hiddens=(64, 64))")
        self.spec = spec
        self.conv_net = spec.conv_net
        self.impala_channels = spec.impala_channels
        kind = check_spaces(observation_space, action_space,
                            spec.conv_filters if spec.conv_net == "cnn" else None)
        self.kind = "impala" if kind == "cnn" and spec.conv_net == "impala" else kind
        self.conv_filters: tuple[tuple[int, int, int], ...] = (
            spec.small_cnn_filters(observation_space.shape) if kind == "cnn" else ())
        self.hiddens = spec.hiddens
        self.use_lstm = spec.use_lstm
        self.lstm_cell_size = spec.lstm_cell_size if spec.use_lstm else 0
        # Without hidden layers (an MLP with hiddens=()) both heads read the input: one trunk.
        # A recurrent model has one core (trunk and LSTM) under both heads.
        self.separate_value_trunk = not spec.vf_share_layers and not self.use_lstm and (
            self.kind != "mlp" or bool(self.hiddens))
        self.obs_shape: tuple[int, ...] = tuple(int(d) for d in observation_space.shape)
        self.obs_dtype = np.dtype(observation_space.dtype)
        #: the action distribution the policy head parameterises (numpy side)
        self.distribution = pick_distribution(action_space)
        #: width A of the distribution's inputs (a Discrete space's action count; 2D for a Box)
        self.num_actions = self.distribution.inputs_size(action_space)
        #: a free log-std vector appended to the head's output (`ModelSpec.free_log_std`)
        self.free_log_std = bool(spec.free_log_std and self.distribution.has_log_std)
        #: units the policy head computes: A, or the D means when the log-std is free
        self.head_units = self.num_actions // 2 if self.free_log_std else self.num_actions
        self._log_std: np.ndarray | None = None
        #: the obs_filter weights (mean, var, count) lead the weights (`ModelSpec.normalize_obs`)
        self.normalize_obs = bool(spec.normalize_obs)
        if self.normalize_obs and self.kind != "mlp":
            raise ValueError(
                f"normalize_obs=True needs vector observations, but this env's are images "
                f"{tuple(observation_space.shape)} (already scaled to [0, 1] inside the "
                "network): set normalize_obs=False")
        self._obs_shift: np.ndarray | None = None  # the running mean, and 1 / std
        self._obs_scale: np.ndarray | None = None
        self._scale_uint8 = self.obs_dtype == np.uint8  # bool images are read as 0.0/1.0
        self._shapes, self._gains = self._layout()
        self._weights: list[np.ndarray] | None = None

    def _layout(self) -> tuple[list[tuple[int, ...]], list[float]]:
        """Weight shapes in get_weights() order, and each kernel's init gain."""
        shapes: list[tuple[int, ...]] = []
        gains: list[float] = []
        if self.normalize_obs:  # obs_filter/mean [D], /var [D], /count [1]
            shapes += [self.obs_shape, self.obs_shape, (1,)]
            gains += [0.0, 0.0, 0.0]
        copies = 2 if self.separate_value_trunk else 1  # each layer, then its value twin
        if self.kind == "cnn":
            height, width, channels = self.obs_shape
            for filters, kernel, stride in self.conv_filters:
                shapes += [(kernel, kernel, channels, filters), (filters,)] * copies
                gains += [HIDDEN_GAIN, 0.0] * copies
                height, width = conv_out(height, kernel, stride), conv_out(width, kernel, stride)
                channels = filters
            features = height * width * channels
        elif self.kind == "impala":
            for c_in, c_out in zip((self.obs_shape[-1], *self.impala_channels),
                                   self.impala_channels):
                shapes += [(3, 3, c_in, c_out), (c_out,)] * copies
                gains += [HIDDEN_GAIN, 0.0] * copies
                for _ in range(model_spec.RESIDUAL_BLOCKS):
                    shapes += [(3, 3, c_out, c_out), (c_out,)] * copies * 2
                    gains += [HIDDEN_GAIN, 0.0] * copies + [RESIDUAL_GAIN, 0.0] * copies
            height, width, channels = model_spec.impala_shapes(
                self.obs_shape, self.impala_channels)[-1]
            features = height * width * channels
        else:
            features = self.obs_shape[0]
        for size in self.hiddens:
            shapes += [(features, size), (size,)] * copies
            gains += [HIDDEN_GAIN, 0.0] * copies
            features = size
        if self.use_lstm:
            cell = self.lstm_cell_size
            shapes += [(features, 4 * cell), (cell, 4 * cell), (4 * cell,)]
            gains += [LSTM_GAIN, LSTM_GAIN, 0.0]
            features = cell
        shapes += [(features, self.head_units), (self.head_units,)]
        gains += [POLICY_GAIN, 0.0]
        if self.free_log_std:
            shapes.append((self.head_units,))  # logits_head/log_std, zeros: std 1
            gains.append(0.0)
        shapes += [(features, 1), (1,)]
        gains += [VALUE_GAIN, 0.0]
        return shapes, gains

    def weight_shapes(self) -> list[tuple[int, ...]]:
        """The shape of every weight array, in `keras_model.get_weights()` order."""
        return list(self._shapes)

    def initial_weights(self, seed: int | None) -> list[np.ndarray]:
        """Fresh weights: orthogonal kernels (gains sqrt(2) hidden, 0.01 policy, 1.0 value),
        zero biases; float32, in `weight_shapes()` order. The same seed gives the same weights.
        """
        rng = np.random.default_rng(seed)
        weights = []
        for shape, gain in zip(self._shapes, self._gains, strict=True):
            if len(shape) == 1:
                weights.append(np.zeros(shape, dtype=np.float32))
            else:
                weights.append(orthogonal(rng, shape, gain))
        if self.use_lstm:  # forget-gate bias 1 (Keras's unit_forget_bias)
            cell = self.lstm_cell_size
            weights[-5 - self.free_log_std][cell: 2 * cell] = 1.0
        if self.normalize_obs:  # variance 1: the identity until the learner sees data
            weights[1][:] = 1.0
        return weights

    def initial_state(self, n: int) -> np.ndarray:
        """The state of ``n`` envs at an episode's start: float32 zeros [n, 2, C] (h, c)."""
        return np.zeros((n, 2, self.lstm_cell_size), np.float32)

    def set_weights(self, weights: Sequence[np.ndarray]) -> None:
        """Loads weights in `weight_shapes()` order (e.g. the learner's broadcast).

        Raises:
          ValueError: wrong number of arrays or a wrong shape (the message names the index,
            both shapes and the network the shapes belong to).
        """
        arrays = self._checked_weights(weights)
        self._weights = arrays
        if self.normalize_obs:
            mean, var = arrays[0], arrays[1]
            self._obs_shift = mean
            self._obs_scale = (1.0 / np.sqrt(var + OBS_NORM_EPSILON)).astype(np.float32)
            arrays = arrays[3:]
        heads = 4 + self.free_log_std  # [policy kernel, bias, (log_std), value kernel, bias]
        trunk_end = len(arrays) - heads - (3 if self.use_lstm else 0)
        # kernel [F, 4C], recurrent kernel [C, 4C], bias [4C].
        self._lstm = tuple(arrays[trunk_end: trunk_end + 3]) if self.use_lstm else None
        # (kernel, bias) of each layer as one trunk would hold them.
        layers = [(arrays[i], arrays[i + 1]) for i in range(0, trunk_end, 2)]
        # The policy's own path, for `logits` (the actors' per-step forward needs no value).
        pi_layers = layers[0::2] if self.separate_value_trunk else layers
        self._pi_conv = self._conv_layers(pi_layers)
        self._pi_dense = pi_layers[len(self._pi_conv):]
        pw, pb, vw, vb = arrays[-heads], arrays[-heads + 1], arrays[-2], arrays[-1]
        self._log_std = arrays[-3] if self.free_log_std else None
        self._pi_head = (pw, pb)
        self._install_fused(layers, pw, pb, vw, vb)

    def _checked_weights(self, weights: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``weights`` as contiguous float32 arrays, each checked against its shape."""
        network = (f"this {self.kind} network (obs {self.obs_shape}, {self.num_actions} "
                   f"actions, hiddens {self.hiddens})")
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

    def _install_fused(self, layers: list[tuple[np.ndarray, np.ndarray]], pw: np.ndarray,
                       pb: np.ndarray, vw: np.ndarray, vb: np.ndarray) -> None:
        """The fused network `__call__` and `step` run: a separate value trunk is fused in
        (each layer and its value twin become one layer of twice the width), and both heads
        become one gemm [H, A + 1], logits in the first A columns (with two trunks the
        logits read the policy half of the features and the value the other half); A is
        ``head_units`` (the means alone when the log-std is free)."""
        if self.separate_value_trunk:
            layers = [fuse_pair(layers[i], layers[i + 1], first=i == 0)
                      for i in range(0, len(layers), 2)]
            top = np.concatenate([pw, np.zeros_like(vw)], axis=1)
            bottom = np.concatenate([np.zeros_like(pw), vw], axis=1)
            head_w = np.concatenate([top, bottom], axis=0)
        else:
            head_w = np.concatenate([pw, vw], axis=1)
        self._conv = self._conv_layers(layers)
        self._dense = layers[len(self._conv):]
        if self.separate_value_trunk and self._conv:
            # The layer after the convs reads the flattened (h, w, [policy C | value C]) map.
            channels = (self.conv_filters[-1][0] if self.kind == "cnn"
                        else self.impala_channels[-1])
            if self._dense:
                kernel, bias = self._dense[0]
                self._dense[0] = (fuse_after_flatten(kernel, channels), bias)
            else:
                head_w = fuse_after_flatten(head_w, channels)
        self._head_w = np.ascontiguousarray(head_w)
        self._head_b = np.concatenate([pb, vb])

    def _conv_layers(self, layers: list[tuple[np.ndarray, np.ndarray]]) -> list[tuple]:
        """The conv layers among ``layers``: (kernel [kh*kw*C, F], bias, size, stride) for the
        small CNN, (kernel [9*C, F], bias) for the IMPALA network's."""
        # [kh, kw, C, F] -> [kh*kw*C, F], rows in the (kh, kw, C) order of the patches.
        if self.kind == "cnn":
            return [(kernel.reshape(-1, kernel.shape[-1]), bias, size, stride)
                    for (kernel, bias), (_, size, stride)
                    in zip(layers, self.conv_filters, strict=False)]
        if self.kind == "impala":
            count = len(self.impala_channels) * (1 + 2 * model_spec.RESIDUAL_BLOCKS)
            return [(kernel.reshape(-1, kernel.shape[-1]), bias)
                    for kernel, bias in layers[:count]]
        return []

    def get_weights(self) -> list[np.ndarray]:
        """Copies of the loaded weights, in `weight_shapes()` order."""
        if self._weights is None:
            raise RuntimeError(
                "NumpyModel has no weights yet: call set_weights(...) first, e.g. "
                "model.set_weights(model.initial_weights(seed))"
            )
        return [w.copy() for w in self._weights]

    def __call__(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Forward pass.

        Args:
          obs: An array of shape [N, *obs_shape] (uint8 images are scaled by 1/255).

        Returns:
          (logits, values): float32 arrays of shape [N, A] and [N]; both are views into
          one fresh [N, A + 1] array (the heads share a gemm), never into obs or weights.

        Raises:
          RuntimeError: the model is recurrent (it needs its state: use `step`).
        """
        self._check_feed_forward("__call__")
        x = self._features(self._input(obs), self._conv, self._dense)
        out = x @ self._head_w
        out += self._head_b
        return self._policy_inputs(out[:, : self.head_units]), out[:, self.head_units]

    def _policy_inputs(self, head: np.ndarray) -> np.ndarray:
        """The distribution's inputs [N, A] from the policy head's output [N, head_units]:
        the head itself, or the means with the free log-std appended to every row."""
        if self._log_std is None:
            return head
        return np.concatenate([head, np.broadcast_to(self._log_std, head.shape)], axis=1)

    def logits(self, obs: np.ndarray) -> np.ndarray:
        """The policy's logits alone: float32 [N, A], equal to ``self(obs)[0]``.

        With a value trunk of its own this runs only the policy's half of the network (an
        actor needs values only for the rare truncated step), as fast as a shared trunk.
        """
        self._check_feed_forward("logits")
        x = self._features(self._input(obs), self._pi_conv, self._pi_dense)
        kernel, bias = self._pi_head
        out = x @ kernel
        out += bias
        return self._policy_inputs(out)

    def _check_feed_forward(self, method: str) -> None:
        if self.use_lstm:
            raise RuntimeError(
                f"NumpyModel.{method} needs no state, but this model is recurrent "
                "(use_lstm=True): call step(obs, state) with state [N, 2, C], e.g. "
                "model.initial_state(N) at an episode's start")

    def step(self, obs: np.ndarray, state: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One time step of the recurrent model (``use_lstm=True``).

        Args:
          obs: An array of shape [N, *obs_shape].
          state: float32 [N, 2, C], each env's (h, c) before this step; never written to.

        Returns:
          (logits, values, next_state): float32 [N, A], [N] and a fresh [N, 2, C].
        """
        if not self.use_lstm:
            raise RuntimeError("NumpyModel.step is for a recurrent model (use_lstm=True); "
                               "call model(obs) or model.logits(obs) on this one")
        x = self._features(self._input(obs), self._conv, self._dense)
        if state.shape != (x.shape[0], 2, self.lstm_cell_size):
            raise ValueError(
                f"state has shape {state.shape} but {x.shape[0]} observations with "
                f"lstm_cell_size={self.lstm_cell_size} need [N, 2, C] = "
                f"[{x.shape[0]}, 2, {self.lstm_cell_size}]")
        next_state = lstm_step(x, state, *self._lstm)
        out = next_state[:, 0] @ self._head_w
        out += self._head_b
        return (self._policy_inputs(out[:, : self.head_units]), out[:, self.head_units],
                next_state)

    def unroll(self, obs: np.ndarray, state_in: np.ndarray, dones: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The recurrent model over a time-major sequence, reset where an episode ended.

        The state is zeroed before step t wherever ``dones[t - 1]`` (the actor resets an env's
        state when its episode ends), and after the last step where ``dones[T - 1]``.

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
        if self._weights is None:
            raise RuntimeError(
                "NumpyModel has no weights yet: call set_weights(...) first, e.g. "
                "model.set_weights(model.initial_weights(seed))"
            )
        if obs.shape[1:] != self.obs_shape:
            raise ValueError(
                f"obs has shape {obs.shape} but this model expects [N, *obs_shape] = "
                f"[N, {', '.join(map(str, self.obs_shape))}]; add a batch axis for one "
                "observation (obs[None])"
            )
        if self._scale_uint8:
            x = obs.astype(np.float32)
            x *= _UINT8_SCALE
            return x
        if self._obs_scale is not None:  # fresh array: the caller's obs stay as they were
            x = np.subtract(obs, self._obs_shift, dtype=np.float32)
            x *= self._obs_scale
            return np.clip(x, -OBS_NORM_CLIP, OBS_NORM_CLIP, out=x)
        return obs if obs.dtype == np.float32 else obs.astype(np.float32)

    def _features(self, x: np.ndarray, conv: list[tuple], dense: list[tuple]) -> np.ndarray:
        """The trunk (`layers.forward_trunk`): float32 [N, *obs_shape] -> fresh [N, F]."""
        return forward_trunk(x, self.kind, conv, dense, len(self.impala_channels))
