"""`LatestFrames`: the latest frames of one worker's env, kept by the driver.

The driver copies the last K steps of column 0 of ``obs [T, B, *obs_shape]`` from each new
batch of the live worker with the lowest index (before the replay mixer: a replay never shows
as new), so the dashboard shows what an actor sees without asking the actors.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from impala_lab.envs.frames import FRAME_STRIP_LENGTH, Frames, image_kind

__all__ = ["LatestFrames"]


class LatestFrames:
    """Keeps the last ``length`` frames of env ``column`` of the lowest live worker's batches
    (none for observations that are not images). ``observe`` runs in the driver's thread,
    ``latest`` in any: new arrays are swapped in under a lock, never written into."""

    def __init__(self, observation_space: Any, length: int = FRAME_STRIP_LENGTH,
                 column: int = 0) -> None:
        if length < 1:
            raise ValueError(f"length={length!r} is invalid: keep at least one frame")
        self.kind = image_kind(observation_space)
        self.length = int(length)
        self.column = int(column)
        self._lock = threading.Lock()
        self._frames: Frames | None = None

    def observe(self, worker_index: int, batch: Any, *, lowest_live_index: int,
                env_steps: int) -> bool:
        """Take the last K frames of a new `SampleBatch` [T, B] if ``worker_index`` sampled it
        and is ``lowest_live_index`` (the worker followed; a new one starts the strip anew);
        ``env_steps``: the run's, this batch included. Returns whether frames were taken."""
        if self.kind is None or worker_index != lowest_live_index:
            return False
        T = batch.obs.shape[0]
        n = min(T, self.length)
        # Copies, so that no view keeps the batch (or a Ray object) alive.
        obs = np.array(batch.obs[T - n:, self.column])
        ends = np.array(batch.terminateds[T - n:, self.column]
                        | batch.truncateds[T - n:, self.column])
        steps = np.full(n, env_steps, np.int64)
        with self._lock:
            old = self._frames
            if old is not None and old.worker_index == worker_index and n < self.length:
                keep = self.length - n
                obs = np.concatenate([old.obs[-keep:], obs])
                ends = np.concatenate([old.ends[-keep:], ends])
                steps = np.concatenate([old.env_steps[-keep:], steps])
            for a in (obs, ends, steps):
                a.flags.writeable = False
            self._frames = Frames(obs=obs, env_steps=steps, ends=ends,
                                  worker_index=int(worker_index), column=self.column,
                                  kind=self.kind, version=(old.version + 1 if old else 1))
        return True

    def latest(self) -> Frames | None:
        """The frames kept so far, or None (none yet, or not images)."""
        with self._lock:
            return self._frames
