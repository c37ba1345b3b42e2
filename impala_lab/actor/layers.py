"""The numpy layers the actors' model (`impala_lab.actor.numpy_model.NumpyModel`) is built
from: convolutions as one gemm (im2col), TensorFlow's 'same' max-pool, the
IMPALA network's residual stacks, the trunk's forward pass, and Keras's LSTM cell.

Shapes are NHWC for images and [N, F] for features; every function takes and returns float32
and never writes to its inputs. numpy only (actor processes import it).
"""

from __future__ import annotations

import numpy as np

from impala_lab import model_spec

__all__ = ["conv3x3_same", "conv_out", "forward_trunk", "impala_trunk", "lstm_sequence",
           "lstm_step", "max_pool_same", "sliding_patches"]


def conv_out(size: int, kernel: int, stride: int) -> int:
    return (size - kernel) // stride + 1


def sliding_patches(x: np.ndarray, kernel: int, stride: int) -> np.ndarray:
    """im2col with 'valid' padding: x float32 [N, H, W, C] -> [N * Ho * Wo, kernel * kernel
    * C], patch entries in (kh, kw, C) order, as a Keras kernel [kh, kw, C, F] reshaped to
    [kh*kw*C, F]."""
    n, h, w, c = x.shape
    ho, wo = conv_out(h, kernel, stride), conv_out(w, kernel, stride)
    sn, sh, sw, sc = x.strides
    view = np.lib.stride_tricks.as_strided(
        x, shape=(n, ho, wo, kernel, kernel, c),
        strides=(sn, sh * stride, sw * stride, sh, sw, sc), writeable=False)
    return view.reshape(n * ho * wo, kernel * kernel * c)  # copies: one gemm per layer


def conv3x3_same(x: np.ndarray, kernel2d: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """A 3x3 stride-1 convolution with 'same' (zero) padding, as one gemm: x float32
    [N, H, W, C], kernel2d [9 * C, F] (a Keras kernel [3, 3, C, F] reshaped), bias [F] ->
    a fresh [N, H, W, F]."""
    n, h, w, c = x.shape
    padded = np.zeros((n, h + 2, w + 2, c), np.float32)
    padded[:, 1:-1, 1:-1] = x
    y = sliding_patches(padded, 3, 1) @ kernel2d
    y += bias
    return y.reshape(n, h, w, -1)


def max_pool_same(x: np.ndarray) -> np.ndarray:
    """Max-pool 3x3 stride 2 with TensorFlow's 'same' padding (the padding never wins):
    float32 [N, H, W, C] -> a fresh [N, ceil(H / 2), ceil(W / 2), C], the max of the nine
    strided views of the padded map."""
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


def impala_trunk(x: np.ndarray, convs: list[tuple[np.ndarray, np.ndarray]],
                  stacks: int) -> np.ndarray:
    """The IMPALA network's conv stacks (`impala_lab.model_spec`): x float32 [N, H, W, C]
    -> a fresh [N, F], relu of the last stack's map flattened in (h, w, c) order. ``convs``:
    (kernel [9 * C_in, C_out], bias [C_out]) of the 5 * ``stacks`` convs in weight order (per
    stack its conv, then each residual block's two)."""
    per_stack = 1 + 2 * model_spec.RESIDUAL_BLOCKS
    for s in range(stacks):
        layer = convs[s * per_stack: (s + 1) * per_stack]
        x = max_pool_same(conv3x3_same(x, *layer[0]))
        for r in range(model_spec.RESIDUAL_BLOCKS):
            y = conv3x3_same(np.maximum(x, 0.0), *layer[1 + 2 * r])
            np.maximum(y, 0.0, out=y)
            y = conv3x3_same(y, *layer[2 + 2 * r])
            x = x + y
    np.maximum(x, 0.0, out=x)
    return x.reshape(len(x), -1)


def forward_trunk(x: np.ndarray, kind: str, conv: list[tuple], dense: list[tuple],
                  stacks: int = 0) -> np.ndarray:
    """A trunk's forward pass: conv layers (relu), then dense layers (relu after convs, tanh
    in an MLP).

    Args:
      x: float32 [N, *obs_shape]; never written to.
      kind: "mlp", "cnn" (conv holds (kernel [kh*kw*C, F], bias, size, stride) per layer) or
        "impala" (conv holds (kernel [9*C, F], bias) of the ``stacks`` stacks' convs).
      conv, dense: the layers to run; dense holds (kernel [In, Out], bias [Out]).
      stacks: the IMPALA network's stack count.

    Returns:
      A fresh float32 array [N, F] of the last layer's features.
    """
    if kind == "impala":
        x = impala_trunk(x, conv, stacks)
    elif conv:
        n = x.shape[0]
        for kernel2d, bias, size, stride in conv:
            ho = conv_out(x.shape[1], size, stride)
            wo = conv_out(x.shape[2], size, stride)
            y = sliding_patches(x, size, stride) @ kernel2d
            y += bias
            np.maximum(y, 0.0, out=y)
            x = y.reshape(n, ho, wo, -1)
        x = x.reshape(n, -1)
    for w, b in dense:
        x = x @ w  # a fresh array: obs is never written to
        x += b
        if kind == "mlp":
            np.tanh(x, out=x)
        else:
            np.maximum(x, 0.0, out=x)
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
    """`lstm_step` over a time-major sequence, the state zeroed before step t wherever
    ``dones[t - 1]`` and after the last step wherever ``dones[T - 1]`` (the recurrence of
    ``keras_model.lstm_unroll`` and `NumpyModel.unroll`).

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
