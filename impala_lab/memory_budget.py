"""How many bytes a config's data needs, and whether that fits: a config is refused before any
process starts rather than dying of an out-of-memory error in the middle of a run.

Validation calls `check_memory` without an env (one float per observation, a lower bound),
``Impala`` again with the env's spaces. The config is read through `MemorySizes`, so this
module never imports it (no import circle).
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import Any, Protocol

from impala_lab.errors import ConfigError
from impala_lab.model_spec import ModelSpec


class MemorySizes(Protocol):
    """What the estimate reads of ``ImpalaConfig`` (``check_memory`` also ``getattr``s the
    fields its error names)."""

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
    "tensorflow": (),
    "worker processes": ("num_workers",),
}
# Fixed costs: the learner's TensorFlow runtime (its import and first trace), and each worker
# process (Python, numpy, gymnasium and its envs).
TENSORFLOW_BYTES = 500_000_000
WORKER_PROCESS_BYTES = 45_000_000
SHM_DIR = "/dev/shm"
# Weights blocks of a process run besides one per worker: the latest broadcast, two for reuse.
SHM_BLOCKS_BESIDES_WORKERS = 3
# Copies of the weights besides one per worker (the LSTM's are counted in the working set):
# the learner's variables, their gradient, Adam's two slots and the flat broadcast vector (5),
# and the shared-memory blocks (3).
LEARNER_WEIGHT_COPIES = 5 + 3
# Learner bytes per env step and LSTM unit: each step's four gates, c, tanh(c), h and the reset
# mask's products, kept for the backward pass, and their gradients (float32).
LSTM_STEP_BYTES_PER_UNIT = 96


def memory_estimate(config: MemorySizes, observation_space: Any = None,
                    action_space: Any = None) -> dict[str, int]:
    """Bytes ``config`` needs for its data, by part (`PART_FIELDS`; ``"total"`` their sum).

    ``observation_space`` None counts one float32 per observation (a lower bound: validation
    makes no env); ``action_space`` None counts 2 distribution inputs. The learner's working
    set is its copy of a batch plus activations and gradients per env step (docs/reliability.md
    gives the bytes and how well they held); with ``use_lstm`` also ``state_in`` (float32
    [B, 2, C]) per column and 4 copies of the LSTM's weights.
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
    # the learner's activations and gradients per env step (docs/reliability.md)
    trunks = 1 if spec.vf_share_layers or spec.use_lstm else 2
    learner_per_step = 400 + 8 * trunks * (sum(spec.hiddens) + conv_units) + 12 * obs_elements
    if spec.use_lstm:
        learner_per_step += LSTM_STEP_BYTES_PER_UNIT * spec.lstm_cell_size
    # the LSTM's weights, their gradient and two optimizer slots (float32)
    lstm_weights = 4 * 4 * _lstm_floats(spec, obs_elements, conv_out)
    parts = {
        "learner queue": c.learner_queue_size * train,
        "batch buffer": 2 * train,  # the samples being gathered and their concatenation
        "minibatch ring": c.minibatch_buffer_size * train + (
            c.num_data_loader_buffers * train if c.uses_multi_gpu_learner else 0),
        "replay": c.replay_buffer_num_slots * sample,
        "samples in flight": (2 * c.num_workers  # each in a worker and in the driver
                              * c.max_sample_requests_in_flight_per_worker * sample),
        "learner working set": columns * T * learner_per_step + train + lstm_weights,
        "weights": 4 * (LEARNER_WEIGHT_COPIES + c.num_workers) * weight_count(
            spec, obs_elements, conv_out, num_actions),
        "tensorflow": TENSORFLOW_BYTES,
        "worker processes": (0 if getattr(c, "backend", "process") == "inline"
                             else WORKER_PROCESS_BYTES * c.num_workers),
    }
    parts["total"] = sum(parts.values())
    return parts


