"""The checks of an `impala_lab.config.ImpalaConfig`: every field's type, range and choices,
then the values that are fine alone but cannot work together. Each error is a `ConfigError`
naming the field, the value and the fix, raised when the config is built. The typed-field
helpers (`field_kinds`, `check_type`, `parse_text`) know only types; the CLI uses them too.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import math
import numbers
import os
import typing
from typing import Any

from impala_lab.errors import ConfigError
from impala_lab.model_spec import CONV_NETS
from impala_lab.schedules import check_schedule, parse_schedule

BACKENDS = ("process", "inline", "ray")
OPTIMIZERS = ("adam", "rmsprop")
OFF_POLICY_CORRECTIONS = ("vtrace", "is1", "epsilon", "none")
LOSSES = ("impala", "appo")
TRUNCATION_BOOTSTRAPS = ("actor", "learner")
EVALUATION_ACTIONS = ("greedy", "sampled", "both")
WORKERS_PER_CPU = 8  # worker processes per CPU a config may ask for (max_num_workers=None)

# (how an env id starts, the package that registers it when installed).
ENV_PACKAGES = (
    ("ALE/", "Atari's games come with ale-py and OpenCV: pip install 'impala_lab[atari]'"),
    ("MinAtar/", "MinAtar's games come with minatar: pip install 'impala_lab[minatar]'"),
    (("Ant-", "HalfCheetah-", "Hopper-", "Humanoid", "InvertedPendulum-", "Pusher-",
      "Reacher-", "Swimmer-", "Walker2d-", "InvertedDoublePendulum-"),
     "MuJoCo's envs come with the mujoco package: pip install 'impala_lab[mujoco]'"),
    (("LunarLander", "BipedalWalker", "CarRacing-"),
     "Box2D's envs come with box2d: pip install 'gymnasium[box2d]'"),
)


# Packages that register an id family when imported (gymnasium 1 loads no plugins by itself).
ENV_REGISTRARS = {"ALE/": "ale_py"}


def register_env_family(env_id: str) -> bool:
    """Whether the package that registers ``env_id``'s family (`ENV_REGISTRARS`) is installed;
    imports it if the id is not registered yet."""
    import gymnasium

    module = next((m for start, m in ENV_REGISTRARS.items() if env_id.startswith(start)), None)
    if module is None or importlib.util.find_spec(module) is None:
        return False
    if env_id not in gymnasium.registry:
        importlib.import_module(module)
    return True


def env_package_hint(env_id: str) -> str:
    """Which package registers ``env_id``'s family, when gymnasium does not know it ("" if
    none of `ENV_PACKAGES`)."""
    return next((text for start, text in ENV_PACKAGES if env_id.startswith(start)), "")


# ---------------------------------------------------------------------- typed fields
def bad(name: str, value: Any, fix: str) -> typing.NoReturn:
    raise ConfigError(f"{name}={value!r} is invalid: {fix}")


def check_range(name: str, value: float, lo: float, hi: float) -> None:
    if not (lo <= value <= hi) or math.isnan(value):
        span = f"in [{lo}, {hi}]" if math.isfinite(hi) else f">= {lo}"
        bad(name, value, f"it must be {span}")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        close = difflib.get_close_matches(value, choices, n=1, cutoff=0.4)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        bad(name, value, f"choose one of {', '.join(map(repr, choices))}{hint}")


_SCALAR_KINDS = {bool: "bool", int: "int", float: "float", str: "str"}
_EXPECTED = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
             "model": "a list of positive integers, e.g. [64, 64]",
             "env": "a gymnasium env id or an env factory",
             "filters": "a list of [filters, kernel, stride] triples, e.g. [[16, 3, 1]]"}


@functools.cache
def field_kinds(cls: type) -> dict[str, str]:
    """Each field's kind: its ``kind`` metadata, or from its annotation ``int``, ``float``,
    ``bool``, ``str``, with ``?`` for ``X | None``."""
    hints = typing.get_type_hints(cls)
    kinds = {}
    for f in dataclasses.fields(cls):
        if "kind" in f.metadata:
            kinds[f.name] = f.metadata["kind"]
            continue
        hint, optional = hints[f.name], ""
        args = typing.get_args(hint)
        if type(None) in args:
            (hint,) = (a for a in args if a is not type(None))
            optional = "?"
        kinds[f.name] = _SCALAR_KINDS[hint] + optional
    return kinds


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_type(name: str, kind: str, value: Any) -> None:
    """Raise `ConfigError` unless ``value`` is of ``kind`` (see `field_kinds`); the message
    names the field, the value, its type and what it must be."""
    base = kind.rstrip("?")
    if kind.endswith("?") and value is None:
        return
    if base == "float" and isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            finite = math.isfinite(float(value))
        except OverflowError:  # an int too large for a float
            finite = False
        if not finite:
            bad(name, value, "it must be a finite number")
        return
    if base == "schedule":
        check_schedule(name, value)  # its own message: the points and what they must be
        return
    ok = {"bool": lambda: isinstance(value, bool),
          "int": lambda: _is_int(value),
          "float": lambda: False,  # not a real number (the real ones returned above)
          "str": lambda: isinstance(value, str),
          "model": lambda: isinstance(value, tuple | list) and all(map(_is_int, value)),
          "env": lambda: isinstance(value, str) or callable(value),
          "filters": lambda: isinstance(value, tuple | list) and all(
              isinstance(f, tuple | list) and len(f) == 3 and all(map(_is_int, f))
              for f in value)}[base]()
    if not ok:
        expected = _EXPECTED[base] + (" or None" if kind.endswith("?") else "")
        raise ConfigError(
            f"{name}={value!r} has type {type(value).__name__}: it must be {expected}")


def parse_text(name: str, kind: str, text: str) -> Any:
    """A command-line flag's text as a value of ``kind`` (see `field_kinds`); a text that is
    not one is a `ConfigError` naming the flag and what it must be."""
    base = kind.rstrip("?")
    if kind.endswith("?") and text.lower() in ("none", "null"):
        return None
    try:
        if base == "int":
            return int(text)
        if base == "float":
            return float(text)
        if base == "bool":
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if base == "model":
            return tuple(int(x) for x in text.replace(",", " ").split())
        if base == "schedule":  # 0:0.003,2e6:0: (env steps, value) per point
            return parse_schedule(text)
        if base == "filters":  # 16x3x1,32x3x1: (filters, kernel, stride) per layer
            layers = tuple(tuple(int(v) for v in layer.split("x"))
                           for layer in text.replace(",", " ").split())
            if not layers or any(len(layer) != 3 for layer in layers):
                raise ValueError(text)
            return layers
    except ValueError:
        expected = {"int": "an integer", "float": "a number", "bool": "true or false",
                    "model": "hidden sizes such as 64,64",
                    "filters": "conv layers FILTERSxKERNELxSTRIDE such as 16x3x1,32x3x1",
                    "schedule": "points ENV_STEPS:VALUE such as 0:0.003,2e6:0"}[base]
        raise ConfigError(f"--{name.replace('_', '-')}={text!r} is invalid: it must be "
                          f"{expected}") from None
    return text


# ---------------------------------------------------------------------- the config's checks
def validate(config: Any) -> None:
    """Raise `ConfigError` on the first value of ``config`` (an `ImpalaConfig`) that cannot
    work: types, the env id, each field's range, then combinations."""
    kinds = field_kinds(type(config))
    for f in dataclasses.fields(config):
        check_type(f.name, kinds[f.name], getattr(config, f.name))
    _check_env(config)
    _check_workers(config)
    _check_values(config)
    _check_evaluation(config)
    _check_combinations(config)


