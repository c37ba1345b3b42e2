"""Policy/value networks in numpy, for actors; `impala_lab.learner.keras_model` builds the same
network
in Keras for the learner.

Three networks, chosen by the observation space (`check_spaces`) and ``conv_net``:

  * ``"mlp"`` for Box observations of rank 1: ``hiddens`` dense layers with tanh
    (RLlib's default fcnet activation; bounded features keep the value head tame);
  * ``"cnn"`` for Box observations of rank 3 (HxWxC images), the small CNN: the
    ``conv_filters`` layers ('valid' padding, NHWC; by default conv 16 8x8 stride 4, conv 32
    4x4 stride 2 for images of at least 20x20, and MinAtar's conv 16 3x3 stride 1 for smaller
    ones), flatten, then ``hiddens`` dense layers, all relu;
  * ``"impala"`` for images with ``conv_net="impala"``: the IMPALA paper's deep residual
    network (`impala_lab.conv_layout` has the layers and their shapes), then ``hiddens``
    dense layers (relu; the paper's is one of 256).

uint8 observations are scaled by 1/255 inside the network (all versions), so actors ship
raw uint8 frames; boolean images (MinAtar's) travel as uint8 0/1 and are read as 0.0/1.0.
All networks end in two heads: policy logits [N, A] (Discrete actions)
and a value [N]. With ``vf_share_layers=True`` (RLlib's model option) both heads sit on one
trunk; with ``False`` (RLlib's default, and impala_lab's) the value head has a trunk of its own
with the same layer sizes, so a value-loss spike cannot wreck the policy's features.

Weights are a ``list[np.ndarray]`` in ``keras_model.get_weights()`` order, which is also
`NumpyModel.weight_shapes()` order. With a shared trunk::

    mlp: [hidden_0/kernel [D, H0], hidden_0/bias [H0], ..., logits_head/kernel [Hk, A],
          logits_head/bias [A], value_head/kernel [Hk, 1], value_head/bias [1]]
    cnn: [conv_0/kernel [8, 8, C, 16], conv_0/bias [16], conv_1/kernel [4, 4, 16, 32],
          conv_1/bias [32], hidden_0/kernel [F, H0], ..., then the two heads as above]
    impala: for each stack s, its conv ``stack_s_conv`` [3, 3, C_in, C_s] and bias, then
          ``stack_s_res_r_conv_0`` and ``_1`` [3, 3, C_s, C_s] (and biases) of residual blocks
          r = 0, 1; then hidden_0/kernel [F, H0], ..., and the heads

With separate trunks every layer is followed by its value twin (Keras orders layers by
depth): ``[conv_0, value_conv_0, ..., hidden_0, value_hidden_0, ..., logits_head,
value_head]``, each as kernel then bias.

With ``use_lstm=True`` (RLlib's model option) an LSTM of ``lstm_cell_size`` units C sits
after the trunk and both heads read its output h (one trunk, one core: RLlib's LSTM wrapper).
Its weights come between the trunk and the heads, as Keras's ``LSTMCell`` holds them::

    ..., lstm/kernel [F, 4C], lstm/recurrent_kernel [C, 4C], lstm/bias [4C], logits_head/...

gates in Keras's order (input, forget, cell, output); the state of N envs is one float32
array [N, 2, C] (h, then c), zeros at an episode's start. `NumpyModel.step` is one time step,
`NumpyModel.unroll` a [T, B] sequence with the resets at episode ends.

The numpy forward fuses the two trunks into one network of twice the width (the first layer's
kernels side by side, later kernels block-diagonal), so the actors still run one gemm per
layer.

Initialisation (`NumpyModel.initial_weights`, also what ``keras_model.build_keras_model``
loads):
orthogonal kernels with gain sqrt(2) for hidden/conv layers, 0.01 for the policy head (a
near-uniform first policy) and 1.0 for the value head; zero biases. The IMPALA network's
residual blocks start as the identity: the last conv of each is zero. The LSTM's kernels are
orthogonal with gain 1, its bias zero but for the forget gate's 1 (Keras's
``unit_forget_bias``: the cell keeps its memory at first).

Actor processes import this module for `NumpyModel` and `sample_actions`; it must never
import TensorFlow or Keras (a test holds that).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from impala_lab import conv_layout

__all__ = [
    "CONV_LAYERS",
    "HIDDEN_GAIN",
    "POLICY_GAIN",
    "VALUE_GAIN",
    "LSTM_GAIN",
    "check_spaces",
    "NumpyModel",
    "lstm_step",
    "lstm_sequence",
    "sample_actions",
]

# (filters, kernel size, stride) of the small CNN's conv layers for images of at least 20x20,
# 'valid' padding (`impala_lab.conv_layout` picks the layers for smaller images).
CONV_LAYERS: tuple[tuple[int, int, int], ...] = conv_layout.ATARI_FILTERS

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


def _conv_out(size: int, kernel: int, stride: int) -> int:
    return (size - kernel) // stride + 1


def check_spaces(observation_space: Any, action_space: Any,
                 conv_filters: Sequence[Sequence[int]] | None = None) -> str:
    """Checks that the spaces are supported and says which network they get.

    Args:
      observation_space: a gymnasium space; Box of rank 1 (vector) or rank 3 (HxWxC image).
      action_space: a gymnasium space; Discrete(n) with start 0.
      conv_filters: the small CNN's layers (filters, kernel, stride) the image must fit;
        None: the layers `conv_layout.default_conv_filters` picks for its size.

    Returns:
      ``"mlp"`` for rank-1 observations, ``"cnn"`` for rank-3 observations.

    Raises:
      ValueError: the space is not supported; the message names it and what is supported.
    """
    if not isinstance(action_space, spaces.Discrete):
        raise ValueError(
            f"action space {action_space} is not supported: impala_lab supports Discrete "
            "action spaces (continuous Box, MultiDiscrete, MultiBinary, Dict and Tuple "
            "actions are not)"
        )
    if int(action_space.start) != 0:
        raise ValueError(
            f"action space {action_space} is not supported: impala_lab supports Discrete "
            f"action spaces starting at 0; wrap the env to map actions 0..n-1 to "
            f"{int(action_space.start)}..{int(action_space.start) + int(action_space.n) - 1}"
        )
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
                  else conv_layout.default_conv_filters(height, width))
        need = conv_layout.min_image_size(layers)
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


def _check_hiddens(hiddens: Sequence[int]) -> tuple[int, ...]:
    try:
        given = tuple(hiddens)
        out = tuple(int(h) for h in given)
    except (TypeError, ValueError):
        raise ValueError(
            f"hiddens={hiddens!r} is not supported: give a sequence of layer sizes, "
            "e.g. (64, 64), or () for none"
        ) from None
    if any(h <= 0 for h in out) or out != given:
        raise ValueError(
            f"hiddens={given!r} is not supported: every layer size must be a "
            "positive integer, e.g. (64, 64)"
        )
    return out


def _orthogonal(rng: np.random.Generator, shape: tuple[int, ...], gain: float) -> np.ndarray:
    """Orthogonal init as keras.initializers.Orthogonal does it: rows = prod(shape[:-1])."""
    rows = int(np.prod(shape[:-1]))
    cols = shape[-1]
    flat = rng.standard_normal((max(rows, cols), min(rows, cols)))
    q, r = np.linalg.qr(flat)
    q = q * np.sign(np.diag(r))  # make the decomposition unique (uniform over rotations)
    if rows < cols:
        q = q.T
    return (gain * q).reshape(shape).astype(np.float32)


def _sliding_patches(x: np.ndarray, kernel: int, stride: int) -> np.ndarray:
    """im2col for NHWC input with 'valid' padding.

    Args:
      x: A float32 array of shape [N, H, W, C].
      kernel: kernel height and width.
      stride: stride in both spatial dims.

    Returns:
      A float32 array of shape [N * Ho * Wo, kernel * kernel * C], patch entries in
      (kh, kw, C) order, matching a Keras kernel [kh, kw, C, F] reshaped to [kh*kw*C, F].
    """
    n, h, w, c = x.shape
    ho, wo = _conv_out(h, kernel, stride), _conv_out(w, kernel, stride)
    sn, sh, sw, sc = x.strides
    view = np.lib.stride_tricks.as_strided(
        x,
        shape=(n, ho, wo, kernel, kernel, c),
        strides=(sn, sh * stride, sw * stride, sh, sw, sc),
        writeable=False,
    )
    return view.reshape(n * ho * wo, kernel * kernel * c)  # copies: one gemm per layer


def _conv3x3_same(x: np.ndarray, kernel2d: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """A 3x3 stride-1 convolution with 'same' (zero) padding, as one gemm.

    Args:
      x: float32 [N, H, W, C]; never written to.
      kernel2d: float32 [9 * C, F], a Keras kernel [3, 3, C, F] reshaped.
      bias: float32 [F].

    Returns:
      A fresh float32 [N, H, W, F].
    """
    n, h, w, c = x.shape
    padded = np.zeros((n, h + 2, w + 2, c), np.float32)
    padded[:, 1:-1, 1:-1] = x
    y = _sliding_patches(padded, 3, 1) @ kernel2d
    y += bias
    return y.reshape(n, h, w, -1)


def _max_pool_same(x: np.ndarray) -> np.ndarray:
    """Max-pool 3x3 stride 2 with 'same' padding (TensorFlow's: the padding never wins).

    Args:
      x: float32 [N, H, W, C].

    Returns:
      A fresh float32 [N, ceil(H / 2), ceil(W / 2), C]: the max of the nine strided views
      of the padded map (no loop over pixels).
    """
    n, h, w, c = x.shape
    ho, wo = -(-h // 2), -(-w // 2)
    # TensorFlow pads (total // 2) before and the rest after.
    top, left = max(2 * ho + 1 - h, 0) // 2, max(2 * wo + 1 - w, 0) // 2
    padded = np.full((n, 2 * ho + 1, 2 * wo + 1, c), -np.inf, np.float32)
    padded[:, top: top + h, left: left + w] = x
    out = padded[:, 0: 2 * ho: 2, 0: 2 * wo: 2].copy()
    for i in range(3):
        for j in range(3):
            if i or j:
                np.maximum(out, padded[:, i: i + 2 * ho: 2, j: j + 2 * wo: 2], out=out)
    return out


def _impala_trunk(x: np.ndarray, convs: list[tuple[np.ndarray, np.ndarray]],
                  stacks: int) -> np.ndarray:
    """The IMPALA network's conv stacks (`impala_lab.conv_layout`), before the dense layers.

    Args:
      x: float32 [N, H, W, C]; never written to.
      convs: (kernel [9 * C_in, C_out], bias [C_out]) of the 5 * ``stacks`` convs, in weight
        order: per stack its conv, then each residual block's two convs.
      stacks: the number of stacks.

    Returns:
      A fresh float32 [N, F]: relu of the last stack's map, flattened in (h, w, c) order.
    """
    per_stack = 1 + 2 * conv_layout.RESIDUAL_BLOCKS
    for s in range(stacks):
        layer = convs[s * per_stack: (s + 1) * per_stack]
        x = _max_pool_same(_conv3x3_same(x, *layer[0]))
        for r in range(conv_layout.RESIDUAL_BLOCKS):
            y = _conv3x3_same(np.maximum(x, 0.0), *layer[1 + 2 * r])
            np.maximum(y, 0.0, out=y)
            y = _conv3x3_same(y, *layer[2 + 2 * r])
            x = x + y
    np.maximum(x, 0.0, out=x)
    return x.reshape(len(x), -1)


def _fuse_pair(
    policy: tuple[np.ndarray, np.ndarray], value: tuple[np.ndarray, np.ndarray], first: bool
) -> tuple[np.ndarray, np.ndarray]:
    """One layer of the fused two-trunk network from a layer and its value twin.

    Args:
      policy, value: (kernel, bias) with kernels [..., In, Out] (dense [In, Out], conv
        [kh, kw, In, Out]) and biases [Out].
      first: the layer reads the observation, which both trunks share: the kernels go side
        by side ([..., In, 2 * Out]). Later layers read [policy In | value In] features: the
        kernel is block-diagonal ([..., 2 * In, 2 * Out]).

    Returns:
      (kernel, bias) of the fused layer; bias [2 * Out].
    """
    (pk, pb), (vk, vb) = policy, value
    bias = np.concatenate([pb, vb])
    if first:
        return np.ascontiguousarray(np.concatenate([pk, vk], axis=-1)), bias
    n_in, n_out = pk.shape[-2], pk.shape[-1]
    kernel = np.zeros((*pk.shape[:-2], 2 * n_in, 2 * n_out), np.float32)
    kernel[..., :n_in, :n_out] = pk
    kernel[..., n_in:, n_out:] = vk
    return kernel, bias


def _fuse_after_flatten(kernel: np.ndarray, channels: int) -> np.ndarray:
    """The first fused dense kernel after the conv stack.

    Args:
      kernel: the fused (block-diagonal) kernel [2 * P * channels, 2 * H] as `_fuse_pair`
        built it, rows in the order [policy (h, w, c) ... | value (h, w, c) ...].
      channels: channels of one trunk's last conv layer.

    Returns:
      The same kernel with its rows in the fused feature map's flatten order, (h, w, [policy
      c | value c]): [P * 2 * channels, 2 * H].
    """
    positions = kernel.shape[0] // (2 * channels)
    halves = kernel.reshape(2, positions, channels, kernel.shape[1])  # [trunk, P, C, 2H]
    return np.ascontiguousarray(halves.transpose(1, 0, 2, 3).reshape(kernel.shape))


class NumpyModel:
    """The Keras network's forward pass in numpy, for actor processes.

    Usage::

        model = NumpyModel(env.observation_space, env.action_space, hiddens=(64, 64))
        model.set_weights(model.initial_weights(seed))   # or the learner's broadcast
        logits, values = model(obs)                      # obs [N, *obs_shape]
        actions = sample_actions(logits, rng)

    A recurrent model (``use_lstm=True``) carries its state instead::

        state = model.initial_state(N)                   # [N, 2, C] zeros
        logits, values, state = model.step(obs, state)

    `__call__` reuses no output buffers, but is meant for one thread at a time (like an
    actor's env loop).
    """

    def __init__(
        self,
        observation_space: Any,
        action_space: Any,
        hiddens: Sequence[int] = (64, 64),
        vf_share_layers: bool = False,
        use_lstm: bool = False,
        lstm_cell_size: int = 64,
        conv_net: str = "cnn",
        conv_filters: Sequence[Sequence[int]] | None = None,
        impala_channels: Sequence[int] = conv_layout.IMPALA_CHANNELS,
    ) -> None:
        if conv_net not in conv_layout.CONV_NETS:
            raise ValueError(f"conv_net={conv_net!r} is not supported: choose one of "
                             f"{', '.join(map(repr, conv_layout.CONV_NETS))}")
        self.conv_net = conv_net
        self.impala_channels = tuple(int(c) for c in impala_channels)
        if not self.impala_channels or min(self.impala_channels) < 1:
            raise ValueError(f"impala_channels={impala_channels!r} is not supported: give one "
                             "or more positive channel widths, e.g. (16, 32, 32)")
        kind = check_spaces(observation_space, action_space,
                            conv_filters if conv_net == "cnn" else None)
        self.kind = "impala" if kind == "cnn" and conv_net == "impala" else kind
        self.conv_filters: tuple[tuple[int, int, int], ...] = ()
        if kind == "cnn":
            height, width = observation_space.shape[:2]
            self.conv_filters = (tuple(tuple(int(v) for v in f) for f in conv_filters)
                                 if conv_filters is not None
                                 else conv_layout.default_conv_filters(height, width))
        self.hiddens = _check_hiddens(hiddens)
        if use_lstm and (isinstance(lstm_cell_size, bool) or not isinstance(lstm_cell_size, int)
                         or lstm_cell_size < 1):
            raise ValueError(f"lstm_cell_size={lstm_cell_size!r} is not supported: give a "
                             "positive integer, e.g. 64")
        self.use_lstm = bool(use_lstm)
        self.lstm_cell_size = int(lstm_cell_size) if use_lstm else 0
        # Without hidden layers (an MLP with hiddens=()) both heads read the input: one trunk.
        # A recurrent model has one core (trunk and LSTM) under both heads.
        self.separate_value_trunk = not vf_share_layers and not self.use_lstm and (
            self.kind != "mlp" or bool(self.hiddens))
        self.obs_shape: tuple[int, ...] = tuple(int(d) for d in observation_space.shape)
        self.obs_dtype = np.dtype(observation_space.dtype)
        self.num_actions = int(action_space.n)
        self._scale_uint8 = self.obs_dtype == np.uint8  # bool images are read as 0.0/1.0
        self._shapes, self._gains = self._layout()
        self._weights: list[np.ndarray] | None = None

    def _layout(self) -> tuple[list[tuple[int, ...]], list[float]]:
        """Weight shapes in get_weights() order, and each kernel's init gain."""
        shapes: list[tuple[int, ...]] = []
        gains: list[float] = []
        copies = 2 if self.separate_value_trunk else 1  # each layer, then its value twin
        if self.kind == "cnn":
            height, width, channels = self.obs_shape
            for filters, kernel, stride in self.conv_filters:
                shapes += [(kernel, kernel, channels, filters), (filters,)] * copies
                gains += [HIDDEN_GAIN, 0.0] * copies
                height, width = _conv_out(height, kernel, stride), _conv_out(width, kernel, stride)
                channels = filters
            features = height * width * channels
        elif self.kind == "impala":
            for c_in, c_out in zip((self.obs_shape[-1], *self.impala_channels),
                                   self.impala_channels):
                shapes += [(3, 3, c_in, c_out), (c_out,)] * copies
                gains += [HIDDEN_GAIN, 0.0] * copies
                for _ in range(conv_layout.RESIDUAL_BLOCKS):
                    shapes += [(3, 3, c_out, c_out), (c_out,)] * copies * 2
                    gains += [HIDDEN_GAIN, 0.0] * copies + [RESIDUAL_GAIN, 0.0] * copies
            height, width, channels = conv_layout.impala_shapes(
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
        shapes += [(features, self.num_actions), (self.num_actions,), (features, 1), (1,)]
        gains += [POLICY_GAIN, 0.0, VALUE_GAIN, 0.0]
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
                weights.append(_orthogonal(rng, shape, gain))
        if self.use_lstm:  # forget-gate bias 1 (Keras's unit_forget_bias)
            cell = self.lstm_cell_size
            weights[-5][cell: 2 * cell] = 1.0
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
        if len(weights) != len(self._shapes):
            raise ValueError(
                f"weights has {len(weights)} arrays but this {self.kind} network "
                f"(obs {self.obs_shape}, {self.num_actions} actions, hiddens {self.hiddens}) "
                f"needs {len(self._shapes)}: expected shapes {self._shapes}; build both models "
                "from the same spaces and hiddens"
            )
        arrays = []
        for i, (w, shape) in enumerate(zip(weights, self._shapes, strict=True)):
            arr = np.ascontiguousarray(w, dtype=np.float32)
            if arr.shape != shape:
                raise ValueError(
                    f"weights[{i}] has shape {arr.shape} but this {self.kind} network "
                    f"(obs {self.obs_shape}, {self.num_actions} actions, hiddens "
                    f"{self.hiddens}) expects {shape}: expected shapes {self._shapes}"
                )
            arrays.append(arr)
        self._weights = arrays
        trunk_end = len(arrays) - 4 - (3 if self.use_lstm else 0)
        # kernel [F, 4C], recurrent kernel [C, 4C], bias [4C].
        self._lstm = tuple(arrays[trunk_end: trunk_end + 3]) if self.use_lstm else None
        # (kernel, bias) of each layer as one trunk would hold them; a separate value trunk is
        # fused in: the layer and its value twin become one layer of twice the width.
        layers = [(arrays[i], arrays[i + 1]) for i in range(0, trunk_end, 2)]
        # The policy's own path, for `logits` (the actors' per-step forward needs no value).
        pi_layers = layers[0::2] if self.separate_value_trunk else layers
        self._pi_conv = self._conv_layers(pi_layers)
        self._pi_dense = pi_layers[len(self._pi_conv):]
        self._pi_head = (arrays[-4], arrays[-3])
        if self.separate_value_trunk:
            layers = [_fuse_pair(layers[i], layers[i + 1], first=i == 0)
                      for i in range(0, len(layers), 2)]
        self._conv = self._conv_layers(layers)
        self._dense = layers[len(self._conv):]
        # Both heads in one gemm: [H, A + 1], logits in the first A columns (with two trunks,
        # the logits read the policy half of the features and the value the other half).
        pw, pb, vw, vb = arrays[-4:]
        if self.separate_value_trunk:
            top = np.concatenate([pw, np.zeros_like(vw)], axis=1)
            bottom = np.concatenate([np.zeros_like(pw), vw], axis=1)
            head_w = np.concatenate([top, bottom], axis=0)
        else:
            head_w = np.concatenate([pw, vw], axis=1)
        if self.separate_value_trunk and self._conv:
            # The layer after the convs reads the flattened (h, w, [policy C | value C]) map.
            channels = (self.conv_filters[-1][0] if self.kind == "cnn"
                        else self.impala_channels[-1])
            if self._dense:
                kernel, bias = self._dense[0]
                self._dense[0] = (_fuse_after_flatten(kernel, channels), bias)
            else:
                head_w = _fuse_after_flatten(head_w, channels)
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
            count = len(self.impala_channels) * (1 + 2 * conv_layout.RESIDUAL_BLOCKS)
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
        return out[:, : self.num_actions], out[:, self.num_actions]

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
        return out

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
        return out[:, : self.num_actions], out[:, self.num_actions], next_state

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
        return obs if obs.dtype == np.float32 else obs.astype(np.float32)

    def _features(self, x: np.ndarray, conv: list[tuple], dense: list[tuple]) -> np.ndarray:
        """The trunk: conv layers (relu) and dense layers (relu after convs, else tanh).

        Args:
          x: float32 [N, *obs_shape]; never written to.
          conv, dense: the layers to run (the fused network's, or the policy's alone).

        Returns:
          A fresh float32 array [N, F] of the last layer's features.
        """
        if self.kind == "impala":
            x = _impala_trunk(x, conv, len(self.impala_channels))
            for w, b in dense:
                x = x @ w
                x += b
                np.maximum(x, 0.0, out=x)
            return x
        if conv:
            n = x.shape[0]
            for kernel2d, bias, size, stride in conv:
                ho = _conv_out(x.shape[1], size, stride)
                wo = _conv_out(x.shape[2], size, stride)
                y = _sliding_patches(x, size, stride) @ kernel2d
                y += bias
                np.maximum(y, 0.0, out=y)
                x = y.reshape(n, ho, wo, -1)
            x = x.reshape(n, -1)
            for w, b in dense:
                x = x @ w
                x += b
                np.maximum(x, 0.0, out=x)
            return x
        for w, b in dense:
            x = x @ w  # a fresh array: obs is never written to
            x += b
            np.tanh(x, out=x)
        return x


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic sigmoid without overflow: 0.5 * (1 + tanh(x / 2)), float32 in, float32 out."""
    y = np.tanh(x * np.float32(0.5))
    y += np.float32(1.0)
    y *= np.float32(0.5)
    return y


def lstm_step(x: np.ndarray, state: np.ndarray, kernel: np.ndarray,
              recurrent_kernel: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """One step of Keras's ``LSTMCell`` (sigmoid gates, tanh activation) in numpy.

    Args:
      x: float32 [N, F], the step's input.
      state: float32 [N, 2, C], (h, c) before the step.
      kernel, recurrent_kernel, bias: [F, 4C], [C, 4C] and [4C], gates in Keras's order
        (input, forget, cell, output).

    Returns:
      A fresh float32 [N, 2, C]: (h, c) after the step; h is the step's output.
    """
    cell = recurrent_kernel.shape[0]
    h, c = state[:, 0], state[:, 1]
    z = x @ kernel
    z += h @ recurrent_kernel
    z += bias
    i = _sigmoid(z[:, :cell])
    f = _sigmoid(z[:, cell: 2 * cell])
    g = np.tanh(z[:, 2 * cell: 3 * cell])
    o = _sigmoid(z[:, 3 * cell:])
    out = np.empty_like(state)
    new_c = out[:, 1]
    np.multiply(f, c, out=new_c)
    new_c += i * g
    np.multiply(o, np.tanh(new_c), out=out[:, 0])
    return out


def lstm_sequence(xs: np.ndarray, state_in: np.ndarray, dones: np.ndarray,
                  kernel: np.ndarray, recurrent_kernel: np.ndarray, bias: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """`lstm_step` over a time-major sequence, with the state zeroed where an episode ended.

    Before step t the state is zeroed wherever ``dones[t - 1]``; after the last step
    wherever ``dones[T - 1]`` (what the next sequence starts from). This is the recurrence of
    the learner's ``keras_model.lstm_unroll`` and of the actors' `NumpyModel.unroll`.

    Args:
      xs: float32 [T, N, F], each step's input (the trunk's features).
      state_in: float32 [N, 2, C], (h, c) before step 0.
      dones: bool [T, N], the episode ended at this step.
      kernel, recurrent_kernel, bias: the LSTM's weights, as `lstm_step`'s.

    Returns:
      (hs, state_out): float32 [T, N, C], each step's output h, and [N, 2, C], the state
      after the last step.
    """
    T = len(xs)
    hs = np.empty((T, *state_in.shape[::2]), np.float32)
    state = state_in
    for t in range(T):
        state = lstm_step(xs[t], state, kernel, recurrent_kernel, bias)
        hs[t] = state[:, 0]
        state[dones[t]] = 0.0
    return hs, state


def sample_actions(logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Samples one action per row from softmax(logits) (Gumbel-max trick).

    argmax(logits + Gumbel noise) is distributed as softmax(logits), needs no
    normalisation and handles -inf (masked) logits.

    Args:
      logits: A float array of shape [N, A].
      rng: the numpy Generator to draw from.

    Returns:
      An int64 array of shape [N] with actions in [0, A).
    """
    noise = rng.gumbel(size=logits.shape)
    noise += logits
    return noise.argmax(axis=1).astype(np.int64, copy=False)