def _action_sizes(action_space: Any) -> tuple[int, int]:
    """(distribution inputs per step, bytes of one action): a Discrete's n and 8 (int64); a
    Box's 2D and 4D (float32); None: 2 and 8."""
    if action_space is None:
        return 2, 8
    with contextlib.suppress(AttributeError, TypeError, ValueError):  # a Discrete's n
        return int(action_space.n), 8
    size = math.prod(int(d) for d in getattr(action_space, "shape", None) or (1,))
    return 2 * size, 4 * size


def weight_count(spec: ModelSpec, obs_elements: int, conv_out: int, num_actions: int) -> int:
    """Floats of the dense trunks and heads (the LSTM's and the few conv filters' are left
    out), on the conv trunk's output where there is one."""
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


def _lstm_floats(spec: ModelSpec, obs_elements: int, conv_out: int) -> int:
    """Floats of the spec's LSTM (0 without one), on the trunk's last features."""
    if not spec.use_lstm:
        return 0
    features = spec.hiddens[-1] if spec.hiddens else conv_out or obs_elements
    return lstm_weight_count(features, spec.lstm_cell_size)


def _observation_sizes(spec: ModelSpec, observation_space: Any) -> tuple[int, int, int, int]:
    """(elements, bytes per element, conv activations, conv output units) of one observation;
    without a space one float32 element and no conv trunk."""
    shape = getattr(observation_space, "shape", None)
    if shape is None:
        return 1, 4, 0, 0
    # batches keep uint8 and bool observations as uint8, every other one as float32
    dtype = str(getattr(observation_space, "dtype", "float32"))
    itemsize = 1 if dtype in ("uint8", "bool") else 4
    elements = math.prod(int(d) for d in shape)
    if len(shape) != 3:
        return elements, itemsize, 0, 0
    return elements, itemsize, spec.conv_units(shape), spec.trunk_output_units(shape)


def lstm_weight_count(features: int, cell_size: int) -> int:
    """Floats of an LSTM of ``cell_size`` units on ``features`` inputs: its kernel
    [F, 4C], recurrent kernel [C, 4C] and bias [4C] (Keras's LSTMCell)."""
    return 4 * cell_size * (features + cell_size + 1)


def check_memory(config: MemorySizes, observation_space: Any = None,
                 action_space: Any = None) -> None:
    """Raise `ConfigError` naming the fields of the largest parts if `memory_estimate`
    exceeds ``max_memory_gb`` (None: half the available memory); then `check_shared_memory`."""
    parts = memory_estimate(config, observation_space, action_space)
    total = parts.pop("total")
    if config.max_memory_gb is not None:
        limit = config.max_memory_gb * 1e9
        limit_text = f"max_memory_gb={config.max_memory_gb!r}"
    else:
        available = available_memory_bytes()
        limit = math.inf if available is None else available // 2  # unknown: no limit
        limit_text = (f"{gb(limit)}, half of the {gb(available or 0)} available "
                      "(max_memory_gb=None)")
    if total <= limit:
        check_shared_memory(config, observation_space, action_space)
        return
    largest = sorted(parts.items(), key=lambda kv: kv[1], reverse=True)
    shown = [(name, size) for name, size in largest if 10 * size >= total][:3]  # ints
    blamed = list(dict.fromkeys(f for name, _ in shown for f in part_fields(config, name)))
    at = "at least" if observation_space is None else "about"
    details = "; ".join(f"{name} {gb(size)} ({' x '.join(part_fields(config, name)) or 'fixed'})"
                        for name, size in shown)
    if not blamed:  # the fixed costs alone
        raise ConfigError(f"this run would need {at} {gb(total)} of memory ({details}), more "
                          f"than the limit of {limit_text}: raise max_memory_gb, or free memory")
    sized = next(name for name, _ in shown if part_fields(config, name))
    lead = max(part_fields(config, sized), key=lambda name: _growth(config, name))
    raise ConfigError(
        f"{lead}={getattr(config, lead)!r} is invalid: this config would need {at} "
        f"{gb(total)} of memory ({details}), more than the limit of {limit_text}; lower "
        f"{', '.join(blamed)}, or raise max_memory_gb")