def _check_env(c: Any) -> None:
    if callable(c.env):
        return
    if not isinstance(c.env, str) or not c.env:
        bad("env", c.env, "give a gymnasium env id such as 'CartPole-v1' or a factory")
    import gymnasium

    installed = register_env_family(c.env)
    if c.env not in gymnasium.registry:
        hint = _unknown_env_hint(c.env, list(gymnasium.registry), installed)
        bad("env", c.env, f"gymnasium does not know this env id; {hint}")


def _unknown_env_hint(env_id: str, ids: list[str], installed: bool) -> str:
    """The registered versions of the same env, else its family's package, else close ids."""
    versions = sorted(k for k in ids if k.rsplit("-v", 1)[0] == env_id.rsplit("-v", 1)[0])
    if versions:
        return f"the registered versions are {', '.join(map(repr, versions))}"
    close = difflib.get_close_matches(env_id, ids, n=3, cutoff=0.5)
    return (not installed and env_package_hint(env_id)) or (
        f"did you mean {', '.join(map(repr, close))}?" if close else
        "see gymnasium.pprint_registry() for the registered ids")


def _check_workers(c: Any) -> None:
    """At least one worker, and no more than this machine can hold (a Ray cluster's aside)."""
    if c.num_workers < 1:
        bad("num_workers", c.num_workers,
            "training would hang with no worker to sample; set num_workers >= 1")
    if c.max_num_workers is not None and c.max_num_workers < 1:
        bad("max_num_workers", c.max_num_workers, "use a positive integer, or None")
    limit = c.max_num_workers or WORKERS_PER_CPU * (os.cpu_count() or 1)
    source = "max_num_workers" if c.max_num_workers else f"{WORKERS_PER_CPU} per CPU"
    if c.num_workers > limit and not (c.backend == "ray" and c.ray_address):
        bad("num_workers", c.num_workers,
            f"it exceeds {limit} worker processes on this machine ({source}), which would "
            "fill its memory and process table; lower it, or raise max_num_workers if the "
            "machine can take them")


