"""Environments that ship with impala_lab, and `make_env`, which makes every env from an id.

Importing the package registers ``impala_lab/StatelessCartPole-v1`` and, when MinAtar is
installed, ``MinAtar/<Game>-v1`` with gymnasium. Atari's games (ale-py) are made with the
paper's preprocessing (`impala_lab.envs.atari`).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from impala_lab.config_checks import register_env_family
from impala_lab.envs.atari import is_atari, make_atari


def make_env(env_id: str, **kwargs: Any) -> gym.Env:
    """The env of a registered id, as impala_lab trains on it: ``gymnasium.make(env_id,
    **kwargs)``, with the paper's preprocessing for Atari's games (`make_atari`). Every env
    of a run (workers, probe, evaluation, ``impala-lab play``) is made here."""
    register_env_family(env_id)
    return make_atari(env_id, **kwargs) if is_atari(env_id) else gym.make(env_id, **kwargs)
