"""`ModelSpec`: the policy/value network, described once, and the geometry of its conv trunks.

The actors' numpy model, the learner's Keras model, the memory estimate and ``impala-lab play``
take a `ModelSpec` (``ImpalaConfig.model_spec``; the config's ``model`` is ``hiddens`` here);
`network_layout` says what it builds for an env's spaces, and both models build from that.
numpy only: every part of the package may import it.

Trunks (docs/pixels.md draws them): a rank-1 Box gets ``hiddens`` dense tanh layers; HxWxC
images (uint8 scaled by 1/255 inside) the small CNN of ``conv_filters`` ('valid', relu; None
picks by image size as RLlib's ``get_filter_config``) or the IMPALA paper's network (per width
of ``impala_channels`` a conv, a max-pool halving the map, two residual blocks), then
``hiddens`` relu layers. ``use_lstm`` adds an LSTM of C = ``lstm_cell_size`` units under both
heads: the distribution's inputs [N, A] and a value [N]. With ``vf_share_layers=False``
(RLlib's default) the value head has a trunk of its own, so a value-loss spike cannot wreck the
policy's features.

Weights are a ``list[np.ndarray]`` in Keras's ``get_weights()`` order. With a shared trunk::

    mlp: [hidden_0/kernel [D, H0], hidden_0/bias [H0], ..., logits_head/kernel [Hk, A],
          logits_head/bias [A], value_head/kernel [Hk, 1], value_head/bias [1]]
    cnn: [conv_0/kernel [8, 8, C, 16], conv_0/bias [16], conv_1/kernel [4, 4, 16, 32],
          conv_1/bias [32], hidden_0/kernel [F, H0], ..., then the two heads as above]
    impala: for each stack s, its conv ``stack_s_conv`` [3, 3, C_in, C_s] and bias, then
          ``stack_s_res_r_conv_0`` and ``_1`` [3, 3, C_s, C_s] (and biases) of residual blocks
          r = 0, 1; then hidden_0/kernel [F, H0], ..., and the heads

With separate trunks every layer is followed by its value twin (Keras orders layers by depth).
An LSTM's weights come between the trunk and the heads: ``lstm/kernel [F, 4C],
lstm/recurrent_kernel [C, 4C], lstm/bias [4C]``, gates (input, forget, cell, output); the state
of N envs is float32 [N, 2, C] (h, then c). Initialisation: orthogonal kernels with the gains
below, zero biases but the LSTM's forget gate (1, Keras's ``unit_forget_bias``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from impala_lab.spaces import action_space_kind, observation_trunk

CONV_NETS = ("cnn", "impala")
# (filters, kernel, stride) of the small CNN's layers, 'valid' padding.
ATARI_FILTERS: tuple[tuple[int, int, int], ...] = ((16, 8, 4), (32, 4, 2))
SMALL_IMAGE_FILTERS: tuple[tuple[int, int, int], ...] = ((16, 3, 1),)
IMPALA_CHANNELS: tuple[int, ...] = (16, 32, 32)
RESIDUAL_BLOCKS = 2  # per stack of the IMPALA network
# A normalised observation is (obs - mean) / sqrt(var + OBS_NORM_EPSILON), clipped to
# +-OBS_NORM_CLIP: a rare extreme observation cannot blow up the first layer (SB3's default).
OBS_NORM_EPSILON = 1e-8
OBS_NORM_CLIP = 10.0
# Orthogonal-init gains: hidden and conv layers, the policy head (a near-uniform first
# policy), the value head, the LSTM's kernels. The last conv of each residual block starts at
# zero, each block as the identity (Goyal et al. 2017; Fixup): with sqrt(2) there too, six
# blocks in a row blow the first values up.
HIDDEN_GAIN = math.sqrt(2.0)
POLICY_GAIN = 0.01
VALUE_GAIN = 1.0
LSTM_GAIN = 1.0
RESIDUAL_GAIN = 0.0


@dataclass(frozen=True)
class ModelSpec:
    """The architecture of the policy/value network (the module docstring has the trunks).

    Attributes:
      hiddens: sizes of the dense hidden layers (the config's ``model``); () for none.
      vf_share_layers: one trunk under both heads (True), or a value trunk of its own (False,
        RLlib's default); a recurrent model has one core whatever this says.
      use_lstm, lstm_cell_size: an LSTM of C units after the trunk (h and c each [N, C]).
      conv_net: the conv trunk for images, "cnn" or "impala".
      conv_filters: the small CNN's (filters, kernel, stride) layers; None picks them by image
        size (`default_conv_filters`).
      impala_channels: the widths of the IMPALA network's stacks.
      free_log_std: a Box space's log-std is a learned vector (the policy head's third weight
        ``logits_head/log_std [D]``), not computed with the mean.
      log_std_init: a Box space's log-std at the start (that vector, or the head's log-std bias).
      normalize_obs: standardise vector observations inside the network with a running mean
        and variance (`impala_lab.learner.obs_normalizer`): the first three weights are then
        ``obs_filter/mean [D], obs_filter/var [D], obs_filter/count [1]``, updated by the
        learner, never by a gradient, and sent to the actors with the weights.

    Lists are stored as tuples (hashable, pickled to actor processes). A bad value raises
    ValueError naming the field, the value and the fix.
    """

    hiddens: tuple[int, ...] = (64, 64)
    vf_share_layers: bool = False
    use_lstm: bool = False
    lstm_cell_size: int = 64
    conv_net: str = "cnn"
    conv_filters: tuple[tuple[int, int, int], ...] | None = None
    impala_channels: tuple[int, ...] = IMPALA_CHANNELS
    free_log_std: bool = True
    normalize_obs: bool = False
    log_std_init: float = 0.0

    def __post_init__(self) -> None:
        # frozen: normalise through object.__setattr__
        object.__setattr__(self, "hiddens", _positive_ints("hiddens", self.hiddens, "(64, 64)",
                                                           allow_empty=True))
        object.__setattr__(self, "impala_channels", _positive_ints(
            "impala_channels", self.impala_channels, "(16, 32, 32)", allow_empty=False))
        if self.conv_filters is not None:
            object.__setattr__(self, "conv_filters", _filters(self.conv_filters))
        if self.conv_net not in CONV_NETS:
            raise ValueError(f"conv_net={self.conv_net!r} is not supported: choose one of "
                             f"{', '.join(map(repr, CONV_NETS))}")
        size = self.lstm_cell_size
        if self.use_lstm and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(f"lstm_cell_size={size!r} is not supported: give a positive "
                             "integer, e.g. 64")

    def small_cnn_filters(self, obs_shape: Sequence[int]) -> tuple[tuple[int, int, int], ...]:
        """The small CNN's layers for images of ``obs_shape`` (H, W, C): ``conv_filters``, or
        the default for the image's size when they are None."""
        if self.conv_filters is not None:
            return self.conv_filters
        return default_conv_filters(int(obs_shape[0]), int(obs_shape[1]))

    def conv_maps(self, obs_shape: Sequence[int]) -> list[tuple[int, int, int]]:
        """The (H, W, C) map after each conv layer (small CNN) or stack (IMPALA network)."""
        if self.conv_net == "impala":
            return impala_shapes(obs_shape, self.impala_channels)
        return small_cnn_shapes(obs_shape, self.small_cnn_filters(obs_shape))

    def trunk_output_units(self, obs_shape: Sequence[int]) -> int:
        """Features the conv trunk's last map holds for one image of ``obs_shape`` (H * W * C):
        what the dense layers (or the LSTM) read."""
        h, w, c = self.conv_maps(obs_shape)[-1]
        return h * w * c

    def conv_units(self, obs_shape: Sequence[int]) -> int:
        """Activations one image leaves in the conv trunk (for the memory estimate): the sum
        of every conv layer's output units (and the pools' for the IMPALA network)."""
        if self.conv_net != "impala":
            return sum(h * w * c for h, w, c in self.conv_maps(obs_shape))
        h, w = int(obs_shape[0]), int(obs_shape[1])
        total = 0
        for c in self.impala_channels:
            total += h * w * c  # the stack's conv
            h, w = _pooled(h), _pooled(w)
            # the pool, then per block two relus, two convs and the sum
            total += h * w * c * (1 + 5 * RESIDUAL_BLOCKS)
        return total


