"""`ImpalaConfig`: every knob of the pipeline, with RLlib's names, validated when built.

Each field carries its documentation (``metadata["help"]``) and its role (``group``), from
which docs/configuration.md's tables (``python -m impala_lab.config``) and the CLI's
``--help`` are generated. A bad value raises `ConfigError` naming the field, the value and
the fix, before any process starts.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from impala_lab import config_checks
from impala_lab import memory_budget as memory
from impala_lab.errors import ConfigError
from impala_lab.model_spec import ModelSpec
from impala_lab.presets import TUNED_PRESETS

#: The roles the fields are grouped by (each field's ``metadata["group"]``).
GROUPS = {
    "rollouts": "the actors: envs, unrolls, where workers live",
    "model": "the policy/value network (impala_lab.model_spec)",
    "pipeline": "batches, replay, queues and policy lag between actors and learner",
    "training": "the loss, its off-policy correction and the optimizer",
    "learner": "the learner's devices and threads",
    "evaluation": "evaluations of the learner's policy (impala_lab.driver.evaluation)",
    "resources": "what a run may take of this machine",
}


def _f(default: Any, help: str, *, group: str, **kw: Any) -> Any:
    """A field with its help line and its group (`GROUPS`); ``kind="..."`` names a kind its
    annotation cannot say."""
    return field(default=default, metadata={"help": help, "group": group, **kw})


@dataclass
class ImpalaConfig:
    """All settings of one IMPALA run, in `GROUPS` order. Defaults are RLlib's IMPALA's."""

    env: Any = _f("CartPole-v1", "Gymnasium env id (or, in Python, a zero-argument env factory).",
                  kind="env", group="rollouts")
    num_workers: int = _f(2, "Rollout workers (actors) sampling in parallel.", group="rollouts")
    num_envs_per_worker: int = _f(1, "Envs each worker steps as one batch; a sample is [T, this].",
                                  group="rollouts")
    vector_env: bool = _f(
        False, "Step each worker's envs as the env id's registered gymnasium vector env "
        "(CartPole-v1 has one): same batches, far cheaper env steps with many envs per worker.",
        group="rollouts")
    sample_batch_size: int = _f(50, "Unroll length T of one worker sample (time steps per env).",
                                group="rollouts")
    backend: str = _f("process", "Where workers live: 'process' (spawned), 'inline' (in the "
                      "driver's process, steppable) or 'ray'.", group="rollouts")
    seed: int | None = _f(None, "Seed for envs, action sampling, model init and replay; None = "
                          "random.", group="rollouts")
    max_sample_requests_in_flight_per_worker: int = _f(
        2, "Sample requests each worker has queued at once (the task pool's depth).",
        group="rollouts")
    restart_failed_workers: bool = _f(
        True, "Replace a worker that died and go on; False raises its error in the driver.",
        group="rollouts")
    sample_timeout_s: float | None = _f(
        60.0, "A worker that owes a sample this many seconds (its env hangs) is failed, ended "
        "and replaced (process and ray backends: inline cannot interrupt a hung env); None waits "
        "forever.", group="rollouts")
    ray_address: str | None = _f(
        None, "Ray backend: address of an existing cluster; None starts a local Ray.",
        group="rollouts")
    clip_actions: bool = _f(
        True, "Box actions: clip each draw to the space's finite bounds on its way to the env "
        "(RLlib's clip_actions; the batch keeps the draw). False passes it as it is.",
        group="rollouts")
    squash_actions: bool = _f(
        False, "Box actions: squash each draw into the space's bounds with tanh instead of "
        "clipping it (the batch keeps the draw; the bounds must be finite).", group="rollouts")
    model: tuple[int, ...] = _f((64, 64), "Hidden layer sizes of the MLP (after the conv stack "
                                "for image observations).", kind="model", group="model")
    vf_share_layers: bool = _f(
        False, "One trunk under the policy and value heads (True, the old RLlib IMPALA's), or a "
        "value network of its own with the same sizes (False, today's RLlib default: a value "
        "spike cannot wreck the policy's features). With use_lstm both read the one LSTM core.",
        group="model")
    use_lstm: bool = _f(
        False, "Recurrent policy: an LSTM of lstm_cell_size units after the trunk, under both "
        "heads (RLlib's LSTM wrapper), so the value loss trains the core too: keep "
        "vf_loss_coeff small. Batches carry each column's start state as state_in.",
        group="model")
    lstm_cell_size: int = _f(64, "Units of the LSTM (its h and c are each this wide); used "
                             "with use_lstm.", group="model")
    conv_net: str = _f(
        "cnn", "Conv trunk for images: 'cnn' (the small CNN of conv_filters) or 'impala' (the "
        "paper's deep network of impala_channels stacks); the model's dense layers follow.",
        group="model")
    conv_filters: tuple[tuple[int, int, int], ...] | None = _f(
        None, "The small CNN's layers as (filters, kernel, stride) triples, 'valid' padding "
        "(RLlib's name; on the CLI 16x3x1,32x3x1); None picks by image size: "
        "[[16, 8, 4], [32, 4, 2]] from 20x20 up, MinAtar's [[16, 3, 1]] below.",
        kind="filters?", group="model")
    impala_channels: tuple[int, ...] = _f(
        (16, 32, 32), "Widths of the IMPALA network's conv stacks (conv_net='impala'); "
        "each stack halves the image (10x10 -> 5x5 -> 3x3 -> 2x2).", kind="model", group="model")
    free_log_std: bool = _f(
        True, "Box actions: learn the Gaussian's log-std as one state-free vector (True, "
        "RLlib's free_log_std), or compute it in the policy head (False).", group="model")
    log_std_init: float = _f(
        0.0, "Box actions: the Gaussian's log-std at the start (0: std 1; SB3's name); RL Zoo "
        "starts MuJoCo at -2, exploring near the mean.", group="model")
    normalize_obs: bool = _f(
        False, "Standardise vector observations with running statistics held in the model's "
        "weights (RLlib's MeanStdFilter); for continuous control.", group="model")
    train_batch_size: int = _f(500, "Env steps per learner batch; worker samples are "
                               "concatenated along B until at least this many.", group="pipeline")
    replay_proportion: float = _f(0.0, "Replayed batches mixed in per new batch, on average.",
                                  group="pipeline")
    replay_buffer_num_slots: int = _f(
        0, "Sample batches kept for replay (FIFO); 0 disables replay.", group="pipeline")
    learner_queue_size: int = _f(
        16, "Train batches waiting for the learner at most (bounded queue).", group="pipeline")
    learner_queue_timeout: float = _f(
        300.0, "Seconds the learner waits on an empty queue before raising an error.",
        group="pipeline")
    minibatch_buffer_size: int = _f(1, "Slots of the learner's minibatch ring buffer.",
                                    group="pipeline")
    num_sgd_iter: int = _f(1, "Passes over each train batch (the ring's max ttl).",
                           group="pipeline")
    minibatch_size: int | None = _f(
        None, "Env steps per optimizer step (RLlib's): each pass over a train batch is split "
        "into minibatches of whole columns; None: one step per pass. Single-device learner.",
        group="pipeline")
    broadcast_interval: int = _f(1, "Sample batches a worker returns between weight refreshes "
                                 "(once the learner has new weights).", group="pipeline")
    max_policy_lag: int = _f(
        1000, "Drop a sample batch that arrives more than this many learner updates behind "
        "(Sample Factory's knob; stats' num_samples_dropped_for_lag).", group="pipeline")
    extra_policy_lag: int = _f(
        0, "Hold broadcasts back so the actors act with weights at least this many updates "
        "old (a dial for policy lag).", group="pipeline")
    lr: float = _f(0.0005, "Learning rate (the live knob; ignored with lr_schedule).",
                   group="training")
    lr_schedule: tuple[tuple[int, float], ...] | None = _f(
        None, "The learning rate over env steps, (env_steps, lr) points, linear between and "
        "held at the ends (RLlib's): [(0, 0.003), (2000000, 0.0)]; on the CLI 0:0.003,2e6:0.",
        kind="schedule?", group="training")
    opt_type: str = _f("adam", "Optimizer: 'adam' or 'rmsprop'.", group="training")
    decay: float = _f(0.99, "RMSProp decay (rho).", group="training")
    momentum: float = _f(0.0, "RMSProp momentum.", group="training")
    epsilon: float = _f(0.1, "RMSProp epsilon.", group="training")
    grad_clip: float = _f(40.0, "Clip gradients to this global norm.", group="training")
    gamma: float = _f(0.99, "Discount factor.", group="training")
    vf_loss_coeff: float = _f(0.5, "Weight of the value loss.", group="training")
    entropy_coeff: float = _f(0.01, "Weight of the entropy bonus.", group="training")
    reward_scale: float = _f(
        1.0, "Multiply rewards by this in the loss (metrics keep the env's units), so returns "
        "and the value loss stay of order 1.", group="training")
    clip_rewards: float | None = _f(
        None, "Clip rewards to [-clip_rewards, clip_rewards] in the loss, before reward_scale "
        "(RLlib's; the paper's Atari runs clip to 1); metrics keep the env's. None: no clip.",
        group="training")
    action_bound_coeff: float = _f(
        0.0, "Box actions: weight of a penalty on each action mean's squared distance past the "
        "bounds, which keeps it where the env can tell actions apart.", group="training")
    vtrace: bool | None = _f(
        None, "RLlib's switch: True trains with V-trace, False without (off_policy_correction "
        "'none'); None follows off_policy_correction, which it must agree with.",
        group="training")
    off_policy_correction: str | None = _f(
        None, "How the loss treats lagged data (the paper's section 5.2.2): 'vtrace', 'is1', "
        "'epsilon' or 'none' (equations in impala_lab/learner/corrections.py); None: "
        "'vtrace', or 'none' with vtrace=False.", kind="str", group="training")
    vtrace_clip_rho_threshold: float | None = _f(
        1.0, "V-trace rho-bar (clips importance weights in the value target); None disables.",
        group="training")
    vtrace_clip_pg_rho_threshold: float | None = _f(
        1.0, "Clip of importance weights in the policy-gradient advantage; None disables.",
        group="training")
    loss: str = _f(
        "impala", "The policy's loss: 'impala' (the policy gradient with off_policy_correction) "
        "or 'appo' (RLlib's APPO: PPO's clipped surrogate on V-trace advantages, for several "
        "passes per batch; equations in impala_lab/learner/appo.py).", group="training")
    clip_param: float = _f(
        0.4, "APPO: the surrogate's clip range; a step's ratio pi/mu stops pulling outside "
        "[1 - clip_param, 1 + clip_param].", group="training")
    use_kl_loss: bool = _f(
        False, "APPO: add kl_coeff * KL(mu || pi), RLlib's penalty toward the behaviour "
        "policy, its coefficient adapted toward kl_target after every update.",
        group="training")
    kl_coeff: float = _f(1.0, "APPO with use_kl_loss: the KL penalty's first coefficient.",
                         group="training")
    kl_target: float = _f(
        0.01, "APPO with use_kl_loss: the mean KL per step the coefficient aims at (x1.5 "
        "above twice this, x0.5 below half of it).", group="training")
    truncation_bootstrap: str = _f(
        "actor", "Where a time-limited episode's bootstrap V(final observation) comes from: "
        "'actor' (the behaviour weights', when cut) or 'learner' (the learner's network on the "
        "batch's final_obs at each update, as RLlib's new stack).", group="training")
    num_gpus: int = _f(0, "Learner devices; > 1 selects the MultiGPULearner.", group="learner")
    fake_gpus: bool = _f(
        False, "Split the CPU into num_gpus logical devices (multi-GPU on a laptop).",
        group="learner")
    num_data_loader_buffers: int = _f(1, "Device-resident batch buffers of the MultiGPULearner; "
                                      "> 1 selects it.", group="learner")
    tf_intra_op_threads: int = _f(
        1, "TensorFlow intra-op threads for the learner (1 leaves the other core to the actors).",
        group="learner")
    evaluation_interval: int | None = _f(
        None, "Reports of train() between evaluations of the learner's weights on envs of "
        "their own (RLlib's name); None or 0: no evaluation.", group="evaluation")
    evaluation_num_episodes: int = _f(10, "Episodes each evaluation plays per action choice.",
                                      group="evaluation")
    evaluation_actions: str = _f(
        "both", "How the evaluated policy acts: 'greedy' (most likely action), 'sampled' "
        "(drawn from the policy, as the actors do) or 'both'.", group="evaluation")
    max_memory_gb: float | None = _f(
        None, "Refuse a config whose estimated memory (queues, buffers, replay, samples in "
        "flight, the learner's working set, every weights copy) exceeds this many GB (10^9 "
        "bytes); None = half of the memory available at validation.", group="resources")
    max_num_workers: int | None = _f(
        None, "The most workers a config may ask for on this machine; None = 8 per CPU (a "
        "Ray cluster's, with ray_address, are not bounded).", group="resources")

    def __post_init__(self) -> None:
        self._resolve_correction()
        for name in ("model", "impala_channels", "conv_filters", "lr_schedule"):  # as tuples
            value = getattr(self, name)
            if isinstance(value, list | tuple):
                setattr(self, name, tuple(tuple(v) if isinstance(v, list | tuple) else v
                                          for v in value))
        self.validate()

    def validate(self) -> None:
        """Raise `ConfigError` on the first value that cannot work
        (`config_checks.validate`), then on the memory estimate (observations counted as one
        float each; `Impala` checks again with the env's spaces)."""
        config_checks.validate(self)
        self.check_memory()

    def _resolve_correction(self) -> None:
        """One switch is enough: the one left None follows the other (both None: V-trace)."""
        if self.off_policy_correction is None:
            self.off_policy_correction = "none" if self.vtrace is False else "vtrace"
        if self.vtrace is None and isinstance(self.off_policy_correction, str):
            self.vtrace = self.off_policy_correction == "vtrace"

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
        names = [f.name for f in fields(ModelSpec) if f.name != "hiddens"]
        return ModelSpec(tuple(self.model), **{name: getattr(self, name) for name in names})

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
        hint = f"did you mean {close[0]!r}?" if close else "impala-lab config lists every field"
        raise ConfigError(f"unknown config key {key!r}: {hint}")


def field_kind(name: str) -> str:
    """'int', 'float', 'bool', 'str', 'int?', 'float?', 'str?', 'model', 'filters?',
    'schedule?' or 'env' (CLI parsing)."""
    return config_checks.field_kinds(ImpalaConfig)[name]


def field_group(name: str) -> str:
    """The role (a key of `GROUPS`) the field ``name`` belongs to."""
    return ImpalaConfig.__dataclass_fields__[name].metadata["group"]


def markdown_table() -> str:
    """The configuration page's tables: the fields of each role (`GROUPS`), their defaults
    and what they do."""
    out = []
    for group, title in GROUPS.items():
        out += [f"**{group}**: {title}", "", "| field | default | what it does |",
                "| --- | --- | --- |"]
        for f in fields(ImpalaConfig):
            if f.metadata["group"] != group:
                continue
            default = f.default
            if isinstance(default, tuple):
                default = [list(v) if isinstance(v, tuple) else v for v in default]
            out.append(f"| `{f.name}` | `{default!r}` | {f.metadata['help']} |")
        out.append("")
    return "\n".join(out).rstrip()


if __name__ == "__main__":
    print(markdown_table())
