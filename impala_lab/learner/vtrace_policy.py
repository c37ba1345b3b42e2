"""`VTracePolicy`: the learner's TensorFlow policy — V-trace actor-critic loss, one optimizer step.

The loss is RLlib's (and scalable_agent's) IMPALA loss, summed over the batch::

    policy_loss = -sum(log pi(a_t|x_t) * pg_advantage_t)          # clipped-rho advantages
    vf_loss     = 0.5 * sum((vs_t - V(x_t))^2)
    entropy     = sum(H(pi(.|x_t)))
    total_loss  = policy_loss + vf_loss_coeff * vf_loss - entropy_coeff * entropy

That is ``off_policy_correction="vtrace"`` (the default); "is1", "epsilon" and "none" are the
paper's alternatives (section 5.2.2), written out in `impala_lab.learner.corrections`.
``loss="appo"`` swaps the policy term for PPO's clipped surrogate on V-trace advantages
(`impala_lab.learner.appo`), which holds over many updates per batch.

Episode ends: the discount is 0 only on *termination*. On *truncation* (a time limit) the
episode did not end in the MDP: the actor stores V(final observation) as
``truncation_values`` and the learner adds ``gamma * truncation_values`` to the reward at that
step (with discount 0 into the next step, a new episode's). That value comes from the
behaviour weights, as in Stable-Baselines3; with ``truncation_bootstrap="learner"`` it is the
learner's own, at each update, from the batch's ``final_obs`` (RLlib's new stack).

Recurrent policies (``use_lstm``): `keras_model.lstm_unroll` runs the LSTM over each column
from the batch's ``state_in``, zeroing the state after every episode end as the actor did,
and bootstraps from one more step on ``bootstrap_obs``; the loss is the same.

The train step is one ``tf.function`` that does not retrace between batches of one shape; the
live knobs ``lr`` and ``entropy_coeff`` are TF variables, so changing them does not either.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from impala_lab.batch import SampleBatch
from impala_lab.config import ImpalaConfig
from impala_lab.errors import NonFiniteLossError
from impala_lab.learner import appo
from impala_lab.learner.corrections import correction_terms
from impala_lab.learner.distributions import tf_distribution
from impala_lab.learner.keras_model import build_keras_model, lstm_unroll, trunk_model
from impala_lab.learner.obs_normalizer import update_obs_statistics
from impala_lab.learner.optimizers import Adam, TF1RMSprop
from impala_lab.model_spec import check_spaces

STAT_KEYS = ("total_loss", "policy_loss", "vf_loss", "entropy", "grad_gnorm", "var_gnorm",
             "mean_rho", "vf_explained_var")
# A Gaussian policy's too: its mean and std over the batch's steps and action dimensions.
GAUSSIAN_STAT_KEYS = ("action_mean", "action_std", "action_bound_loss")

_threads_configured = False


def configure_tf_threads(intra_op: int) -> None:
    """Limit TensorFlow's intra-op threads (only possible before TF runs its first op)."""
    global _threads_configured
    if _threads_configured:
        return
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op)
        tf.config.threading.set_inter_op_parallelism_threads(max(2, intra_op))
    except RuntimeError:  # TF already initialised in this process (e.g. a notebook)
        if tf.config.threading.get_intra_op_parallelism_threads() not in (0, intra_op):
            warnings.warn("TensorFlow was initialised before impala_lab could set "
                          f"tf_intra_op_threads={intra_op}; keeping its current setting",
                          stacklevel=3)
    _threads_configured = True