def check_shared_memory(config: MemorySizes, observation_space: Any = None,
                        action_space: Any = None, shm_dir: str = SHM_DIR) -> None:
    """Raise `ConfigError` if the process backend's weights blocks cannot fit in the free
    space of ``shm_dir`` (a tmpfs: a write past it is a SIGBUS, not an error)."""
    if getattr(config, "backend", None) != "process":
        return
    try:
        st = os.statvfs(shm_dir)
    except OSError:  # no /dev/shm (not Linux): nothing to check against
        return
    free = st.f_bavail * st.f_frsize
    spec = config.model_spec
    obs_elements, _, _, conv_out = _observation_sizes(spec, observation_space)
    num_actions, _ = _action_sizes(action_space)
    floats = (weight_count(spec, obs_elements, conv_out, num_actions)
              + _lstm_floats(spec, obs_elements, conv_out))
    block = 4 * floats + 64 * 1024  # with its header and each array's alignment
    blocks = config.num_workers + SHM_BLOCKS_BESIDES_WORKERS
    if blocks * block <= free:
        return
    at = "at least" if observation_space is None else "about"
    raise ConfigError(
        f"model={tuple(spec.hiddens)!r} is invalid with num_workers={config.num_workers} and "
        f"backend='process': the weights' shared-memory blocks need {at} {mb(blocks * block)} "
        f"({blocks} blocks of {mb(block)}: the latest broadcast, two kept for reuse and one "
        f"per worker) and {shm_dir} has {mb(free)} free (Docker gives 64 MB unless run with "
        "--shm-size); lower --model or --num-workers, or use --backend inline")


def mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def part_fields(config: MemorySizes, part: str) -> tuple[str, ...]:
    """The fields that size a part of the memory estimate, for this config."""
    names = PART_FIELDS[part]
    if not names:  # a fixed cost
        return ()
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


def available_memory_bytes(root: str = "/") -> int | None:
    """MemAvailable (/proc/meminfo, else psutil), capped by `cgroup_memory_left`; None if it
    cannot be read. ``root``: where /proc and /sys are (tests pass a fake tree)."""
    available = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(root, "proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
                break
    if available is None:
        try:
            import psutil

            available = int(psutil.virtual_memory().available)
        except Exception:
            return None
    left = cgroup_memory_left(root)
    return available if left is None else min(available, left)


# cgroup v2 and v1: where the hierarchy is mounted, and the files of a group's limit, usage
# and reclaimable file cache (in memory.stat).
_CGROUP_FILES = {"v2": ("sys/fs/cgroup", "memory.max", "memory.current", "inactive_file"),
                 "v1": ("sys/fs/cgroup/memory", "memory.limit_in_bytes",
                        "memory.usage_in_bytes", "total_inactive_file")}


def cgroup_memory_left(root: str = "/") -> int | None:
    """The least, over this process's memory cgroup (v2 or v1) and those above it, of the
    limit less the usage the kernel cannot reclaim; None: no group sets a limit."""
    try:
        lines = Path(root, "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    least = None
    for line in lines:
        hierarchy, controllers, path = [*line.split(":", 2), "", ""][:3]
        version = ("v2" if hierarchy == "0" and not controllers else
                   "v1" if "memory" in controllers.split(",") else None)
        if version is None:
            continue
        mount, limit_file, usage_file, cache_key = _CGROUP_FILES[version]
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):
            group = Path(root, mount, *parts[:depth])
            limit = _read_int(group / limit_file)
            if limit is None or limit >= 2**60:  # "max", or v1's huge "no limit"
                continue
            used = (_read_int(group / usage_file) or 0) - _stat_value(group / "memory.stat",
                                                                     cache_key)
            left = max(0, limit - max(0, used))
            least = left if least is None else min(least, left)
    return least


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _stat_value(path: Path, key: str) -> int:
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    return 0


def gb(n: float) -> str:
    """Bytes as GB (10^9): 0.0123 GB, 24.9 GB, 3,060 GB, 1.51e+07 GB."""
    try:
        x = n / 1e9
    except OverflowError:  # an int too large for a float
        return f"1e{len(str(int(n))) - 10} GB"
    return f"{x:,.0f} GB" if 100 <= x < 1e6 else f"{x:.3g} GB"