def _check_values(c: Any) -> None:
    """Each field on its own: ranges and choices."""
    for name in ("num_envs_per_worker", "sample_batch_size", "train_batch_size",
                 "max_sample_requests_in_flight_per_worker", "broadcast_interval",
                 "num_sgd_iter", "minibatch_buffer_size", "learner_queue_size",
                 "num_data_loader_buffers", "tf_intra_op_threads", "lstm_cell_size"):
        if getattr(c, name) < 1:
            bad(name, getattr(c, name), "it must be a positive integer (>= 1)")
    _check_upper_bounds(c)
    for name in ("lr", "grad_clip", "learner_queue_timeout", "epsilon", "reward_scale",
                 "clip_param", "kl_target"):
        value = getattr(c, name)
        if not (value > 0 and math.isfinite(value)):
            bad(name, value, "it must be a positive finite number")
    if c.backend == "ray" and importlib.util.find_spec("ray") is None:
        bad("backend", c.backend, "Ray is not installed: pip install 'impala_lab[ray]', or use "
            "backend='process' on this machine")
    if c.seed is not None and not 0 <= c.seed < 2**63:
        bad("seed", c.seed, "use an integer in [0, 2**63), or None for a random seed "
            "(TensorFlow keeps seeds as int64)")
    if c.num_gpus < 0:
        bad("num_gpus", c.num_gpus, "use 0 or 1 for one learner device, > 1 for several")
    if c.replay_buffer_num_slots < 0:
        bad("replay_buffer_num_slots", c.replay_buffer_num_slots, "use 0 to disable replay")
    check_range("log_std_init", c.log_std_init, -5.0, 2.0)  # std 0.007 to 7.4
    for name in ("gamma", "decay", "momentum"):
        check_range(name, getattr(c, name), 0.0, 1.0)
    for name in ("vf_loss_coeff", "entropy_coeff", "replay_proportion", "action_bound_coeff",
                 "kl_coeff"):
        check_range(name, getattr(c, name), 0.0, math.inf)
    for name in ("vtrace_clip_rho_threshold", "vtrace_clip_pg_rho_threshold", "clip_rewards"):
        value = getattr(c, name)
        if value is not None and not (value > 0 and math.isfinite(value)):
            bad(name, value, "use a positive number, or None to disable the clip")
    for name, unit in (("sample_timeout_s", "seconds, or None to wait forever"),
                       ("max_memory_gb", "GB, or None for half of the available memory")):
        if getattr(c, name) is not None and not getattr(c, name) > 0:
            bad(name, getattr(c, name), f"use a positive number of {unit}")
    if not c.model or any(h < 1 for h in c.model):
        bad("model", c.model, "give one or more positive hidden sizes, e.g. [64, 64]")
    if not c.impala_channels or any(ch < 1 for ch in c.impala_channels):
        bad("impala_channels", c.impala_channels,
            "give one or more positive stack widths, e.g. [16, 32, 32]")
    if c.conv_filters is not None and (not c.conv_filters or any(
            min(f) < 1 for f in c.conv_filters)):
        bad("conv_filters", c.conv_filters, "give one or more [filters, kernel, stride] "
            "triples of positive integers, e.g. [[16, 3, 1]], or None to pick by image size")
    for name, choices in (("backend", BACKENDS), ("conv_net", CONV_NETS),
                          ("opt_type", OPTIMIZERS),
                          ("off_policy_correction", OFF_POLICY_CORRECTIONS),
                          ("loss", LOSSES), ("truncation_bootstrap", TRUNCATION_BOOTSTRAPS)):
        check_choice(name, getattr(c, name), choices)
    for name in ("max_policy_lag", "extra_policy_lag"):
        if getattr(c, name) < 0:
            bad(name, getattr(c, name), "it must be a non-negative integer (>= 0)")


