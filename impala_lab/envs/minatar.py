"""MinAtar's games (Young & Tian 2019) as gymnasium envs that an actor process can afford.

Importing `impala_lab` registers ``MinAtar/<Game>-v0`` (all 6 actions) and ``-v1`` (the
minimal action set) with `MinAtarEnv`, which loads only the game's own module (numpy), renders
uint8 frames in MinAtar's colours and seeds the game and its sticky actions from
``reset(seed=s)``; docs/pixels.md says why MinAtar's own registration is not used. The games
keep MinAtar's sticky actions (0.1), difficulty ramp and episode ends (no time limit added).
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib
from types import ModuleType
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["GAMES", "MinAtarEnv", "palette", "register", "to_rgb"]

# Registered name -> MinAtar's module name.
GAMES = {"Asterix": "asterix", "Breakout": "breakout", "Freeway": "freeway",
         "Seaquest": "seaquest", "SpaceInvaders": "space_invaders"}
_NUM_ACTIONS = 6  # all MinAtar games share the full action set (n, l, u, r, d, f)


@functools.cache
def _game_module(game: str) -> ModuleType:
    """MinAtar's module for ``game``, loaded from the installed package's file without running
    ``minatar/__init__.py`` (which imports pyplot and seaborn)."""
    spec = importlib.util.find_spec("minatar")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "MinAtar is not installed: pip install minatar (or impala_lab[minatar])")
    path = pathlib.Path(next(iter(spec.submodule_search_locations)), "environments",
                        f"{game}.py")
    module_spec = importlib.util.spec_from_file_location(f"_impala_lab_minatar_{game}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


@functools.cache
def palette(channels: int) -> np.ndarray:
    """MinAtar's colours: uint8 [channels + 1, 3], black for an empty cell, then seaborn's
    ``color_palette("cubehelix", channels)``. Cached and shared, so read-only."""
    from matplotlib import colormaps  # only when rendering

    points = np.linspace(0.0, 1.0, channels + 2)[1:-1]
    colours = colormaps["cubehelix"](points)[:, :3]
    table = np.round(np.vstack([np.zeros((1, 3)), colours]) * 255).astype(np.uint8)
    table.flags.writeable = False
    return table


def to_rgb(obs: np.ndarray, colours: np.ndarray, scale: int = 1) -> np.ndarray:
    """An observation, bool or 0/1 [(N,) H, W, C], as an image uint8 [(N,) H * scale,
    W * scale, 3]: each cell takes the colour (`palette`) of its last channel that is on."""
    obs = np.asarray(obs)
    channel_ids = np.arange(1, obs.shape[-1] + 1, dtype=np.int64)
    index = np.max(obs.astype(np.int64) * channel_ids, axis=-1)  # 0 = empty
    image = colours[index]
    if scale > 1:
        image = image.repeat(scale, axis=-3).repeat(scale, axis=-2)
    return image


class MinAtarEnv(gym.Env):
    """One MinAtar game as a gymnasium env: observation bool [10, 10, C], Discrete actions.

    Args:
      game: MinAtar's module name ("breakout", "space_invaders", ...).
      use_minimal_action_set: the game's minimal action set (the v1 ids) or all 6 (v0).
      sticky_action_prob: probability that the previous action repeats.
      render_mode: None or "rgb_array" (uint8, `render_scale` pixels per cell).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 15}

    def __init__(self, game: str, use_minimal_action_set: bool = True,
                 sticky_action_prob: float = 0.1, difficulty_ramping: bool = True,
                 render_mode: str | None = None, render_scale: int = 16) -> None:
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode={render_mode!r} is not supported: use None or "
                             "'rgb_array'")
        self.game_name = game
        self.game = _game_module(game).Env(ramping=difficulty_ramping)
        self.sticky_action_prob = float(sticky_action_prob)
        self.render_mode = render_mode
        self.render_scale = int(render_scale)
        self.action_set = (list(self.game.minimal_action_set()) if use_minimal_action_set
                           else list(range(_NUM_ACTIONS)))
        self.action_space = gym.spaces.Discrete(len(self.action_set))
        self.observation_space = gym.spaces.Box(0, 1, self.game.state_shape(), bool)
        self._rng = np.random.RandomState()
        self.game.random = self._rng
        self._last_action = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None
              ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if seed is not None:  # one stream for the game and its sticky actions, as MinAtar's
            self._rng = np.random.RandomState(seed)
            self.game.random = self._rng
        self.game.reset()
        self._last_action = 0
        return self.game.state(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        a = self.action_set[int(action)]
        if self._rng.rand() < self.sticky_action_prob:
            a = self._last_action
        self._last_action = a
        reward, terminal = self.game.act(a)
        return self.game.state(), float(reward), bool(terminal), False, {}

    def render(self) -> np.ndarray | None:
        if self.render_mode is None:
            return None
        return to_rgb(self.game.state(), palette(self.observation_space.shape[-1]),
                      self.render_scale)


def register() -> None:
    """Registers ``MinAtar/<Game>-v0`` and ``-v1`` if MinAtar is installed."""
    if importlib.util.find_spec("minatar") is None:
        return
    for name, game in GAMES.items():
        for version, minimal in (("v0", False), ("v1", True)):
            env_id = f"MinAtar/{name}-{version}"
            if env_id not in gym.registry:
                gym.register(id=env_id, entry_point=MinAtarEnv,
                             kwargs={"game": game, "use_minimal_action_set": minimal})