def _positive_ints(name: str, values: Any, example: str, allow_empty: bool) -> tuple[int, ...]:
    """``values`` as a tuple of positive ints, or ValueError naming ``name``."""
    try:
        given = tuple(values)
        out = tuple(int(v) for v in given)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={values!r} is not supported: give a sequence of sizes, "
                         f"e.g. {example}") from None
    if any(v <= 0 for v in out) or out != given or not (out or allow_empty):
        raise ValueError(f"{name}={given!r} is not supported: every size must be a positive "
                         f"integer, e.g. {example}")
    return out


def _filters(filters: Any) -> tuple[tuple[int, int, int], ...]:
    """``conv_filters`` as a tuple of (filters, kernel, stride) int triples."""
    try:
        out = tuple(tuple(int(v) for v in f) for f in filters)
    except (TypeError, ValueError):
        out = ()
    if not out or any(len(f) != 3 or min(f) < 1 for f in out):
        raise ValueError(f"conv_filters={filters!r} is not supported: give one or more "
                         "(filters, kernel, stride) triples of positive integers, e.g. "
                         "((16, 3, 1),), or None to pick by image size")
    return out  # type: ignore[return-value]


def min_image_size(filters: Sequence[Sequence[int]]) -> int:
    """Smallest H (and W) for which every 'valid' conv layer has at least one output row."""
    size = 1
    for _, kernel, stride in reversed(filters):
        size = (size - 1) * stride + kernel
    return size


