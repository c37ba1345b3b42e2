"""Observations as pictures: which spaces are images (`image_kind`), and a strip of frames as
one RGB image (`strip_rgb`). The driver keeps the frames (`impala_lab.driver.latest_frames`),
the dashboard draws them. Imports numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["FRAME_STRIP_LENGTH", "Frames", "image_kind", "not_image_reason", "frame_scale",
           "strip_rgb"]

#: Frames kept, K: the last K time steps of the followed env.
FRAME_STRIP_LENGTH = 8
#: Images smaller than this (in pixels) are scaled up by a whole factor towards it.
DEFAULT_HEIGHT = 80
_SEPARATOR = np.array([200, 200, 200], np.uint8)
_EPISODE_END = np.array([192, 57, 43], np.uint8)  # the dashboard's red


def image_kind(observation_space: Any) -> str | None:
    """How observations of this space are drawn: ``"channels"`` (bool [H, W, C], one
    channel per kind of object: MinAtar's palette), ``"rgb"`` (uint8 [H, W, 3]), ``"grey"``
    (uint8 [H, W, 1]), ``"stack"`` (uint8 [H, W, K], K grey frames, newest last: Atari's,
    drawn as its newest) or None (not an image: no strip)."""
    shape = tuple(getattr(observation_space, "shape", None) or ())
    dtype = getattr(observation_space, "dtype", None)
    if len(shape) != 3 or dtype is None:
        return None
    if np.dtype(dtype) == np.bool_:
        return "channels"
    if np.dtype(dtype) == np.uint8:
        return {1: "grey", 3: "rgb"}.get(shape[-1], "stack")
    return None


def not_image_reason(observation_space: Any) -> str:
    """One line on why this space's observations make no frame strip ("" if they do)."""
    if image_kind(observation_space) is not None:
        return ""
    shape = tuple(getattr(observation_space, "shape", None) or ())
    dtype = getattr(observation_space, "dtype", None)
    what = f"{np.dtype(dtype).name} {list(shape)}" if dtype is not None else \
        type(observation_space).__name__
    return (f"this env's observations ({what}) are not images (bool or uint8 [H, W, C]): no "
            "frame strip")


@dataclass(frozen=True)
class Frames:
    """The latest frames of one env (read-only arrays).

    Attributes:
      obs: [K, *obs_shape] as the batches hold them, oldest first; K <= `FRAME_STRIP_LENGTH`.
      env_steps: int64 [K], the run's env steps sampled when each frame's batch arrived.
      ends: bool [K], the episode ended at this step (the next frame starts a new one).
      worker_index, column: the worker whose env this is, and the env's column in its batches.
      kind: `image_kind` of the observations.
      version: counts the batches taken so far (a reader redraws only when it changed).
    """

    obs: np.ndarray
    env_steps: np.ndarray
    ends: np.ndarray
    worker_index: int
    column: int
    kind: str
    version: int


def frame_scale(height: int, target: int = DEFAULT_HEIGHT) -> int:
    """The whole factor that scales an image of ``height`` pixels up towards ``target``."""
    return max(1, target // max(1, int(height)))


def strip_rgb(frames: Frames, *, scale: int | None = None, gap: int = 2) -> np.ndarray:
    """The frames side by side as one RGB image, uint8 [H * scale, K * W * scale +
    (K - 1) * gap, 3]; `scale` (None: `frame_scale`) pixels per observation pixel, `gap`
    pixels between frames: grey, or red where the episode ended in between."""
    obs = np.asarray(frames.obs)
    K, H, W = obs.shape[:3]
    s = frame_scale(H) if scale is None else int(scale)
    if frames.kind == "channels":
        from impala_lab.envs.minatar import palette, to_rgb

        images = to_rgb(obs, palette(obs.shape[-1]), s)
    elif frames.kind in ("rgb", "grey", "stack"):
        images = obs if frames.kind == "rgb" else np.repeat(obs[..., -1:], 3, axis=-1)
        if s > 1:
            images = images.repeat(s, axis=1).repeat(s, axis=2)
    else:
        raise ValueError(f"kind={frames.kind!r} is not an image kind: use 'channels', 'rgb', "
                         "'grey' or 'stack'")
    h, w = H * s, W * s
    strip = np.empty((h, K * w + (K - 1) * gap, 3), np.uint8)
    for i in range(K):
        x = i * (w + gap)
        strip[:, x:x + w] = images[i]
        if i + 1 < K:
            strip[:, x + w:x + w + gap] = _EPISODE_END if frames.ends[i] else _SEPARATOR
    return strip

