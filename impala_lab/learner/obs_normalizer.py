"""Observation normalisation: a running mean and variance inside the network.

With ``normalize_obs=True`` the network's first layer, `ObsNormalizer`, standardises each
observation dimension (continuous control mixes units orders of magnitude apart) with the
statistics of what the learner has trained on so far (SB3's ``VecNormalize``, RLlib's
``MeanStdFilter``).

The statistics are three non-trainable weights of the model, ``obs_filter/mean [D]``,
``obs_filter/var [D]`` and ``obs_filter/count [1]``, first in ``get_weights()`` order. So the
actors normalise with exactly what the weights broadcast brought (batches keep raw
observations), the learner with its statistics now (they differ by the policy lag V-trace
already corrects for), and checkpoints carry them with no extra file.

`update_obs_statistics` merges each new train batch's observations in before its update
(Chan et al.'s parallel variance formula, exact for any split into batches).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from impala_lab.model_spec import OBS_NORM_CLIP, OBS_NORM_EPSILON

__all__ = ["ObsNormalizer", "merge_moments", "update_obs_statistics"]


class ObsNormalizer(keras.layers.Layer):
    """clip((obs - mean) / sqrt(var + eps), -OBS_NORM_CLIP, OBS_NORM_CLIP) per dimension.

    Input and output float32 [N, D]. Weights (all non-trainable, in this order): ``mean``
    [D], ``var`` [D], ``count`` [1].
    """

    def build(self, input_shape: tuple[int | None, ...]) -> None:
        dim = int(input_shape[-1])
        self.mean = self.add_weight(shape=(dim,), initializer="zeros", trainable=False,
                                    name="mean")
        self.var = self.add_weight(shape=(dim,), initializer="ones", trainable=False,
                                   name="var")
        self.count = self.add_weight(shape=(1,), initializer="zeros", trainable=False,
                                     name="count")

    def call(self, obs: Any) -> Any:
        x = (obs - self.mean) * keras.ops.rsqrt(self.var + OBS_NORM_EPSILON)
        return keras.ops.clip(x, -OBS_NORM_CLIP, OBS_NORM_CLIP)


def merge_moments(mean: np.ndarray, var: np.ndarray, count: float, batch: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, float]:
    """(mean [D], population variance [D], count) of ``count`` observations seen before
    (``mean``, ``var`` [D]; ignored if count is 0) and ``batch`` [N, D] together (float64)."""
    batch = np.asarray(batch, np.float64)
    n = batch.shape[0]
    if n == 0:
        return np.asarray(mean, np.float64), np.asarray(var, np.float64), float(count)
    b_mean, b_var = batch.mean(axis=0), batch.var(axis=0)
    if count <= 0:
        return b_mean, b_var, float(n)
    total = count + n
    delta = b_mean - mean
    new_mean = mean + delta * (n / total)
    m2 = var * count + b_var * n + delta ** 2 * (count * n / total)
    return new_mean, m2 / total, float(total)


def update_obs_statistics(model: keras.Model, obs: np.ndarray) -> None:
    """Merge the observations ``obs`` [..., D] (a batch's [T, B, D]) into ``model``'s
    ``obs_filter`` weights. Call it from the thread that trains ``model``, between updates."""
    layer = model.get_layer("obs_filter")
    flat = np.asarray(obs).reshape(-1, layer.mean.shape[0])
    mean, var, count = merge_moments(np.asarray(layer.mean), np.asarray(layer.var),
                                     float(np.asarray(layer.count)[0]), flat)
    layer.mean.assign(mean.astype(np.float32))
    layer.var.assign(var.astype(np.float32))
    layer.count.assign(np.array([count], np.float32))
