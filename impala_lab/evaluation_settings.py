"""The evaluation fields of `ImpalaConfig` checked together (kept apart from config.py).

``evaluation_interval`` counts reports of ``train()`` (RLlib's evaluation_interval counts
training iterations; a report is this project's nearest thing), ``evaluation_num_episodes``
is how many episodes each evaluation plays per action choice, and ``evaluation_actions`` says
how the evaluated policy picks actions: ``"greedy"`` (the most likely action),
``"sampled"`` (drawn from the policy, as the actors do) or ``"both"``.
"""

from __future__ import annotations

import numbers
from typing import Any

from impala_lab.errors import ConfigError

EVALUATION_ACTIONS = ("greedy", "sampled", "both")


def evaluation_modes(actions: str) -> tuple[str, ...]:
    """The action choices an evaluation plays: ``("greedy",)``, ``("sampled",)`` or both."""
    return ("greedy", "sampled") if actions == "both" else (actions,)


def evaluation_enabled(config: Any) -> bool:
    """True when ``config.evaluation_interval`` asks for evaluations (not None, not 0)."""
    return bool(getattr(config, "evaluation_interval", None))


def check_evaluation_fields(config: Any) -> None:
    """Raise `ConfigError` naming the field, the value and the fix for a bad evaluation field."""
    interval = config.evaluation_interval
    if interval is not None and (isinstance(interval, bool) or not isinstance(
            interval, numbers.Integral) or interval < 0):
        raise ConfigError(
            f"evaluation_interval={interval!r} is invalid: give the number of train() reports "
            f"between evaluations (an integer >= 1), or 0/None to switch evaluation off")
    episodes = config.evaluation_num_episodes
    if isinstance(episodes, bool) or not isinstance(episodes, numbers.Integral) or episodes < 1:
        raise ConfigError(
            f"evaluation_num_episodes={episodes!r} is invalid: each evaluation needs at least "
            f"one episode; give a positive integer such as 10")
    if config.evaluation_actions not in EVALUATION_ACTIONS:
        raise ConfigError(
            f"evaluation_actions={config.evaluation_actions!r} is invalid: choose one of "
            f"{', '.join(map(repr, EVALUATION_ACTIONS))}")