# The largest value of each count and time nothing else bounds (sizes of data are the memory
# estimate's, `impala_lab.memory_budget`; every int stays below `MAX_COUNT`: no overflow).
MAX_COUNT = 2**31 - 1
UPPER_BOUNDS: dict[str, tuple[int | float, str]] = {
    "num_envs_per_worker": (10_000, "more envs belong in more workers"),
    "broadcast_interval": (1_000_000, "the workers would act with their first weights"),
    "num_sgd_iter": (1_000, "each batch would be trained on that many times"),
    "num_gpus": (256, "no machine has more learner devices"),
    "max_policy_lag": (10**9, "use 10**9 to keep every batch"),
    "extra_policy_lag": (1_000_000, "the workers would act with their first weights"),
    "evaluation_interval": (10**9, "use None to switch evaluation off"),
    "evaluation_num_episodes": (10_000, "each evaluation plays its episodes one by one in "
                                        "the driver"),
    "max_num_workers": (1_000_000, "no machine runs more worker processes"),
    "learner_queue_timeout": (1e7, "longer waits are not timeouts"),
    "sample_timeout_s": (1e7, "use None to wait forever"),
}
_SIZES = ("model", "impala_channels")  # tuples of widths


def tf_thread_limit() -> int:
    """The most TensorFlow intra-op threads a config may ask for on this machine."""
    return max(8, 4 * (os.cpu_count() or 1))


def _check_upper_bounds(c: Any) -> None:
    """No count or time beyond what can work (each one's reason in `UPPER_BOUNDS`)."""
    for name, (limit, why) in UPPER_BOUNDS.items():
        value = getattr(c, name)
        if value is not None and value > limit:
            bad(name, value, f"it must be at most {limit:,}: {why}")
    threads = tf_thread_limit()
    if c.tf_intra_op_threads > threads:
        bad("tf_intra_op_threads", c.tf_intra_op_threads,
            f"it must be at most {threads} on this machine ({os.cpu_count()} CPUs): more "
            "threads than that only wait for each other")
    for name, kind in field_kinds(type(c)).items():
        value = getattr(c, name)
        values = ([value] if kind.rstrip("?") == "int" else list(value or ()) if name in _SIZES
                  else [v for layer in value or () for v in layer] if name == "conv_filters"
                  else [])
        if any(v > MAX_COUNT for v in values if v is not None) and name != "seed":
            bad(name, value, f"it must be at most {MAX_COUNT:,} (2**31 - 1)")


def _check_evaluation(c: Any) -> None:
    interval = c.evaluation_interval
    if interval is not None and interval < 0:
        bad("evaluation_interval", interval, "give the number of train() reports between "
            "evaluations (an integer >= 1), or 0/None to switch evaluation off")
    if c.evaluation_num_episodes < 1:
        bad("evaluation_num_episodes", c.evaluation_num_episodes,
            "each evaluation needs at least one episode; give a positive integer such as 10")
    check_choice("evaluation_actions", c.evaluation_actions, EVALUATION_ACTIONS)


