"""How many bytes a config's data needs, and whether that fits: a config is refused before any
process starts rather than failing with an out-of-memory error in the middle of a run.

`memory_estimate` adds up the parts that grow with the config's sizes; `check_memory` compares
the total with ``max_memory_gb`` (None: half of `available_memory_bytes`) and names the fields
to lower. ``ImpalaConfig.memory_estimate`` and ``ImpalaConfig.check_memory`` call them;
validation calls the check without an env (one float per observation, a lower bound) and
``Impala`` again with the env's spaces.

The estimate reads the sizes it needs through `MemorySizes`, a Protocol defined here that
``ImpalaConfig`` satisfies (this module never imports the config: no import circle), and the
network through the config's `ModelSpec`.

Pure Python: imports nothing of the package but its errors and the model spec.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from impala_lab.errors import ConfigError
from impala_lab.model_spec import ModelSpec


class MemorySizes(Protocol):
    """The sizes the estimate reads (``ImpalaConfig``'s fields and derived values, by name);
    ``check_memory`` also reads the fields it names in its error with ``getattr``."""

    @property
    def model_spec(self) -> ModelSpec: ...
    sample_batch_size: int
    num_envs_per_worker: int
    train_batch_size: int
    learner_queue_size: int
    minibatch_buffer_size: int
    num_data_loader_buffers: int
    replay_buffer_num_slots: int
    num_workers: int
    max_sample_requests_in_flight_per_worker: int
    max_memory_gb: float | None

    @property
    def train_batch_columns(self) -> int: ...
    @property
    def uses_multi_gpu_learner(self) -> bool: ...
    @property
    def sample_steps(self) -> int: ...
# The fields that size each part of the estimate.
PART_FIELDS: dict[str, tuple[str, ...]] = {
    "learner queue": ("learner_queue_size", "train_batch_size"),
    "batch buffer": ("train_batch_size",),
    "minibatch ring": ("minibatch_buffer_size", "num_data_loader_buffers", "train_batch_size"),
    "replay": ("replay_buffer_num_slots", "sample_batch_size", "num_envs_per_worker"),
    "samples in flight": ("num_workers", "max_sample_requests_in_flight_per_worker",
                          "sample_batch_size", "num_envs_per_worker"),
    "learner working set": ("train_batch_size", "model"),
    "weights": ("model", "num_workers"),
}
# Copies of the weights (besides the LSTM's, counted in the working set): the learner's
# variables, their gradient, Adam's two slots and the flat vector it broadcasts from (5), the
# shared-memory blocks of the latest broadcast and the two kept for reuse (3), and one in each
# worker (num_workers more).
LEARNER_WEIGHT_COPIES = 5 + 3
# With use_lstm, lstm_cell_size also sizes every part: the batches' state_in, and the learner's
# per-step activations and the LSTM's weights.


def memory_estimate(config: MemorySizes, observation_space: Any = None,
                    action_space: Any = None) -> dict[str, int]:
    """Bytes ``config`` needs for its data, by part (``"total"`` is their sum).

    Args:
      config: the config.
      observation_space: the env's observation space (its ``shape`` and ``dtype``);
        None counts one float32 element per observation (a lower bound, what
        validation uses: it makes no env).
      action_space: the env's action space: a Discrete's ``n`` logits and one int64
        action per step, or a Box's D float32 actions and 2D distribution inputs (mean and
        log-std); None counts 2 actions.

    The parts: the learner queue (learner_queue_size train batches), the batch buffer
    (the samples of the train batch being gathered, and their concatenation), the
    minibatch ring (and the multi-GPU learner's loader buffers), the replay store, the
    samples in flight (each in a worker and in the driver), and the learner's working set
    (its tensor copy of a batch, and activations and gradients per env step: 8 bytes per
    hidden or conv unit per trunk, 12 per observation element, 400 for the loss, measured
    on TensorFlow 2.16-2.20 to within 1.1x for 16- to 256-unit MLPs). Not counted: the
    fixed costs (TensorFlow about 0.6 GB, each worker process about 45 MB).

    A recurrent policy (``use_lstm``, C = ``lstm_cell_size``) adds to every batch its
    ``state_in`` (float32 [B, 2, C]: 8 C bytes per column), to the learner's working set
    `LSTM_STEP_BYTES_PER_UNIT` bytes per env step and unit of C (the unroll keeps each step's
    gates and state for the backward pass) and the LSTM's weights with their gradient and
    two optimizer slots (`lstm_weight_count` floats, 4 copies). Its trunk is one MLP under
    both heads (no value trunk of its own).
    """
    c, spec = config, config.model_spec
    obs_elements, obs_itemsize, conv_units, conv_out = _observation_sizes(spec,
                                                                          observation_space)
    num_actions, action_bytes = _action_sizes(action_space)
    obs_bytes = obs_elements * obs_itemsize
    # per env step: obs, action, reward, terminated, truncated, truncation value,
    # behaviour logits; per column: bootstrap obs and policy version
    step_bytes = obs_bytes + action_bytes + 4 + 1 + 1 + 4 + 4 * num_actions
    column_bytes = obs_bytes + 8
    if spec.use_lstm:
        column_bytes += 2 * spec.lstm_cell_size * 4  # state_in: (h, c) float32
    T, B = c.sample_batch_size, c.num_envs_per_worker
    sample = T * B * step_bytes + B * column_bytes
    columns = c.train_batch_columns
    train = columns * T * step_bytes + columns * column_bytes
    learner_per_step, lstm_weights = _learner_bytes(spec, obs_elements, conv_units, conv_out)
    parts = {
        "learner queue": c.learner_queue_size * train,
        "batch buffer": 2 * train,
        "minibatch ring": c.minibatch_buffer_size * train + (
            c.num_data_loader_buffers * train if c.uses_multi_gpu_learner else 0),
        "replay": c.replay_buffer_num_slots * sample,
        "samples in flight": (2 * c.num_workers
                              * c.max_sample_requests_in_flight_per_worker * sample),
        "learner working set": columns * T * learner_per_step + train + lstm_weights,
        "weights": 4 * (LEARNER_WEIGHT_COPIES + c.num_workers) * weight_count(
            spec, obs_elements, conv_out, num_actions),
    }
    parts["total"] = sum(parts.values())
    return parts


def _action_sizes(action_space: Any) -> tuple[int, int]:
    """(distribution inputs per step, bytes of one action): a Discrete's n logits and an
    int64 index; a Box's 2D inputs (mean, log-std) and D float32 numbers; None: 2 and 8."""
    if action_space is None:
        return 2, 8
    try:  # a Discrete's n (other spaces have none, or a shaped one)
        return int(action_space.n), 8
    except (AttributeError, TypeError, ValueError):
        pass
    size = 1
    for d in getattr(action_space, "shape", None) or (1,):
        size *= int(d)
    return 2 * size, 4 * size


def weight_count(spec: ModelSpec, obs_elements: int, conv_out: int, num_actions: int) -> int:
    """Floats of the policy and value trunks and heads (the LSTM's are counted apart): each
    dense layer's kernel and bias, the conv trunk's output as the MLP's input when there is
    one (its own filters are few and left out)."""
    def mlp(inputs: int) -> tuple[int, int]:
        total = 0
        for units in spec.hiddens:
            total += (inputs + 1) * units
            inputs = units
        return total, inputs

    features = conv_out or obs_elements
    trunk, last = mlp(features)
    head_inputs = spec.lstm_cell_size if spec.use_lstm else last
    if spec.vf_share_layers or spec.use_lstm:
        return trunk + (head_inputs + 1) * (num_actions + 1)
    return 2 * trunk + (last + 1) * (num_actions + 1)


def _learner_bytes(spec: ModelSpec, obs_elements: int, conv_units: int, conv_out: int
                   ) -> tuple[int, int]:
    """(bytes per env step of the learner's activations and gradients, bytes of the LSTM's
    weights with their gradient and two optimizer slots; 0 without an LSTM)."""
    trunks = 1 if spec.vf_share_layers or spec.use_lstm else 2
    per_step = 400 + 8 * trunks * (sum(spec.hiddens) + conv_units) + 12 * obs_elements
    if not spec.use_lstm:
        return per_step, 0
    per_step += LSTM_STEP_BYTES_PER_UNIT * spec.lstm_cell_size
    # the LSTM's input: the trunk's last layer (or the conv stack's, or the observation)
    features = spec.hiddens[-1] if spec.hiddens else conv_out or obs_elements
    return per_step, 4 * 4 * lstm_weight_count(features, spec.lstm_cell_size)


def _observation_sizes(spec: ModelSpec, observation_space: Any) -> tuple[int, int, int, int]:
    """(elements, bytes per element, conv activations, conv trunk output units) of one
    observation; without a space one float32 element and no conv trunk (a lower bound)."""
    shape = getattr(observation_space, "shape", None)
    if shape is None:
        return 1, 4, 0, 0
    # batches keep uint8 images as they are, bool ones as uint8, every other observation as
    # float32
    dtype = str(getattr(observation_space, "dtype", "float32"))
    itemsize = 1 if dtype in ("uint8", "bool") else 4
    if len(shape) != 3:
        return math.prod(int(d) for d in shape), itemsize, 0, 0
    return (math.prod(int(d) for d in shape), itemsize, spec.conv_units(shape),
            spec.trunk_output_units(shape))


# Learner bytes per env step and LSTM unit: forward, each step's four gates, c, tanh(c) and h
# and the reset mask's products, kept for the backward pass, and their gradients (float32).
LSTM_STEP_BYTES_PER_UNIT = 96


def lstm_weight_count(features: int, cell_size: int) -> int:
    """Floats of an LSTM of ``cell_size`` units on ``features`` inputs: its kernel
    [F, 4C], recurrent kernel [C, 4C] and bias [4C] (Keras's LSTMCell)."""
    return 4 * cell_size * (features + cell_size + 1)


def check_memory(config: MemorySizes, observation_space: Any = None,
                 action_space: Any = None) -> None:
    """Raise `ConfigError` if `memory_estimate` exceeds the limit (``max_memory_gb``, or
    half of the available memory); the error names the fields of the largest parts."""
    parts = memory_estimate(config, observation_space, action_space)
    total = parts.pop("total")
    if config.max_memory_gb is not None:
        limit = config.max_memory_gb * 1e9
        limit_text = f"max_memory_gb={config.max_memory_gb!r}"
    else:
        available = available_memory_bytes()
        if available is None:  # no way to know here: no limit
            return
        limit = available // 2
        limit_text = (f"{gb(limit)}, half of the {gb(available)} available "
                      "(max_memory_gb=None)")
    if total <= limit:
        return
    largest = sorted(parts.items(), key=lambda kv: kv[1], reverse=True)
    shown = [(name, size) for name, size in largest if 10 * size >= total][:3]  # ints
    blamed = list(dict.fromkeys(f for name, _ in shown for f in part_fields(config, name)))
    lead = max(part_fields(config, shown[0][0]), key=lambda name: _growth(config, name))
    at = "at least" if observation_space is None else "about"
    details = "; ".join(f"{name} {gb(size)} ({' x '.join(part_fields(config, name))})"
                        for name, size in shown)
    raise ConfigError(
        f"{lead}={getattr(config, lead)!r} is invalid: this config would need {at} "
        f"{gb(total)} of memory ({details}), more than the limit of {limit_text}; lower "
        f"{', '.join(blamed)}, or raise max_memory_gb")


def part_fields(config: MemorySizes, part: str) -> tuple[str, ...]:
    """The fields that size a part of the memory estimate, for this config."""
    names = PART_FIELDS[part]
    if config.model_spec.use_lstm:
        names = (*names, "lstm_cell_size")
    if "train_batch_size" in names and config.sample_steps > config.train_batch_size:
        # one worker sample is larger than train_batch_size: the sample sets the batch
        sample = ("sample_batch_size", "num_envs_per_worker")
        names = tuple(m for n in names for m in (sample if n == "train_batch_size" else (n,)))
    return names


def _growth(config: MemorySizes, name: str) -> float:
    """How many times its default a size field is (to say which one to lower first)."""
    value, default = getattr(config, name), type(config).__dataclass_fields__[name].default
    if name == "model":
        value, default = sum(value), sum(default)
    try:
        return float(value) / max(float(default), 1.0)
    except OverflowError:
        return math.inf


def available_memory_bytes() -> int | None:
    """Memory available to new allocations: MemAvailable from /proc/meminfo (psutil where
    there is no /proc), capped by a cgroup memory limit; None if it cannot be read."""
    available = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if available is None:
        try:
            import psutil

            available = int(psutil.virtual_memory().available)
        except Exception:
            return None
    for limit_file in ("/sys/fs/cgroup/memory.max",  # cgroup v2
                       "/sys/fs/cgroup/memory/memory.limit_in_bytes"):  # v1
        try:
            with open(limit_file) as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # "max" or a huge value: no limit
            available = min(available, int(text))
        break
    return available


def gb(n: float) -> str:
    """Bytes as GB (10^9): 0.0123 GB, 24.9 GB, 3,060 GB, 1.51e+07 GB."""
    try:
        x = n / 1e9
    except OverflowError:  # an int too large for a float
        return f"1e{len(str(int(n))) - 10} GB"
    return f"{x:,.0f} GB" if 100 <= x < 1e6 else f"{x:.3g} GB"
