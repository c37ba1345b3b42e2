"""Atari's games from pixels, preprocessed as the IMPALA paper's agents saw them.

`impala_lab.envs.make_env` applies `preprocess` to every ALE env (ale-py, the ``atari`` extra),
made with frame skip 1, with gymnasium's own wrappers: `AtariPreprocessing` (up to 30 no-ops
at reset, frame skip 4 with the last two frames max-pooled, 84x84 grey),
`FrameStackObservation` (the last 4 frames) and `TransformObservation` (channels-last, uint8
[84, 84, 4], as the conv trunks take it). Rewards stay the game's (the learner clips them).
Sticky actions are off, as in the paper's and RLlib's Atari runs (ALE's v5 ids repeat the
previous action with probability 0.25 by default); the id keeps its frame limit
(docs/pixels.md).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["FRAME_STACK", "channels_last", "is_atari", "make_atari", "preprocess"]

FRAME_STACK = 4  # frames per observation


def is_atari(env_id: str) -> bool:
    """Whether a registered id is one of ale-py's Atari games."""
    try:
        return "ale_py" in str(gym.spec(env_id).entry_point)
    except gym.error.Error:  # not registered
        return False


def channels_last(stack: np.ndarray) -> np.ndarray:
    """A frame stack [K, H, W] as an image [H, W, K] (a view)."""
    return np.moveaxis(stack, 0, -1)


def preprocess(env: gym.Env, noop_max: int = 30, frame_skip: int = 4, screen_size: int = 84,
               stack: int = FRAME_STACK) -> gym.Env:
    """The paper's preprocessing around an ALE env made with ``frameskip=1``: observations
    uint8 [screen_size, screen_size, stack], the newest frame last."""
    env = gym.wrappers.AtariPreprocessing(env, noop_max=noop_max, frame_skip=frame_skip,
                                          screen_size=screen_size)
    env = gym.wrappers.FrameStackObservation(env, stack)
    space = gym.spaces.Box(0, 255, (screen_size, screen_size, stack), np.uint8)
    return gym.wrappers.TransformObservation(env, channels_last, space)


def make_atari(env_id: str, **kwargs: Any) -> gym.Env:
    """``gymnasium.make(env_id, frameskip=1, obs_type="grayscale",
    repeat_action_probability=0.0, **kwargs)``, then `preprocess`. The wrapper reads the
    emulator's screen itself and discards the base env's observation, so that one is the
    cheapest the env offers: grey is a third of RGB's copy."""
    import ale_py

    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner from every worker
    kwargs.setdefault("obs_type", "grayscale")
    kwargs.setdefault("repeat_action_probability", 0.0)
    return preprocess(gym.make(env_id, frameskip=1, **kwargs))
