"""Which package registers an env id that gymnasium does not know, for the config's error.

Pure Python: the config imports it before anything heavy loads.
"""

from __future__ import annotations

__all__ = ["ENV_PACKAGES", "env_package_hint"]

# Env ids that packages register when installed: (how the id starts, the package to install).
ENV_PACKAGES = (
    ("ALE/", "Atari's games come with ale-py: pip install ale-py (or 'gymnasium[atari]')"),
    ("MinAtar/", "MinAtar's games come with minatar: pip install 'impala_lab[minatar]'"),
    (("Ant-", "HalfCheetah-", "Hopper-", "Humanoid", "InvertedPendulum-", "Pusher-",
      "Reacher-", "Swimmer-", "Walker2d-", "InvertedDoublePendulum-"),
     "MuJoCo's envs come with the mujoco package: pip install 'impala_lab[mujoco]'"),
    (("LunarLander", "BipedalWalker", "CarRacing-"),
     "Box2D's envs come with box2d: pip install 'gymnasium[box2d]'"),
)


def env_package_hint(env_id: str) -> str:
    """Which package registers ``env_id``'s family, when gymnasium does not know it ("" if
    none of `ENV_PACKAGES`)."""
    return next((text for start, text in ENV_PACKAGES if env_id.startswith(start)), "")
