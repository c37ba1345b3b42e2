"""The geometry of the two image networks: which layers, and what shape each one outputs.

Two conv trunks read HxWxC images (``conv_net`` in the config):

  * ``"cnn"``, the small CNN: ``conv_filters`` layers ``(filters, kernel, stride)`` with
    'valid' padding and relu. Left unset (None) they follow the image's size, as RLlib's
    ``get_filter_config`` does: images of at least 20x20 get the Atari-style
    ``((16, 8, 4), (32, 4, 2))``; smaller ones (MinAtar's 10x10) get MinAtar's own network's
    ``((16, 3, 1),)``.
  * ``"impala"``, the IMPALA paper's "deep" network (Espeholt et al. 2018, figure 3): for
    each width in ``impala_channels`` a conv 3x3 stride 1 ('same'), a max-pool 3x3 stride 2
    ('same': the map shrinks to ceil(H / 2)) and two residual blocks (relu, conv 3x3, relu,
    conv 3x3, plus the block's input); then a relu and the flatten. On 10x10 inputs with
    (16, 32, 32): 10x10x16 -> 5x5x16 -> 3x3x32 -> 2x2x32, 128 features.

Both are followed by the ``model`` dense layers (relu), then the policy and value heads.

Pure Python: the config's memory estimate and the models both use it.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ATARI_FILTERS", "CONV_NETS", "SMALL_IMAGE_FILTERS", "conv_units",
           "default_conv_filters", "impala_shapes", "min_image_size", "small_cnn_shapes",
           "trunk_output_units"]

CONV_NETS = ("cnn", "impala")
# (filters, kernel, stride) of the small CNN's layers, 'valid' padding.
ATARI_FILTERS: tuple[tuple[int, int, int], ...] = ((16, 8, 4), (32, 4, 2))
SMALL_IMAGE_FILTERS: tuple[tuple[int, int, int], ...] = ((16, 3, 1),)
IMPALA_CHANNELS: tuple[int, ...] = (16, 32, 32)
RESIDUAL_BLOCKS = 2  # per stack


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


def conv_units(obs_shape: Sequence[int], conv_net: str = "cnn",
               conv_filters: Sequence[Sequence[int]] | None = None,
               impala_channels: Sequence[int] = IMPALA_CHANNELS) -> int:
    """Activations one observation leaves in the conv trunk (for the memory estimate): the sum
    of every conv layer's output units (and the pools' for the IMPALA network)."""
    h, w, _ = (int(d) for d in obs_shape)
    if conv_net == "impala":
        total = 0
        for c in impala_channels:
            total += h * w * c  # the stack's conv
            h, w = _pooled(h), _pooled(w)
            # the pool, then per block two relus, two convs and the sum
            total += h * w * c * (1 + 5 * RESIDUAL_BLOCKS)
        return total
    return sum(a * b * c for a, b, c in _small_cnn_maps(obs_shape, conv_filters))


def trunk_output_units(obs_shape: Sequence[int], conv_net: str = "cnn",
                       conv_filters: Sequence[Sequence[int]] | None = None,
                       impala_channels: Sequence[int] = IMPALA_CHANNELS) -> int:
    """Features the conv trunk's last map holds for one observation (H * W * C), what the
    dense layers (or the LSTM) read."""
    maps = (impala_shapes(obs_shape, impala_channels) if conv_net == "impala"
            else _small_cnn_maps(obs_shape, conv_filters))
    h, w, c = maps[-1]
    return h * w * c


def _small_cnn_maps(obs_shape: Sequence[int], conv_filters: Sequence[Sequence[int]] | None
                    ) -> list[tuple[int, int, int]]:
    h, w, _ = (int(d) for d in obs_shape)
    filters = conv_filters if conv_filters is not None else default_conv_filters(h, w)
    return small_cnn_shapes(obs_shape, filters)