def default_conv_filters(height: int, width: int) -> tuple[tuple[int, int, int], ...]:
    """The small CNN's layers for an image of this size when ``conv_filters`` is None."""
    need = min_image_size(ATARI_FILTERS)
    return ATARI_FILTERS if min(height, width) >= need else SMALL_IMAGE_FILTERS


def small_cnn_shapes(obs_shape: Sequence[int], filters: Sequence[Sequence[int]]
                     ) -> list[tuple[int, int, int]]:
    """The (H, W, C) map after each of the small CNN's conv layers."""
    h, w, _ = (int(d) for d in obs_shape)
    out = []
    for f, kernel, stride in filters:
        h, w = max(0, (h - kernel) // stride + 1), max(0, (w - kernel) // stride + 1)
        out.append((h, w, int(f)))
    return out


def _pooled(size: int) -> int:
    return -(-size // 2)  # max-pool 3x3 stride 2, 'same' padding


def impala_shapes(obs_shape: Sequence[int], channels: Sequence[int]) -> list[tuple[int, int, int]]:
    """The (H, W, C) map after each IMPALA stack (conv, max-pool, residual blocks)."""
    h, w, _ = (int(d) for d in obs_shape)
    out = []
    for c in channels:
        h, w = _pooled(h), _pooled(w)
        out.append((h, w, int(c)))
    return out


def check_spaces(observation_space: Any, action_space: Any,
                 conv_filters: Sequence[Sequence[int]] | None = None) -> str:
    """The trunk the observations get, ``"mlp"`` (a rank-1 Box) or ``"cnn"`` (rank 3, HxWxC
    images, which must fit the small CNN's ``conv_filters``; None: `default_conv_filters`),
    once both spaces are known to be supported (`impala_lab.spaces`).

    Raises:
      ValueError: the space is not supported; the message names it and what is supported
        (a `ConfigError` for the action space).
    """
    action_space_kind(action_space)
    trunk = observation_trunk(observation_space)
    if trunk == "cnn":
        height, width, _ = observation_space.shape
        layers = (tuple(tuple(f) for f in conv_filters) if conv_filters is not None
                  else default_conv_filters(height, width))
        need = min_image_size(layers)
        if height < need or width < need:
            raise ValueError(
                f"observation space {observation_space} is not supported: images must be at "
                f"least {need}x{need} (HxWxC) for the CNN's conv layers {layers}; resize "
                "with gymnasium.wrappers.ResizeObservation, or choose smaller conv_filters")
    return trunk


@dataclass(frozen=True)
class NetworkLayout:
    """What a `ModelSpec` builds for an env's spaces (`network_layout` makes one): the trunk
    ``kind`` (``"mlp"``, ``"cnn"`` or ``"impala"``), the small CNN's ``conv_filters`` (() for
    other trunks), ``lstm_cell_size`` (0 without an LSTM), whether every layer has a value twin
    (``separate_value_trunk``), the width A of the distribution's inputs (``num_actions``) and
    of the policy head (``head_units``: A, or the D means when the log-std is free), and
    ``shapes`` and ``gains``: each weight's shape in ``get_weights()`` order and its
    orthogonal-init gain (0 for biases and statistics)."""

    kind: str
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    conv_filters: tuple[tuple[int, int, int], ...]
    hiddens: tuple[int, ...]
    impala_channels: tuple[int, ...]
    use_lstm: bool
    lstm_cell_size: int
    separate_value_trunk: bool
    num_actions: int
    head_units: int
    free_log_std: bool
    normalize_obs: bool
    log_std_init: float
    shapes: tuple[tuple[int, ...], ...]
    gains: tuple[float, ...]

    def initial_weights(self, seed: int | None) -> list[np.ndarray]:
        """Fresh float32 weights in `shapes` order (the module docstring says how), the
        observation variance 1; the same seed gives the same weights."""
        rng = np.random.default_rng(seed)
        weights = [np.zeros(shape, np.float32) if len(shape) == 1 else orthogonal(rng, shape, gain)
                   for shape, gain in zip(self.shapes, self.gains, strict=True)]
        if self.use_lstm:
            cell = self.lstm_cell_size
            weights[-5 - self.free_log_std][cell: 2 * cell] = 1.0
        if self.log_std_init:  # a Box space's inputs end in the D log-stds
            weights[-3][-(self.num_actions // 2):] = self.log_std_init
        if self.normalize_obs:  # the identity until the learner sees data
            weights[1][:] = 1.0
        return weights


def network_layout(spec: ModelSpec, observation_space: Any, action_space: Any) -> NetworkLayout:
    """The network ``spec`` gives for these spaces, with its weight layout; ValueError for
    unsupported spaces (`check_spaces`), or ``normalize_obs`` with images."""
    trunk = check_spaces(observation_space, action_space,
                         spec.conv_filters if spec.conv_net == "cnn" else None)
    kind = "impala" if trunk == "cnn" and spec.conv_net == "impala" else trunk
    obs_shape = tuple(int(d) for d in observation_space.shape)
    if spec.normalize_obs and kind != "mlp":
        raise ValueError(
            f"normalize_obs=True needs vector observations, but this env's are images "
            f"{obs_shape} (already scaled to [0, 1] inside the network): set normalize_obs=False")
    action_kind = action_space_kind(action_space)
    num_actions = action_kind.inputs_size(action_space)
    free_log_std = bool(spec.free_log_std and action_kind.has_log_std)
    # Without hidden layers (an MLP with hiddens=()) both heads read the input: one trunk.
    # A recurrent model has one core (trunk and LSTM) under both heads.
    separate = not spec.vf_share_layers and not spec.use_lstm and (
        kind != "mlp" or bool(spec.hiddens))
    layout = NetworkLayout(
        kind=kind, obs_shape=obs_shape, obs_dtype=np.dtype(observation_space.dtype),
        conv_filters=spec.small_cnn_filters(obs_shape) if kind == "cnn" else (),
        hiddens=spec.hiddens, impala_channels=spec.impala_channels, use_lstm=spec.use_lstm,
        lstm_cell_size=spec.lstm_cell_size if spec.use_lstm else 0,
        separate_value_trunk=separate, num_actions=num_actions,
        head_units=num_actions // 2 if free_log_std else num_actions,
        free_log_std=free_log_std, normalize_obs=bool(spec.normalize_obs), shapes=(), gains=(),
        log_std_init=float(spec.log_std_init) if action_kind.has_log_std else 0.0)
    features = obs_shape[0] if kind == "mlp" else spec.trunk_output_units(obs_shape)
    shapes, gains = _weight_layout(layout, features)
    return dataclasses.replace(layout, shapes=tuple(shapes), gains=tuple(gains))


def _weight_layout(net: NetworkLayout, features: int
                   ) -> tuple[list[tuple[int, ...]], list[float]]:
    """Weight shapes in ``get_weights()`` order, and each array's init gain (the module
    docstring has the order); ``features``: what the first dense layer reads."""
    shapes: list[tuple[int, ...]] = []
    gains: list[float] = []

    def add(shape: tuple[int, ...], gain: float, bias: int) -> None:
        copies = 2 if net.separate_value_trunk else 1  # each layer, then its value twin
        shapes.extend([shape, (bias,)] * copies)
        gains.extend([gain, 0.0] * copies)

    if net.normalize_obs:  # obs_filter/mean [D], /var [D], /count [1]
        shapes += [net.obs_shape, net.obs_shape, (1,)]
        gains += [0.0, 0.0, 0.0]
    channels = net.obs_shape[-1]
    for filters, kernel, _ in net.conv_filters:  # the small CNN's; () for other trunks
        add((kernel, kernel, channels, filters), HIDDEN_GAIN, filters)
        channels = filters
    if net.kind == "impala":
        for c_in, c_out in zip((channels, *net.impala_channels), net.impala_channels):
            add((3, 3, c_in, c_out), HIDDEN_GAIN, c_out)
            for _ in range(RESIDUAL_BLOCKS):
                add((3, 3, c_out, c_out), HIDDEN_GAIN, c_out)
                add((3, 3, c_out, c_out), RESIDUAL_GAIN, c_out)
    for size in net.hiddens:
        add((features, size), HIDDEN_GAIN, size)
        features = size
    if net.lstm_cell_size:
        cell = net.lstm_cell_size
        shapes += [(features, 4 * cell), (cell, 4 * cell), (4 * cell,)]
        gains += [LSTM_GAIN, LSTM_GAIN, 0.0]
        features = cell
    head = net.head_units
    shapes += [(features, head), (head,)]
    gains += [POLICY_GAIN, 0.0]
    if net.free_log_std:
        shapes.append((head,))  # logits_head/log_std, log_std_init at the start
        gains.append(0.0)
    shapes += [(features, 1), (1,)]
    gains += [VALUE_GAIN, 0.0]
    return shapes, gains


def orthogonal(rng: np.random.Generator, shape: tuple[int, ...], gain: float) -> np.ndarray:
    """Orthogonal init as keras.initializers.Orthogonal does it: rows = prod(shape[:-1])."""
    rows = int(np.prod(shape[:-1]))
    cols = shape[-1]
    flat = rng.standard_normal((max(rows, cols), min(rows, cols)))
    q, r = np.linalg.qr(flat)
    q = q * np.sign(np.diag(r))  # make the decomposition unique (uniform over rotations)
    if rows < cols:
        q = q.T
    return (gain * q).reshape(shape).astype(np.float32)