def _check_combinations(c: Any) -> None:
    """Values that are fine alone but cannot work together."""
    if c.replay_proportion > 0:
        # Replay starts once the store holds more than ceil(train / sample) batches.
        needed = math.ceil(c.train_batch_size / c.sample_batch_size) + 1
        if c.replay_buffer_num_slots < needed:
            bad("replay_buffer_num_slots", c.replay_buffer_num_slots,
                f"with replay_proportion={c.replay_proportion} the replay buffer "
                f"(replay_buffer_num_slots * sample_batch_size = "
                f"{c.replay_buffer_num_slots * c.sample_batch_size}) must hold more than "
                f"train_batch_size={c.train_batch_size} steps; set replay_buffer_num_slots to "
                f"at least {needed}, or replay_proportion=0")
    if c.uses_multi_gpu_learner:
        if c.num_data_loader_buffers < c.minibatch_buffer_size:
            bad("num_data_loader_buffers", c.num_data_loader_buffers,
                f"the multi-device learner needs at least as many data loader buffers as "
                f"minibatch buffers (minibatch_buffer_size={c.minibatch_buffer_size}); raise "
                f"num_data_loader_buffers or lower minibatch_buffer_size")
        if c.train_batch_columns % c.num_learner_devices:
            bad("train_batch_size", c.train_batch_size,
                f"a train batch has {c.train_batch_columns} columns (sample batches of "
                f"{c.sample_batch_size} x {c.num_envs_per_worker} env steps concatenated to "
                f"reach train_batch_size), which does not split evenly across "
                f"{c.num_learner_devices} learner devices; choose train_batch_size and "
                f"num_envs_per_worker so that the column count is a multiple of num_gpus")
    _check_minibatches(c)
    if c.loss == "appo" and c.off_policy_correction != "vtrace":
        bad("loss", c.loss, f"APPO's advantages are V-trace's, but off_policy_correction="
            f"{c.off_policy_correction!r}; set off_policy_correction='vtrace' (or leave it out), "
            "or loss='impala'")
    if c.use_kl_loss and c.loss != "appo":
        bad("use_kl_loss", c.use_kl_loss, "the KL penalty is APPO's; set loss='appo', or "
            "use_kl_loss=False")
    if c.fake_gpus and c.num_gpus < 1:
        bad("fake_gpus", c.fake_gpus, "set num_gpus >= 1 to say how many fake devices")
    if not c.vtrace and c.off_policy_correction == "vtrace":
        raise ConfigError(
            "vtrace=False and off_policy_correction='vtrace' conflict: vtrace=False is "
            "RLlib's loss without V-trace; set off_policy_correction='none' (that loss), "
            "'is1' or 'epsilon', or leave vtrace out (it follows off_policy_correction)")
    if c.vtrace and c.off_policy_correction != "vtrace":
        raise ConfigError(
            f"vtrace=True and off_policy_correction={c.off_policy_correction!r} conflict: "
            f"vtrace=True trains with V-trace; leave vtrace out (it follows "
            f"off_policy_correction) to train with {c.off_policy_correction!r}")
    if c.max_policy_lag <= c.extra_policy_lag:
        bad("max_policy_lag", c.max_policy_lag,
            f"with extra_policy_lag={c.extra_policy_lag} every batch arrives at least that many "
            f"updates behind and more than max_policy_lag would be dropped; set "
            f"max_policy_lag above extra_policy_lag (e.g. {2 * c.extra_policy_lag + 10}) or "
            f"lower extra_policy_lag")


def _check_minibatches(c: Any) -> None:
    """minibatch_size: whole columns that split every train batch evenly, on one device."""
    size = c.minibatch_size
    if size is None:
        return
    T, columns = c.sample_batch_size, c.train_batch_columns
    fits = [k * T for k in range(1, columns + 1) if columns % k == 0]
    if size < 1 or size % T or columns % (size // T):
        bad("minibatch_size", size,
            f"a minibatch is whole columns of sample_batch_size={T} steps that split the train "
            f"batch's {columns} columns evenly; choose one of {fits}, or None")
    if c.uses_multi_gpu_learner:
        bad("minibatch_size", size, "minibatches run on the single-device learner; set "
            "num_gpus <= 1 and num_data_loader_buffers=1, or minibatch_size=None")
