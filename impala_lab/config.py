"""`ImpalaConfig`: every knob of the pipeline, with RLlib's names, validated when built.

Each field carries its own documentation (``metadata["help"]``); the README's config table
and the CLI's ``--help`` are generated from it, so the three never disagree::

    python -m impala_lab.config          # prints the markdown table

A bad value raises `ConfigError` (a ``ValueError``) that names the field, the value and the
fix, before any process starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from impala_lab import memory_budget as memory
from impala_lab.env_packages import env_package_hint as env_package_hint  # re-exported
from impala_lab.errors import ConfigError
from impala_lab.evaluation_settings import check_evaluation_fields
from impala_lab.field_checks import bad, check_choice, check_range, check_type, field_kinds
from impala_lab.knobs import LIVE_KNOBS as LIVE_KNOBS  # re-exported: the live config fields
from impala_lab.model_spec import CONV_NETS, ModelSpec
from impala_lab.presets import TUNED_PRESETS as TUNED_PRESETS  # re-exported: ImpalaConfig.tuned

BACKENDS = ("process", "inline", "ray")
OPTIMIZERS = ("adam", "rmsprop")
OFF_POLICY_CORRECTIONS = ("vtrace", "is1", "epsilon", "none")
WORKERS_PER_CPU = 8  # worker processes per CPU a config may ask for (max_num_workers=None)


def _f(default: Any, help: str, **kw: Any) -> Any:
    """A field with its help line; ``kind="..."`` names a kind its annotation cannot say."""
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class ImpalaConfig:
    """All settings of one IMPALA run. Defaults are RLlib's IMPALA defaults."""

    # --- environment and actors -------------------------------------------------------
    env: Any = _f("CartPole-v1", "Gymnasium env id (or, in Python, a zero-argument env factory).",
                  kind="env")
    num_workers: int = _f(2, "Rollout workers (actors) sampling in parallel.")
    num_envs_per_worker: int = _f(1, "Envs each worker steps as one batch; a sample is [T, this].")
    vector_env: bool = _f(
        False, "Step each worker's envs as one gymnasium vector env (the env id's registered "
        "vectorised implementation; CartPole-v1 has one) instead of one Python call per env: "
        "same batches, far cheaper env steps. Pays with many envs per worker.")
    sample_batch_size: int = _f(50, "Unroll length T of one worker sample (time steps per env).")
    backend: str = _f("process", "Where workers live: 'process' (spawned), 'inline' (in the "
                      "driver's process, steppable) or 'ray'.")
    seed: int | None = _f(
        None, "Seed for envs, action sampling, model init and replay; None = random.")
    model: tuple[int, ...] = _f((64, 64), "Hidden layer sizes of the MLP (after the conv stack "
                                "for image observations).", kind="model")
    vf_share_layers: bool = _f(
        False, "One trunk under the policy and value heads (True, as the RLlib IMPALA this "
        "re-creates built it), or a value network of its own with the same layer sizes (False, "
        "today's RLlib default: a value-loss spike cannot wreck the policy's features). With "
        "use_lstm both heads read the one LSTM core, whatever this says (see use_lstm).")
    use_lstm: bool = _f(
        False, "Recurrent policy: an LSTM of lstm_cell_size units after the MLP (or CNN) trunk, "
        "under both heads (RLlib's LSTM wrapper: one core, so the value also sees the history "
        "it needs on a partially observed task; a value LSTM of its own would double the "
        "actors' per-step cost). The value loss then trains the core too: keep vf_loss_coeff "
        "small (0.01 in the StatelessCartPole preset). Batches carry each column's start "
        "state as state_in.")
    lstm_cell_size: int = _f(64, "Units of the LSTM (its h and c are each this wide); used "
                             "with use_lstm.")
    conv_net: str = _f(
        "cnn", "Conv trunk for image observations: 'cnn' (the small CNN of conv_filters) or "
        "'impala' (the IMPALA paper's deep network: per impala_channels width a conv 3x3, a "
        "max-pool 3x3 stride 2 and two residual blocks); the model dense layers follow.")
    conv_filters: tuple[tuple[int, int, int], ...] | None = _f(
        None, "The small CNN's layers as (filters, kernel, stride) triples, 'valid' padding "
        "(RLlib's name; on the CLI 16x3x1,32x3x1); None picks by image size: "
        "[[16, 8, 4], [32, 4, 2]] from 20x20 up, MinAtar's [[16, 3, 1]] below.",
        kind="filters?")
    impala_channels: tuple[int, ...] = _f(
        (16, 32, 32), "Widths of the IMPALA network's conv stacks (conv_net='impala'); "
        "each stack halves the image (10x10 -> 5x5 -> 3x3 -> 2x2).", kind="model")
    free_log_std: bool = _f(
        True, "Box actions (a diagonal Gaussian policy): learn the log standard deviation as "
        "one vector that no state changes (True, RLlib's free_log_std), or let the policy head "
        "compute it from the state with the mean (False). Ignored for Discrete actions.")
    clip_actions: bool = _f(
        True, "Box actions: clip each sampled action to the space's finite bounds before the "
        "env gets it (RLlib's clip_actions); the batch keeps the unclipped draw, whose "
        "log-probability the loss uses. False passes the draw as it is.")
    action_bound_coeff: float = _f(
        0.0, "Box actions: weight of a penalty on the squared distance of each action mean "
        "past the bounds, which keeps the mean where the env can tell actions apart.")
    squash_actions: bool = _f(
        False, "Box actions: squash each draw into the space's bounds with tanh instead of "
        "clipping it (the batch keeps the draw; the bounds must be finite).")
    normalize_obs: bool = _f(
        False, "Standardise vector observations with a running mean and variance held in the "
        "model's weights (SB3's VecNormalize, RLlib's MeanStdFilter), so actors, learner and "
        "checkpoints share them; for continuous control.")
    reward_scale: float = _f(
        1.0, "Multiply env rewards by this in the loss (metrics keep the env's units): scale "
        "large rewards down so that returns, and the value loss, stay of order 1.")
    max_sample_requests_in_flight_per_worker: int = _f(
        2, "Sample requests each worker has queued at once (the task pool's depth).")
    restart_failed_workers: bool = _f(
        True, "Replace a worker that died and go on; False raises its error in the driver.")
    sample_timeout_s: float | None = _f(
        60.0, "A worker that owes a sample this many seconds (its env hangs) is counted as "
        "failed, ended and replaced (process and ray backends; inline samples in the driver, "
        "where a hung env cannot be interrupted); None waits forever.")
    ray_address: str | None = _f(
        None, "Ray backend: address of an existing cluster; None starts a local Ray.")
    # --- batching, replay and queues --------------------------------------------------
    train_batch_size: int = _f(500, "Env steps per learner batch; worker samples are "
                               "concatenated along B until at least this many.")
    replay_proportion: float = _f(0.0, "Replayed batches mixed in per new batch, on average.")
    replay_buffer_num_slots: int = _f(
        0, "Sample batches kept for replay (FIFO); 0 disables replay.")
    learner_queue_size: int = _f(
        16, "Train batches waiting for the learner at most (bounded queue).")
    learner_queue_timeout: float = _f(
        300.0, "Seconds the learner waits on an empty queue before raising an error.")
    minibatch_buffer_size: int = _f(1, "Slots of the learner's minibatch ring buffer.")
    num_sgd_iter: int = _f(1, "Passes over each train batch (the ring's max ttl).")
    broadcast_interval: int = _f(1, "Sample batches a worker returns between weight refreshes "
                                 "(once the learner has new weights).")
    # --- learner devices --------------------------------------------------------------
    num_gpus: int = _f(0, "Learner devices; > 1 selects the MultiGPULearner.")
    fake_gpus: bool = _f(
        False, "Split the CPU into num_gpus logical devices (multi-GPU on a laptop).")
    num_data_loader_buffers: int = _f(1, "Device-resident batch buffers of the MultiGPULearner; "
                                      "> 1 selects it.")
    # --- loss and optimizer -----------------------------------------------------------
    lr: float = _f(0.0005, "Learning rate (the live knob; ignored with lr_schedule).")
    lr_schedule: tuple[tuple[int, float], ...] | None = _f(
        None, "The learning rate over env steps sampled, as (env_steps, lr) points, linear "
        "between them and held at the ends (RLlib's lr_schedule; the IMPALA paper annealed "
        "linearly to 0): [(0, 0.003), (2000000, 0.0)]; on the CLI 0:0.003,2e6:0.",
        kind="schedule?")
    opt_type: str = _f("adam", "Optimizer: 'adam' or 'rmsprop'.")
    decay: float = _f(0.99, "RMSProp decay (rho).")
    momentum: float = _f(0.0, "RMSProp momentum.")
    epsilon: float = _f(0.1, "RMSProp epsilon.")
    grad_clip: float = _f(40.0, "Clip gradients to this global norm.")
    gamma: float = _f(0.99, "Discount factor.")
    vf_loss_coeff: float = _f(0.5, "Weight of the value loss.")
    entropy_coeff: float = _f(0.01, "Weight of the entropy bonus.")
    vtrace_clip_rho_threshold: float | None = _f(
        1.0, "V-trace rho-bar (clips importance weights in the value target); None disables.")
    vtrace_clip_pg_rho_threshold: float | None = _f(
        1.0, "Clip of importance weights in the policy-gradient advantage; None disables.")
    tf_intra_op_threads: int = _f(
        1, "TensorFlow intra-op threads for the learner (1 leaves the other core to the actors).")
    # --- off-policy corrections and policy lag ---------------------------------------
    vtrace: bool | None = _f(
        None, "RLlib's switch: True trains with V-trace, False without it (RLlib's loss, "
        "off_policy_correction 'none'); None follows off_policy_correction. Given together, "
        "the two must agree.")
    off_policy_correction: str | None = _f(
        None, "How the loss treats lagged data (IMPALA paper, section 5.2.2): 'vtrace', "
        "'is1' (policy gradient weighted by the clipped importance weight, value target "
        "uncorrected), 'epsilon' (log(pi + 1e-6) in the policy gradient) or 'none' (as if "
        "on-policy); None: 'vtrace', or 'none' with vtrace=False. The equations are in "
        "impala_lab/learner/corrections.py.", kind="str")
    max_policy_lag: int = _f(
        1000, "Drop a new sample batch that reaches the driver more than this many learner "
        "updates behind (Sample Factory's knob); counted in stats() as "
        "num_samples_dropped_for_lag.")
    extra_policy_lag: int = _f(
        0, "Hold weight broadcasts back so the actors act with weights at least this many "
        "learner updates old (a dial for policy lag; 0 broadcasts the newest weights).")
    # --- resources --------------------------------------------------------------------
    max_memory_gb: float | None = _f(
        None, "Refuse a config whose estimated memory (learner queue, batch buffer, minibatch "
        "ring, replay, samples in flight, the learner's working set and every copy of the "
        "weights, from the observation size) exceeds this many GB (10^9 bytes); None = half "
        "of the memory available when the config is validated.")
    max_num_workers: int | None = _f(
        None, "The most workers a config may ask for on this machine; None = 8 per CPU. A "
        "Ray cluster's workers (ray_address set) are not bounded here.")
    # --- evaluation of the learner's policy (impala_lab.driver.evaluation) --------------
    evaluation_interval: int | None = _f(
        None, "Reports of train() between evaluations of the learner's current weights on "
        "envs of their own (RLlib's name, counted in reports); None or 0: no evaluation.")
    evaluation_num_episodes: int = _f(10, "Episodes each evaluation plays per action choice.")
    evaluation_actions: str = _f(
        "both", "How the evaluated policy acts: 'greedy' (most likely action), 'sampled' "
        "(drawn from the policy, as the actors do) or 'both'.")

    def __post_init__(self) -> None:
        self._resolve_correction()
        for name in ("model", "impala_channels", "conv_filters", "lr_schedule"):  # as tuples
            value = getattr(self, name)
            if isinstance(value, list | tuple):
                setattr(self, name, tuple(tuple(v) if isinstance(v, list | tuple) else v
                                          for v in value))
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raise `ConfigError` on the first value that cannot work."""
        for f in fields(self):
            _check_type(f, getattr(self, f.name))
        self._check_env()
        self._check_values()
        self._check_combinations()
        check_evaluation_fields(self)
        # Cheap and TF-free: no env is made here, so observations count as one float each
        # (a lower bound); Impala checks again with the env's spaces before anything starts.
        self.check_memory()

    def _check_workers(self) -> None:
        """At least one worker, and no more than this machine can hold (a Ray cluster's
        workers are the cluster's business)."""
        if self.num_workers < 1:
            bad("num_workers", self.num_workers,
                 "training would hang with no worker to sample; set num_workers >= 1")
        if self.max_num_workers is not None and self.max_num_workers < 1:
            bad("max_num_workers", self.max_num_workers, "use a positive integer, or None")
        limit = self.max_num_workers or WORKERS_PER_CPU * (os.cpu_count() or 1)
        source = "max_num_workers" if self.max_num_workers else f"{WORKERS_PER_CPU} per CPU"
        if self.num_workers > limit and not (self.backend == "ray" and self.ray_address):
            bad("num_workers", self.num_workers,
                f"it exceeds {limit} worker processes on this machine ({source}), which "
                "would fill its memory and process table; lower it, or raise max_num_workers "
                "if the machine can take them")

    def _check_values(self) -> None:
        """Each field on its own: ranges and choices."""
        self._check_workers()
        for name in ("num_envs_per_worker", "sample_batch_size", "train_batch_size",
                     "max_sample_requests_in_flight_per_worker", "broadcast_interval",
                     "num_sgd_iter", "minibatch_buffer_size", "learner_queue_size",
                     "num_data_loader_buffers", "tf_intra_op_threads", "lstm_cell_size"):
            if getattr(self, name) < 1:
                bad(name, getattr(self, name), "it must be a positive integer (>= 1)")
        for name in ("lr", "grad_clip", "learner_queue_timeout", "epsilon", "reward_scale"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                bad(name, value, "it must be a positive finite number")
        if self.backend == "ray" and importlib.util.find_spec("ray") is None:
            bad("backend", self.backend, "Ray is not installed: pip install 'impala_lab[ray]', "
                "or use backend='process' on this machine")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            bad("seed", self.seed, "use an integer in [0, 2**63), or None for a random seed "
                "(TensorFlow keeps seeds as int64)")
        if self.num_gpus < 0:
            bad("num_gpus", self.num_gpus, "use 0 or 1 for one learner device, > 1 for several")
        if self.replay_buffer_num_slots < 0:
            bad("replay_buffer_num_slots", self.replay_buffer_num_slots, "use 0 to disable replay")
        check_range("gamma", self.gamma, 0.0, 1.0)
        check_range("decay", self.decay, 0.0, 1.0)
        check_range("momentum", self.momentum, 0.0, 1.0)
        for name in ("vf_loss_coeff", "entropy_coeff", "replay_proportion", "action_bound_coeff"):
            check_range(name, getattr(self, name), 0.0, math.inf)
        for name in ("vtrace_clip_rho_threshold", "vtrace_clip_pg_rho_threshold"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                bad(name, value, "use a positive number, or None to disable the clip")
        for name, unit in (("sample_timeout_s", "seconds, or None to wait forever"),
                           ("max_memory_gb", "GB, or None for half of the available memory")):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                bad(name, getattr(self, name), f"use a positive number of {unit}")
        if not self.model or any(h < 1 for h in self.model):
            bad("model", self.model, "give one or more positive hidden sizes, e.g. [64, 64]")
        check_choice("backend", self.backend, BACKENDS)
        check_choice("conv_net", self.conv_net, CONV_NETS)
        if not self.impala_channels or any(c < 1 for c in self.impala_channels):
            bad("impala_channels", self.impala_channels,
                 "give one or more positive stack widths, e.g. [16, 32, 32]")
        if self.conv_filters is not None and (not self.conv_filters or any(
                min(f) < 1 for f in self.conv_filters)):
            bad("conv_filters", self.conv_filters, "give one or more [filters, kernel, stride] "
                 "triples of positive integers, e.g. [[16, 3, 1]], or None to pick by image size")
        check_choice("opt_type", self.opt_type, OPTIMIZERS)
        check_choice("off_policy_correction", self.off_policy_correction,
                      OFF_POLICY_CORRECTIONS)
        for name in ("max_policy_lag", "extra_policy_lag"):
            if getattr(self, name) < 0:
                bad(name, getattr(self, name), "it must be a non-negative integer (>= 0)")

    def _check_combinations(self) -> None:
        """Values that are fine alone but cannot work together."""
        if self.replay_proportion > 0:
            # Replay starts once the store holds more than ceil(train / sample) batches.
            needed = math.ceil(self.train_batch_size / self.sample_batch_size) + 1
            if self.replay_buffer_num_slots < needed:
                bad("replay_buffer_num_slots", self.replay_buffer_num_slots,
                     f"with replay_proportion={self.replay_proportion} the replay buffer "
                     f"(replay_buffer_num_slots * sample_batch_size = "
                     f"{self.replay_buffer_num_slots * self.sample_batch_size}) must hold more "
                     f"than train_batch_size={self.train_batch_size} steps; set "
                     f"replay_buffer_num_slots to at least {needed}, or replay_proportion=0")
        if self.uses_multi_gpu_learner:
            if self.num_data_loader_buffers < self.minibatch_buffer_size:
                bad("num_data_loader_buffers", self.num_data_loader_buffers,
                     f"the multi-device learner needs at least as many data loader buffers as "
                     f"minibatch buffers (minibatch_buffer_size={self.minibatch_buffer_size}); "
                     f"raise num_data_loader_buffers or lower minibatch_buffer_size")
            columns = self.train_batch_columns
            if columns % self.num_learner_devices:
                bad("train_batch_size", self.train_batch_size,
                     f"a train batch has {columns} columns (sample batches of "
                     f"{self.sample_batch_size} x {self.num_envs_per_worker} env steps "
                     f"concatenated to reach train_batch_size), which does not split evenly "
                     f"across {self.num_learner_devices} learner devices; choose "
                     f"train_batch_size and num_envs_per_worker so that the column count is a "
                     f"multiple of num_gpus")
        if self.fake_gpus and self.num_gpus < 1:
            bad("fake_gpus", self.fake_gpus, "set num_gpus >= 1 to say how many fake devices")
        self._check_correction_and_lag()

    def _resolve_correction(self) -> None:
        """One switch is enough: the one left None follows the other (both None: V-trace)."""
        if self.off_policy_correction is None:
            self.off_policy_correction = "none" if self.vtrace is False else "vtrace"
        if self.vtrace is None and isinstance(self.off_policy_correction, str):
            self.vtrace = self.off_policy_correction == "vtrace"

    def _check_correction_and_lag(self) -> None:
        """``vtrace`` must agree with ``off_policy_correction``; lag limits must leave work."""
        if not self.vtrace and self.off_policy_correction == "vtrace":
            raise ConfigError(
                "vtrace=False and off_policy_correction='vtrace' conflict: vtrace=False is "
                "RLlib's loss without V-trace; set off_policy_correction='none' (that loss), "
                "'is1' or 'epsilon', or leave vtrace out (it follows off_policy_correction)")
        if self.vtrace and self.off_policy_correction != "vtrace":
            raise ConfigError(
                f"vtrace=True and off_policy_correction={self.off_policy_correction!r} "
                f"conflict: vtrace=True trains with V-trace; leave vtrace out (it follows "
                f"off_policy_correction) to train with {self.off_policy_correction!r}")
        if self.max_policy_lag <= self.extra_policy_lag:
            bad("max_policy_lag", self.max_policy_lag,
                 f"with extra_policy_lag={self.extra_policy_lag} every batch arrives at least "
                 f"that many updates behind and more than max_policy_lag would be dropped; set "
                 f"max_policy_lag above extra_policy_lag (e.g. "
                 f"{2 * self.extra_policy_lag + 10}) or lower extra_policy_lag")

    def _check_env(self) -> None:
        if callable(self.env):
            return
        if not isinstance(self.env, str) or not self.env:
            bad("env", self.env, "give a gymnasium env id such as 'CartPole-v1' or a factory")
        import gymnasium

        if self.env not in gymnasium.registry:
            close = difflib.get_close_matches(self.env, list(gymnasium.registry), n=3, cutoff=0.5)
            hint = env_package_hint(self.env) or (
                f"did you mean {', '.join(map(repr, close))}?" if close else
                "see gymnasium.pprint_registry() for the registered ids")
            bad("env", self.env, f"gymnasium does not know this env id; {hint}")

    # ------------------------------------------------------------------ derived values
    @property
    def uses_multi_gpu_learner(self) -> bool:
        """RLlib's rule: the MultiGPULearner runs when num_gpus > 1 or loader buffers > 1."""
        return self.num_gpus > 1 or self.num_data_loader_buffers > 1

    @property
    def num_learner_devices(self) -> int:
        return max(1, self.num_gpus)

    @property
    def sample_steps(self) -> int:
        """Env steps in one worker sample: sample_batch_size * num_envs_per_worker."""
        return self.sample_batch_size * self.num_envs_per_worker

    @property
    def train_batch_columns(self) -> int:
        """Columns B of a train batch: samples are concatenated until >= train_batch_size."""
        return -(-self.train_batch_size // self.sample_steps) * self.num_envs_per_worker

    @property
    def model_spec(self) -> ModelSpec:
        """The `ModelSpec` of these fields (``model`` is its ``hiddens``): what models use."""
        return ModelSpec(tuple(self.model), self.vf_share_layers, self.use_lstm,
                         self.lstm_cell_size, self.conv_net, self.conv_filters,
                         self.impala_channels, self.free_log_std, self.normalize_obs)

    @property
    def env_id(self) -> str:
        """A printable name of the env (a factory's qualified name)."""
        if callable(self.env):
            return "factory:" + getattr(self.env, "__qualname__", type(self.env).__name__)
        return str(self.env)

    # ------------------------------------------------------------------ memory
    def memory_estimate(self, observation_space: Any = None, action_space: Any = None
                        ) -> dict[str, int]:
        """Bytes this config needs for its data, by part (``"total"`` is their sum); the
        parts and the arguments are `impala_lab.memory_budget.memory_estimate`'s."""
        return memory.memory_estimate(self, observation_space, action_space)

    def check_memory(self, observation_space: Any = None, action_space: Any = None) -> None:
        """Raise `ConfigError` if `memory_estimate` exceeds the limit (``max_memory_gb``, or
        half of the available memory); the error names the fields of the largest parts."""
        memory.check_memory(self, observation_space, action_space)

    # ------------------------------------------------------------------ dict round trip
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; ``ImpalaConfig.from_dict(c.to_dict()) == c``."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):  # model, impala_channels, conv_filters
                value = [list(v) if isinstance(v, tuple) else v for v in value]
            elif f.name == "env" and callable(value):
                value = self.env_id
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ImpalaConfig:
        """Build a config from a mapping; unknown keys are rejected with a did-you-mean."""
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"config must be a mapping of field names to values, got {type(data).__name__}")
        for key in data:
            _check_known(key)
        return cls(**dict(data))

    @classmethod
    def tuned(cls, env: str = "CartPole-v1", **overrides: Any) -> ImpalaConfig:
        """RLlib's defaults plus the values tuned for ``env`` (if any), then ``overrides``."""
        return cls.from_dict({"env": env, **TUNED_PRESETS.get(env, {}), **overrides})

    def replace(self, **changes: Any) -> ImpalaConfig:
        """A validated copy with some fields changed (unknown names rejected like from_dict)."""
        merged = self.to_dict()
        if callable(self.env):
            merged["env"] = self.env
        # Changing one of the two correction switches re-derives the other.
        pair = ("vtrace", "off_policy_correction")
        for one, other in (pair, pair[::-1]):
            if one in changes and other not in changes:
                merged[other] = None
        merged.update(changes)
        return type(self).from_dict(merged)

    def validate_field(self, name: str, value: Any) -> None:
        """Raise the `ConfigError` that a copy with ``name=value`` would raise when built
        (an unknown name gets the did-you-mean error); change nothing."""
        _check_known(name)
        dataclasses.replace(self, **{name: value})  # __post_init__ validates the copy

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ImpalaConfig):
            return NotImplemented
        return self.to_dict() == other.to_dict()


# ---------------------------------------------------------------------- helpers
def field_names() -> list[str]:
    return [f.name for f in fields(ImpalaConfig)]


def field_help(name: str) -> str:
    return {f.name: f.metadata["help"] for f in fields(ImpalaConfig)}[name]


def _check_known(key: Any) -> None:
    """Raise `ConfigError` with a did-you-mean if ``key`` is not a field name."""
    known = field_names()
    if key not in known:
        close = difflib.get_close_matches(str(key), known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else "see the README's config table"
        raise ConfigError(f"unknown config key {key!r}: {hint}")


def field_kind(name: str) -> str:
    """'int', 'float', 'bool', 'str', 'int?', 'float?', 'str?', 'model', 'filters?',
    'schedule?' or 'env' (CLI parsing)."""
    return field_kinds(ImpalaConfig)[name]


def _check_type(f: dataclasses.Field, value: Any) -> None:
    check_type(f.name, field_kinds(ImpalaConfig)[f.name], value)


def markdown_table() -> str:
    """The README's config table: every field, its default and what it does."""
    rows = ["| field | default | what it does |", "| --- | --- | --- |"]
    for f in fields(ImpalaConfig):
        default = f.default
        if isinstance(default, tuple):
            default = [list(v) if isinstance(v, tuple) else v for v in default]
        rows.append(f"| `{f.name}` | `{default!r}` | {f.metadata['help']} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
