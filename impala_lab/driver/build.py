"""Building a run: its config, the checks before anything starts, the policy and its learner.

``Impala.__init__`` calls `as_config`, `check_env` (a `ConfigError` before TensorFlow loads or
any process starts), then, once the backend is prepared, `check_learner_devices`,
`initial_weights` (numpy: the workers sample with them) and `make_learner` (TensorFlow loads
here, while they sample).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from impala_lab.config import ImpalaConfig
from impala_lab.config_checks import env_package_hint
from impala_lab.errors import ConfigError
from impala_lab.model_spec import check_spaces, network_layout


def as_config(config: ImpalaConfig | Mapping[str, Any] | None,
              env_creator: Callable[[], Any] | None, overrides: dict[str, Any]
              ) -> ImpalaConfig:
    """``config`` (an `ImpalaConfig`, a dict of its fields or None for the defaults) with
    ``env_creator`` as its env and ``overrides`` applied."""
    if config is None:
        config = ImpalaConfig()
    elif isinstance(config, Mapping):
        config = ImpalaConfig.from_dict(config)
    elif not isinstance(config, ImpalaConfig):
        raise TypeError(f"config must be an ImpalaConfig or a dict, got "
                        f"{type(config).__name__}")
    if env_creator is not None:
        overrides["env"] = env_creator
    return config.replace(**overrides) if overrides else config


def probe_spaces(env: Any) -> tuple[Any, Any]:
    """Make one env in the driver to read its spaces (before any worker starts)."""
    from impala_lab.envs import make_env

    e = env() if callable(env) else make_env(env)
    try:
        return e.observation_space, e.action_space
    finally:
        e.close()


def _missing_package(config: ImpalaConfig, exc: BaseException) -> str:
    """``"; <which package to install>"`` when a registered env id failed for want of a
    package (gymnasium raises ``DependencyNotInstalled`` for MuJoCo's); "" otherwise."""
    missing = isinstance(exc, ImportError) or type(exc).__name__ == "DependencyNotInstalled"
    hint = env_package_hint(config.env) if isinstance(config.env, str) and missing else ""
    return f"; {hint}" if hint else ""


def check_env(config: ImpalaConfig) -> tuple[Any, Any]:
    """The env's spaces. An env that cannot be made, or whose spaces the model cannot take,
    is a config error (the CLI's exit code 2), raised before any process starts."""
    try:
        observation_space, action_space = probe_spaces(config.env)
    except Exception as exc:
        raise ConfigError(f"env={config.env_id!r} is invalid: it could not be made "
                          f"({type(exc).__name__}: {exc}){_missing_package(config, exc)}"
                          ) from exc
    filters = config.conv_filters if config.conv_net == "cnn" else None
    try:
        check_spaces(observation_space, action_space, filters)
    except ValueError as exc:
        if filters is not None:
            try:  # the env is fine, the layers do not fit its images
                check_spaces(observation_space, action_space)
            except ValueError:
                pass
            else:
                raise ConfigError(f"conv_filters={[list(f) for f in filters]!r} is invalid for "
                                  f"env={config.env_id!r}: its {exc}") from None
        raise ConfigError(f"env={config.env_id!r} is invalid: its {exc}") from None
    if config.vector_env:
        from impala_lab.envs.vector import vector_env_problem

        problem = vector_env_problem(config.env)
        if problem is not None:
            raise ConfigError(f"vector_env=True is invalid for env={config.env_id!r}: {problem}")
    bounds = (getattr(action_space, "low", None), getattr(action_space, "high", None))
    if config.squash_actions and bounds[0] is not None and not all(
            np.isfinite(b).all() for b in bounds):
        raise ConfigError(
            f"squash_actions=True is invalid for env={config.env_id!r}: its action space "
            f"{action_space} has infinite bounds, which tanh cannot squash into; set "
            "squash_actions=False (clip_actions clips where the bounds are finite)")
    if config.normalize_obs and len(observation_space.shape) != 1:
        raise ConfigError(
            f"normalize_obs=True is invalid for env={config.env_id!r}: its observations are "
            f"images {tuple(observation_space.shape)}, which the network already scales to "
            "[0, 1]; normalisation is for vector observations: set normalize_obs=False")
    # Validation counted one float per observation; now the real sizes are known.
    config.check_memory(observation_space, action_space)
    return observation_space, action_space


def initial_weights(config: ImpalaConfig, observation_space: Any, action_space: Any
                    ) -> list[np.ndarray]:
    """The weights a new learner starts from (version 0), in numpy (`NetworkLayout`)."""
    return network_layout(config.model_spec, observation_space, action_space).initial_weights(
        config.seed)


def check_learner_devices(config: ImpalaConfig) -> None:
    """Set up the multi-GPU learner's devices (fake ones on a CPU) before TensorFlow
    initialises; a device the machine lacks is a `ConfigError`."""
    if config.uses_multi_gpu_learner:
        from impala_lab.learner.multi_gpu_learner import configure_learner_devices

        configure_learner_devices(config)


def make_learner(config: ImpalaConfig, observation_space: Any, action_space: Any
                 ) -> tuple[Any, Any]:
    """The policy (TensorFlow loads here) and its learner thread, unstarted. The policy is the
    speed door's `CompiledPolicy` unless ``IMPALA_LAB_PLAIN`` turns the door off."""
    from impala_lab import speed

    if speed.enabled():
        from impala_lab.speed.lean_imports import lean_imports

        with lean_imports():  # only where the command line owns the process
            from impala_lab.speed.compiled_policy import CompiledPolicy as policy_class
    else:
        from impala_lab.learner.vtrace_policy import VTracePolicy as policy_class
    policy = policy_class(observation_space, action_space, config)
    if config.uses_multi_gpu_learner:
        from impala_lab.learner.multi_gpu_learner import MultiGPULearner

        return policy, MultiGPULearner(policy, config)
    from impala_lab.learner.learner_thread import LearnerThread

    return policy, LearnerThread(policy, config.minibatch_buffer_size, config.num_sgd_iter,
                                 config.learner_queue_size, config.learner_queue_timeout)