def action_bound(action_space: Any, squash: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """(center [D], half-width [D]) of the means the env can tell apart, for
    ``action_bound_coeff``: the Box's bounds when clipped, +-2 before tanh when squashed
    (tanh(2) is 96% of the way); None for a Discrete space or unbounded dimensions."""
    if not hasattr(action_space, "low"):
        return None
    if squash:
        size = int(np.prod(action_space.shape))
        return np.zeros(size, np.float32), np.full(size, 2.0, np.float32)
    low = np.asarray(action_space.low, np.float64).reshape(-1)
    high = np.asarray(action_space.high, np.float64).reshape(-1)
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        return None
    return ((low + high) / 2).astype(np.float32), ((high - low) / 2).astype(np.float32)


def batch_to_tensors(batch: SampleBatch, final_obs: bool = False) -> dict[str, np.ndarray]:
    """The arrays of a `SampleBatch` the loss needs, with fixed dtypes (so no retracing);
    ``state_in`` [B, 2, C] only for a recurrent policy's batch, ``final_obs`` [N, ...] only
    when asked (``truncation_bootstrap="learner"``)."""
    tensors = {
        "obs": batch.obs,
        # indices as int32 (Discrete spaces); any other action keeps a float32 vector
        "actions": batch.actions.astype(np.int32 if batch.actions.dtype.kind in "iu"
                                        else np.float32, copy=False),
        "rewards": batch.rewards.astype(np.float32, copy=False),
        "terminateds": batch.terminateds.astype(np.float32),
        "truncateds": batch.truncateds.astype(np.float32),
        "truncation_values": batch.truncation_values.astype(np.float32, copy=False),
        "behaviour_logits": batch.behaviour_logits.astype(np.float32, copy=False),
        "bootstrap_obs": batch.bootstrap_obs,
    }
    if batch.state_in is not None:
        tensors["state_in"] = batch.state_in.astype(np.float32, copy=False)
    if final_obs:
        if batch.final_obs is None and batch.truncateds.any():
            raise ValueError("truncation_bootstrap='learner' needs the batch's final_obs (the "
                             "final observation of each truncated step); this batch has none")
        tensors["final_obs"] = (batch.final_obs if batch.final_obs is not None else
                                np.empty((0, *batch.obs_shape), batch.obs.dtype))
    return tensors


class VTracePolicy:
    """A Keras actor-critic trained with the V-trace loss (or another off-policy correction).

    Args:
      observation_space: the env's observation space (Box, rank 1 or 3).
      action_space: the env's action space (Discrete, or Box: a diagonal Gaussian policy).
      config: the run's `ImpalaConfig` (lr, opt_type, gamma, coefficients, clips, model).
    """

    def __init__(self, observation_space: Any, action_space: Any, config: ImpalaConfig) -> None:
        configure_tf_threads(config.tf_intra_op_threads)
        check_spaces(observation_space, action_space,
                     config.conv_filters if config.conv_net == "cnn" else None)
        self.config = config
        self.observation_space = observation_space
        self.action_space = action_space
        # The action distribution's TensorFlow twin: log-probs and entropy for the loss.
        self.distribution = tf_distribution(action_space)
        #: the keys of `learn_on_batch`'s stats (without policy_version)
        self.stat_keys = STAT_KEYS + (GAUSSIAN_STAT_KEYS
                                      if self.distribution.name == "diag_gaussian" else ())
        self.stat_keys += appo.APPO_STAT_KEYS if config.loss == "appo" else ()
        #: the loss bootstraps truncated episodes from its own values of ``final_obs``
        self.learner_bootstrap = config.truncation_bootstrap == "learner"
        self._bound = action_bound(action_space, config.squash_actions)
        self.model = build_keras_model(observation_space, action_space, config.model_spec,
                                       seed=config.seed)
        self.trunk = trunk_model(self.model) if config.use_lstm else None
        self.lr = tf.Variable(config.lr, dtype=tf.float32, trainable=False, name="lr")
        self.entropy_coeff = tf.Variable(config.entropy_coeff, dtype=tf.float32,
                                         trainable=False, name="entropy_coeff")
        self.kl_coeff = tf.Variable(config.kl_coeff, dtype=tf.float32, trainable=False,
                                    name="kl_coeff")
        self.optimizer = self._make_optimizer(config)
        self.optimizer.build(self.model.trainable_variables)
        self.version = 0
        # Updates rejected as not finite (learn_on_batch raises NonFiniteLossError for each).
        self.num_updates_skipped = 0
        # get_weights() from the driver must not read a half-applied update.
        self.lock = threading.Lock()
        # autograph=False: no Python control flow on tensors to convert. final_obs has a row
        # per truncation, a count that varies: one more trace then serves any count.
        self._train_step = tf.function(self._train_step_impl, autograph=False,
                                       reduce_retracing=self.learner_bootstrap)
        self.num_traces = 0
        # Train batches whose observations the statistics hold (dropped with the batches).
        self._batches_seen: weakref.WeakSet[SampleBatch] = weakref.WeakSet()

    # ------------------------------------------------------------------ optimizer
    def _make_optimizer(self, config: ImpalaConfig) -> keras.optimizers.Optimizer:
        if config.opt_type == "adam":
            return Adam(learning_rate=config.lr)  # Keras's, without a graph leak (optimizers.py)
        # RLlib's RMSProp is TensorFlow 1's, whose mean square starts at ones (optimizers.py).
        return TF1RMSprop(learning_rate=config.lr, rho=config.decay,
                          momentum=config.momentum, epsilon=config.epsilon)

    def set_lr(self, lr: float) -> None:
        """Change the learning rate between steps (no retrace); 0 (a schedule's end) stops
        the updates."""
        if not (lr >= 0 and np.isfinite(lr)):
            raise ValueError(f"lr={lr!r} is invalid: it must be a finite number >= 0")
        self.lr.assign(lr)
        self.optimizer.learning_rate.assign(lr)

    def set_entropy_coeff(self, value: float) -> None:
        if not (value >= 0 and np.isfinite(value)):
            raise ValueError(f"entropy_coeff={value!r} is invalid: it must be >= 0")
        self.entropy_coeff.assign(value)

    # ------------------------------------------------------------------ loss
    def loss_and_stats(self, tensors: dict[str, tf.Tensor]
                       ) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        """The loss of one batch, with the config's off-policy correction.

        Args:
          tensors: the arrays of `batch_to_tensors` as tensors: obs [T, B, ...], actions
            [T, B] (Discrete) or [T, B, D] (Box), rewards/terminateds/truncateds/
            truncation_values [T, B], behaviour_logits [T, B, A] (the behaviour policy's
            distribution inputs: for a Box, D means then D log-stds), bootstrap_obs [B, ...];
            a recurrent policy's state_in [B, 2, C]; final_obs [N, ...] (learner bootstrap).

        Returns:
          total loss (scalar) and a dict of scalar stats (``stat_keys`` without the norms).
        """
        config = self.config
        target_logits, values, bootstrap_value, truncation_values = self._forward(tensors)
        T, B = tf.shape(values)[0], tf.shape(values)[1]  # time steps, columns
        terminated = tensors["terminateds"]
        truncated = tensors["truncateds"] * (1.0 - terminated)
        discounts = config.gamma * (1.0 - tf.maximum(terminated, truncated))
        rewards = tensors["rewards"]
        if config.clip_rewards is not None:  # the episode returns reported stay the env's
            rewards = tf.clip_by_value(rewards, -config.clip_rewards, config.clip_rewards)
        # A truncated step's value estimate is the network's, already in scaled units.
        rewards = (config.reward_scale * rewards
                   + config.gamma * truncated * truncation_values)

        terms = correction_terms(
            config.off_policy_correction, behaviour_logits=tensors["behaviour_logits"],
            target_logits=target_logits, actions=tensors["actions"], discounts=discounts,
            rewards=rewards, values=values, bootstrap_value=bootstrap_value,
            clip_rho_threshold=config.vtrace_clip_rho_threshold,
            clip_pg_rho_threshold=config.vtrace_clip_pg_rho_threshold,
            distribution=self.distribution)

        policy_loss, kl_loss, policy_stats = self._policy_terms(
            terms, tensors, target_logits, rewards, discounts, values, bootstrap_value)
        vf_loss = 0.5 * tf.reduce_sum(tf.square(terms.vs - values))
        entropy = tf.reduce_sum(self.distribution.entropy(target_logits))
        total = (policy_loss + kl_loss + config.vf_loss_coeff * vf_loss
                 - self.entropy_coeff * entropy)
        bound_loss = tf.constant(0.0)
        if self.distribution.name == "diag_gaussian" and self._bound is not None:
            # Past the bound every draw near the mean reaches the env as the same action:
            # the policy gradient no longer sees the mean, and nothing else brings it back.
            center, half = self._bound
            mean = self.distribution.split(target_logits)[0]  # [T, B, D]
            excess = tf.nn.relu(tf.abs((mean - center) / half) - 1.0)
            bound_loss = tf.reduce_sum(tf.square(excess))
            total += config.action_bound_coeff * bound_loss

        var_vs = tf.math.reduce_variance(terms.vs)
        explained = 1.0 - tf.math.reduce_variance(terms.vs - values) / tf.maximum(var_vs, 1e-8)
        stats = {"total_loss": total, "policy_loss": policy_loss, "vf_loss": vf_loss,
                 "entropy": entropy / tf.cast(T * B, tf.float32),
                 "mean_rho": tf.reduce_mean(tf.exp(terms.log_rhos)),
                 "vf_explained_var": explained, **policy_stats}
        if self.distribution.name == "diag_gaussian":
            mean, log_std = self.distribution.split(target_logits)  # [T, B, D] each
            stats["action_mean"] = tf.reduce_mean(mean)
            stats["action_std"] = tf.reduce_mean(tf.exp(log_std))
            stats["action_bound_loss"] = bound_loss / tf.cast(T * B, tf.float32)
        return total, stats

    def _policy_terms(self, terms: Any, tensors: dict[str, tf.Tensor], target_logits: tf.Tensor,
                      rewards: tf.Tensor, discounts: tf.Tensor, values: tf.Tensor,
                      bootstrap_value: tf.Tensor) -> tuple[tf.Tensor, Any, dict[str, Any]]:
        """(policy_loss, kl_loss, extra stats): the policy gradient of the correction's
        terms; or with ``loss="appo"`` the clipped surrogate on V-trace advantages and, with
        ``use_kl_loss``, ``kl_coeff * KL(mu || pi)`` (`impala_lab.learner.appo`)."""
        if self.config.loss != "appo":
            return -tf.reduce_sum(terms.log_probs * terms.pg_advantages), 0.0, {}
        advantages = appo.appo_advantages(terms.vs, rewards, discounts, values, bootstrap_value)
        policy_loss, clip_fraction = appo.clipped_surrogate(terms.log_rhos, advantages,
                                                       self.config.clip_param)
        kl = self.distribution.kl(tensors["behaviour_logits"], target_logits)  # [T, B]
        kl_loss = self.kl_coeff * tf.reduce_sum(kl) if self.config.use_kl_loss else 0.0
        return policy_loss, kl_loss, {"clip_fraction": clip_fraction, "kl": tf.reduce_mean(kl),
                                      "kl_coeff": tf.identity(self.kl_coeff)}

    def _forward(self, tensors: dict[str, tf.Tensor]
                 ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
        """The learner's network on a batch: (logits [T, B, A], values [T, B], bootstrap
        values [B], truncation values [T, B]: the batch's, or with ``final_obs`` the
        network's own values of them); a recurrent one unrolls from ``state_in`` with the
        episode resets."""
        obs, final_obs = tensors["obs"], tensors.get("final_obs")
        T, B = tf.shape(obs)[0], tf.shape(obs)[1]
        if self.trunk is not None:
            ended = tf.maximum(tensors["terminateds"], tensors["truncateds"])
            final = None if final_obs is None else (
                final_obs, truncation_index(tensors["truncateds"]))
            logits, values, after, _ = lstm_unroll(self.model, self.trunk, obs,
                                                   tensors["state_in"], ended,
                                                   tensors["bootstrap_obs"], final)
        else:
            flat_obs = tf.reshape(obs, tf.concat([[T * B], tf.shape(obs)[2:]], axis=0))
            # One forward pass over the unroll, the bootstrap and any final observations.
            extra = [] if final_obs is None else [final_obs]
            logits, all_values = self.model(
                tf.concat([flat_obs, tensors["bootstrap_obs"], *extra], axis=0))
            num_outputs = tf.shape(logits)[-1]
            logits = tf.reshape(logits[: T * B], [T, B, num_outputs])
            values, after = tf.reshape(all_values[: T * B], [T, B]), all_values[T * B:]
        # after: the values of the observations after a step, B bootstrap then N final ones.
        truncation_values = tensors["truncation_values"]
        if final_obs is not None:  # the learner's values, scattered to their steps
            truncation_values = tf.scatter_nd(truncation_index(tensors["truncateds"]),
                                              tf.stop_gradient(after[B:]), [T, B])
        return logits, values, after[:B], truncation_values

    def compute_gradients(self, tensors: dict[str, tf.Tensor]
                          ) -> tuple[list, dict[str, tf.Tensor]]:
        """Gradients of the loss for one batch (unclipped) and its stats."""
        with tf.GradientTape() as tape:
            loss, stats = self.loss_and_stats(tensors)
        grads = tape.gradient(loss, self.model.trainable_variables)
        return grads, stats

    def apply_gradients(self, grads: list, loss: tf.Tensor | None = None) -> dict[str, tf.Tensor]:
        """Clip to ``grad_clip`` by global norm and apply, unless the update is not finite.

        A non-finite gradient norm (or ``loss``) would poison the actors' weights: then the
        optimizer does not run at all (a ``tf.cond``), so the weights and every optimizer
        variable stay bitwise as they were (a zeroed gradient would not do: Adam's momentum
        still moves the weights), and the caller raises NonFiniteLossError.
        """
        clipped, gnorm = tf.clip_by_global_norm(grads, self.config.grad_clip)
        finite = tf.math.is_finite(gnorm)
        if loss is not None:
            finite = tf.logical_and(finite, tf.math.is_finite(loss))
        variables = self.model.trainable_variables

        def apply() -> tf.Tensor:
            self.optimizer.apply(clipped, variables)
            return tf.constant(True)

        tf.cond(finite, apply, lambda: tf.constant(False))
        # Reads after the cond: TF orders ops on the same variables as written here.
        return {"grad_gnorm": gnorm, "var_gnorm": tf.linalg.global_norm(variables)}

    def _train_step_impl(self, tensors: dict[str, tf.Tensor]) -> tf.Tensor:
        """One optimizer step; the stats as one float32 vector in `stat_keys` order."""
        self.num_traces += 1  # Python side effect: runs once per trace
        grads, stats = self.compute_gradients(tensors)
        stats.update(self.apply_gradients(grads, loss=stats["total_loss"]))
        return tf.stack([tf.cast(stats[k], tf.float32) for k in self.stat_keys])

    # ------------------------------------------------------------------ public API
    def learn_on_batch(self, batch: SampleBatch) -> dict[str, float]:
        """One optimizer step on ``batch`` [T, B], or one per minibatch of ``minibatch_size``
        steps (its columns in order); returns the stats as floats (the minibatches' mean).

        Raises:
          NonFiniteLossError: the loss or the gradient norm is not finite; the message
            gives the batch's statistics (that update was not applied, nor any after it).
        """
        size = self.config.minibatch_size
        parts = [batch] if size is None else batch.split_columns(
            batch.B // max(1, size // batch.T))
        results = []
        for part in parts:
            tensors = {k: tf.convert_to_tensor(v)
                       for k, v in batch_to_tensors(part, self.learner_bootstrap).items()}
            with self.lock:
                self.observe_new_batch(batch)
                packed = self.run_train_step(tensors)
                stats = dict(zip(self.stat_keys, packed.numpy().tolist(), strict=True))
                finite = self.count_update(stats)
            stats["policy_version"] = self.version
            if not finite:
                raise NonFiniteLossError(describe_nonfinite(stats, part))
            results.append(stats)
        out = {k: float(np.mean([r[k] for r in results])) for k in self.stat_keys}
        out["policy_version"] = self.version
        return out

    def count_update(self, stats: dict[str, float]) -> bool:
        """After a train step (``self.lock`` held): whether its update landed (loss and
        gradient norm finite). If so the version moves on, and with ``use_kl_loss`` the KL
        coefficient adapts to the mean KL (RLlib's rule); if not, it counts as skipped."""
        if not all(np.isfinite(stats[k]) for k in ("total_loss", "grad_gnorm")):
            self.num_updates_skipped += 1
            return False
        self.version += 1
        if self.config.use_kl_loss:
            self.kl_coeff.assign(appo.adapt_kl_coeff(stats["kl_coeff"], stats["kl"],
                                                     self.config.kl_target))
        return True

    def run_train_step(self, tensors: dict[str, tf.Tensor]) -> tf.Tensor:
        """The compiled train step on ``tensors``: the stats vector (`stat_keys` order)."""
        return self._train_step(tensors)

    def observe_new_batch(self, batch: SampleBatch) -> None:
        """Before every update (``self.lock`` held): a new train batch's observations join a
        ``normalize_obs`` model's statistics (`impala_lab.learner.obs_normalizer`); further
        passes over a batch change nothing."""
        if self.config.normalize_obs and batch not in self._batches_seen:
            self._batches_seen.add(batch)
            update_obs_statistics(self.model, batch.obs)

    def get_weights(self) -> tuple[list[np.ndarray], int]:
        """The model's weights (numpy, in ``model.get_weights()`` order) and their version,
        read under the lock: never half an update."""
        with self.lock:
            return self.read_weights(), self.version

    def read_weights(self) -> list[np.ndarray]:
        """The model's weights as numpy arrays (call with ``self.lock`` held)."""
        return self.model.get_weights()

    def set_weights(self, weights: list[np.ndarray], version: int | None = None) -> None:
        expected = [tuple(w.shape) for w in self.model.weights]
        got = [tuple(np.shape(w)) for w in weights]
        if expected != got:
            raise ValueError(f"weights do not fit the model: expected shapes {expected}, "
                             f"got {got}")
        with self.lock:
            self.model.set_weights(weights)
            if version is not None:
                self.version = int(version)

    def compute_logits_and_values(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Keras forward pass, obs [N, ...] -> (logits [N, A], values [N]) (for checks; a
        recurrent policy's from zero states)."""
        obs = np.asarray(obs)
        if self.trunk is not None:
            state = np.zeros((len(obs), 2, self.config.lstm_cell_size), np.float32)
            logits, values, _ = self.model([obs, state], training=False)
        else:
            logits, values = self.model(obs, training=False)
        return np.asarray(logits), np.asarray(values)

    # ------------------------------------------------------------------ checkpoints
    def optimizer_state(self) -> list[np.ndarray]:
        return [np.array(v.numpy()) for v in self.optimizer.variables]

    def checkpoint_state_locked(self) -> tuple[list[np.ndarray], list[np.ndarray], int]:
        """(weights, optimizer state, version) of one and the same learner step.

        The caller holds ``self.lock`` (`Impala.save` does, to read the driver's counters at
        the same moment): every learner updates under it, so the three belong together, where
        ``get_weights()`` then ``optimizer_state()`` could straddle an update.
        """
        return self.read_weights(), self.optimizer_state(), self.version

    def set_optimizer_state(self, arrays: list[np.ndarray]) -> None:
        variables = self.optimizer.variables
        if len(arrays) != len(variables):
            raise ValueError(f"optimizer state has {len(arrays)} arrays, the optimizer "
                             f"expects {len(variables)}")
        for var, value in zip(variables, arrays, strict=True):
            var.assign(value)
        self.lr.assign(float(self.optimizer.learning_rate.numpy()))


def truncation_index(truncateds: tf.Tensor) -> tf.Tensor:
    """[N, 2] int64, the (t, b) of each truncated step in ``final_obs``'s order: column by
    column, in time order within a column."""
    return tf.reverse(tf.where(tf.transpose(truncateds) > 0), axis=[1])


def describe_nonfinite(stats: dict[str, float], batch: SampleBatch) -> str:
    """The error text for a non-finite loss: the stats and what the batch held."""
    def summary(name: str, a: np.ndarray) -> str:
        a = np.asarray(a, dtype=np.float64)
        finite = np.isfinite(a)
        if not finite.any():
            return f"{name}: no finite values"
        return (f"{name}: min {a[finite].min():.4g}, max {a[finite].max():.4g}, "
                f"mean {a[finite].mean():.4g}, non-finite {int((~finite).sum())}")

    lines = [f"non-finite loss (total_loss={stats['total_loss']}, "
             f"grad_gnorm={stats['grad_gnorm']}); training stopped. Batch statistics:",
             *("  " + summary(name, getattr(batch, name))
               for name in ("obs", "rewards", "behaviour_logits", "truncation_values")),
             "Lower lr, check the env's rewards and observations, or lower grad_clip."]
    return "\n".join(lines)
