"""IMPALA in one file: actors, a queue, a V-trace learner, and weights flowing back.

    python examples/impala_in_one_file.py --env CartPole-v1 --stop-return 475 --seed 3

Read it top to bottom; its parts are the boxes of IMPALA (Espeholt et al. 2018):

    actor processes --[T, B] unrolls--> queue --> learner thread --> shared weights --.
          ^                                                                         |
          '--------------- the actors copy the newest weights before each unroll ---'

1. numpy policy: the actors' forward pass (two tanh MLPs: logits and V). Actors never import
   TensorFlow: spawn starts each as a fresh Python that imports this TF-free top level.
2. actor process: B gymnasium envs, T steps, one unroll [T, B] with behaviour logits -> queue.
3. learner: the same MLPs in Keras, V-trace, the loss, Adam; a thread that turns unrolls into
   updates and publishes the weights.
4. driver (main): starts it all, prints progress, stops at the target, shuts down (Ctrl-C too).

Logged metrics explained (one progress line every --log-interval seconds):

    | metric   | meaning                                                                |
    |----------|------------------------------------------------------------------------|
    | s        | seconds since main() began (the bench times the whole process outside) |
    | steps    | env steps the actors have delivered to the learner                     |
    | updates  | optimizer steps taken by the learner (each publishes new weights)      |
    | return   | mean return of the last 100 finished episodes (the stop criterion)     |
    | loss     | total loss of the last batch: pg + vf_coeff * vf - entropy_coeff * H   |
    | pg, vf   | its policy-gradient and value terms (sums over the batch)              |
    | entropy  | entropy per step in nats (ln 2 = 0.69 is uniform over 2 actions)       |
    | rho      | mean pi/mu over the batch (1 when the actors ran the learner's policy) |
    | lag      | mean learner updates between an unroll's weights and its training      |

V-trace's symbols, as in the course (its notation table): rho_t = pi(a_t|x_t) / mu(a_t|x_t)
the importance ratio; rho_bar the clip threshold of the targets (--rho-bar) and pg_rho_bar
that of the policy gradient; w_t = min(rho_bar, rho_t) the clipped weight; c_t = min(1, rho_t)
the trace; delta_t = w_t (r_t + gamma_t V(x_{t+1}) - V(x_t)) the weighted TD error (the paper's).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
from collections import deque
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import gymnasium as gym
import numpy as np


def _help(default: Any, text: str) -> Any:
    return dataclasses.field(default=default, metadata={"help": text})


@dataclasses.dataclass
class Config:
    """Every knob of the run; each becomes a command-line flag (--env, --num-actors, ...)."""

    env: str = _help("CartPole-v1", "gymnasium env id (Box observations, Discrete actions)")
    seed: int = _help(0, "seed of the weights, the envs and the actors' action sampling")
    num_actors: int = _help(2, "actor processes sampling in parallel")
    envs_per_actor: int = _help(8, "B: envs one actor steps side by side (columns of an unroll)")
    unroll_length: int = _help(50, "T: time steps per unroll")
    unrolls_per_batch: int = _help(2, "unrolls the learner joins along B for one update")
    queue_size: int = _help(4, "unrolls the queue holds; a full queue blocks the actors")
    hidden: int = _help(64, "units of each of the two tanh layers (policy and value nets)")
    lr: float = _help(0.001, "Adam learning rate")
    grad_clip: float = _help(10.0, "clip the gradient to this global norm")
    gamma: float = _help(0.99, "discount factor")
    vf_coeff: float = _help(0.5, "weight of the value loss")
    entropy_coeff: float = _help(0.0, "weight of the entropy bonus")
    rho_bar: float = _help(1.0, "V-trace clip on pi/mu in the value targets (c-bar is 1)")
    pg_rho_bar: float = _help(1.0, "V-trace clip on pi/mu in the policy-gradient advantage")
    stop_return: float = _help(475.0, "stop when the last 100 episodes' mean return reaches it")
    max_seconds: float = _help(300.0, "stop after this many seconds of the run")
    log_interval: float = _help(2.0, "seconds between progress lines")
    tf_threads: int = _help(1, "TensorFlow intra-op threads of the learner")


# ------------------------------------------------------------------- 1. numpy policy
def param_shapes(obs_dim: int, num_actions: int, hidden: int) -> list[tuple[int, ...]]:
    """Shapes of the flat weight list: the policy net's (W, b) x 3, then the value net's."""
    def mlp(out: int) -> list[tuple[int, ...]]:
        return [(obs_dim, hidden), (hidden,), (hidden, hidden), (hidden,), (hidden, out), (out,)]
    return mlp(num_actions) + mlp(1)


def unflatten(flat: np.ndarray, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    """Views of the 1-D vector ``flat`` cut into arrays of ``shapes``."""
    ends = np.cumsum([int(np.prod(s)) for s in shapes])
    return [part.reshape(s) for part, s in zip(np.split(flat, ends[:-1]), shapes)]


def mlp_forward(params: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    """(W, b) pairs in ``params``; tanh after every layer but the last."""
    for i in range(0, len(params), 2):
        x = x @ params[i] + params[i + 1]
        if i + 2 < len(params):
            x = np.tanh(x)
    return x


def numpy_policy(params: list[np.ndarray], obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """obs [N, obs_dim] -> logits [N, A], values [N] (the Keras model's forward, in numpy)."""
    return mlp_forward(params[:6], obs), mlp_forward(params[6:], obs)[:, 0]


# ------------------------------------------------------------------- 2. the actor process
def rollout(envs: list, obs: np.ndarray, params: list[np.ndarray], rng: np.random.Generator,
            T: int, gamma: float, episode_return: np.ndarray) -> tuple[dict, list[float]]:
    """One unroll: T steps of each of the B ``envs`` from ``obs`` [B, obs_dim].

    Returns the unroll, obs [T, B, obs_dim], actions [T, B], rewards [T, B], discounts [T, B]
    (gamma, or 0 where an episode ended), behaviour_logits [T, B, A] and bootstrap_obs
    [B, obs_dim] (the observation after the last step), and the returns of the episodes that
    ended in it. A time limit (truncation) is no end in the MDP: there the reward gets
    gamma * V(last observation) added, and the trace is cut. ``obs`` and ``episode_return``
    [B] are carried over to the next unroll (updated in place).
    """
    B, A = len(envs), params[4].shape[1]
    u = {"obs": np.zeros((T, B, obs.shape[1]), np.float32), "actions": np.zeros((T, B), np.int32),
         "rewards": np.zeros((T, B), np.float32), "discounts": np.zeros((T, B), np.float32),
         "behaviour_logits": np.zeros((T, B, A), np.float32)}
    finished = []
    for t in range(T):
        logits, _ = numpy_policy(params, obs)
        # Gumbel-max: argmax(logits + Gumbel noise) is a sample of softmax(logits).
        actions = np.argmax(logits + rng.gumbel(size=logits.shape), axis=1)
        u["obs"][t], u["actions"][t], u["behaviour_logits"][t] = obs, actions, logits
        for i, env in enumerate(envs):
            o, r, terminated, truncated, _ = env.step(int(actions[i]))
            episode_return[i] += r
            if truncated and not terminated:  # a time limit: bootstrap from V(o)
                r += gamma * numpy_policy(params, o[None].astype(np.float32))[1][0]
            u["rewards"][t, i] = r
            u["discounts"][t, i] = 0.0 if (terminated or truncated) else gamma
            if terminated or truncated:
                finished.append(float(episode_return[i]))
                episode_return[i] = 0.0
                o, _ = env.reset()
            obs[i] = o
    u["bootstrap_obs"] = obs.copy()
    return u, finished


def actor(actor_id: int, cfg: Config, shapes: list, weights: Any, version: Any,
          unrolls: Any, stop: Any) -> None:
    """Run in its own process: fill the queue with unrolls (and the weights' version and the
    finished episodes' returns) until ``stop`` is set or the main process is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles Ctrl-C
    unrolls.cancel_join_thread()  # at exit, do not wait to flush unrolls nobody will read
    parent = os.getppid()
    B = cfg.envs_per_actor
    rng = np.random.default_rng([cfg.seed, actor_id])
    envs = [gym.make(cfg.env) for _ in range(B)]
    obs = np.stack([e.reset(seed=cfg.seed * 10_000 + actor_id * B + i)[0]
                    for i, e in enumerate(envs)]).astype(np.float32)
    episode_return, my_version, params = np.zeros(B), 0, None
    while not stop.is_set() and os.getppid() == parent:
        if version.value != my_version:  # the learner published new weights: copy them
            with weights.get_lock():
                flat = np.frombuffer(weights.get_obj(), np.float32).copy()
                my_version = version.value
            params = unflatten(flat, shapes)
        if params is None:  # the learner has not published its first weights yet
            time.sleep(0.01)
            continue
        u, finished = rollout(envs, obs, params, rng, cfg.unroll_length, cfg.gamma,
                              episode_return)
        u.update(version=my_version, episode_returns=finished)
        while not stop.is_set():  # wait while the queue is full, unless told to stop
            with contextlib.suppress(queue.Full):
                unrolls.put(u, timeout=0.1)
                break


# ------------------------------------------------------------------- 3. the learner
def build_nets(obs_dim: int, num_actions: int, cfg: Config) -> tuple[Any, Any]:
    """The Keras policy net (obs [N, obs_dim] -> logits [N, A]) and value net (-> [N, 1]),
    with weights in `param_shapes` order. Orthogonal init: sqrt(2) hidden, 0.01 for the
    logits (a near-uniform first policy), 1 for the value."""
    import keras

    def mlp(out: int, gain: float, k: int) -> Any:  # k: which net, so that seeds differ
        layers = [(cfg.hidden, "tanh", 2 ** 0.5), (cfg.hidden, "tanh", 2 ** 0.5), (out, None, gain)]
        return keras.Sequential([keras.Input((obs_dim,))] + [keras.layers.Dense(
            units, act, kernel_initializer=keras.initializers.Orthogonal(
                g, seed=cfg.seed * 10 + 3 * k + j)) for j, (units, act, g) in enumerate(layers)])

    return mlp(num_actions, 0.01, 0), mlp(1, 1.0, 1)


def vtrace(log_rhos: Any, discounts: Any, rewards: Any, values: Any, bootstrap_value: Any,
           rho_bar: float = 1.0, pg_rho_bar: float = 1.0) -> tuple[Any, Any]:
    """V-trace targets and policy-gradient advantages, time-major, any float dtype; no
    gradient flows out of them.

    Args:
      log_rhos: [T, B] log(pi(a_t|x_t) / mu(a_t|x_t)), target over behaviour policy.
      discounts: [T, B] gamma, or 0 where the episode ended after step t.
      rewards: [T, B].  values: [T, B] V(x_t).  bootstrap_value: [B] V(x_T).
      rho_bar, pg_rho_bar: clips on pi/mu for the targets and for the advantages.

    Returns:
      vs [T, B]: v_s = V(x_s) + sum_{t>=s} (prod_{s<=i<t} gamma_i c_i) delta_t, computed
        backwards as v_s - V(x_s) = delta_s + gamma_s c_s (v_{s+1} - V(x_{s+1})), with
        delta_t = w_t (r_t + gamma_t V(x_{t+1}) - V(x_t)), w_t = min(rho_bar, rho_t) and
        c_t = min(1, rho_t), rho_t = pi/mu;
      pg_advantages [T, B]: min(pg_rho_bar, rho_s) (r_s + gamma_s v_{s+1} - V(x_s)).
    """
    import tensorflow as tf

    log_rhos, discounts, rewards, values, bootstrap_value = (tf.stop_gradient(x) for x in (
        log_rhos, discounts, rewards, values, bootstrap_value))
    rhos = tf.exp(log_rhos)
    values_next = tf.concat([values[1:], bootstrap_value[None]], axis=0)
    deltas = tf.minimum(rho_bar, rhos) * (rewards + discounts * values_next - values)
    traces = discounts * tf.minimum(1.0, rhos)
    acc, backwards = tf.zeros_like(bootstrap_value), []
    for t in reversed(range(values.shape[0])):  # T is static: one op chain per step
        acc = deltas[t] + traces[t] * acc
        backwards.append(acc)
    vs = tf.stack(backwards[::-1]) + values
    vs_next = tf.concat([vs[1:], bootstrap_value[None]], axis=0)
    pg_advantages = tf.minimum(pg_rho_bar, rhos) * (rewards + discounts * vs_next - values)
    return tf.stop_gradient(vs), tf.stop_gradient(pg_advantages)


def loss_fn(policy_net: Any, value_net: Any, batch: dict, cfg: Config) -> tuple[Any, dict]:
    """The IMPALA loss of a batch (keys as in an unroll; arrays [T, B, ...]), summed over it:
    total = -sum(log pi(a|x) * pg_advantage) + vf_coeff * 0.5 * sum((vs - V(x))^2)
            - entropy_coeff * sum(entropy of pi(.|x)). Returns it and its parts (stats)."""
    import tensorflow as tf

    obs, actions = batch["obs"], batch["actions"]
    T, B = actions.shape
    flat_obs = tf.reshape(obs, [T * B, -1])
    logits = tf.reshape(policy_net(flat_obs), [T, B, -1])
    all_values = value_net(tf.concat([flat_obs, batch["bootstrap_obs"]], axis=0))[:, 0]
    values, bootstrap_value = tf.reshape(all_values[:T * B], [T, B]), all_values[T * B:]
    log_pi = tf.nn.log_softmax(logits)
    mask = tf.one_hot(actions, tf.shape(logits)[-1], dtype=logits.dtype)
    log_pi_a = tf.reduce_sum(log_pi * mask, -1)  # log pi(a_t|x_t), [T, B]
    log_mu_a = tf.reduce_sum(tf.nn.log_softmax(batch["behaviour_logits"]) * mask, -1)
    vs, pg_adv = vtrace(log_pi_a - log_mu_a, batch["discounts"], batch["rewards"], values,
                        bootstrap_value, cfg.rho_bar, cfg.pg_rho_bar)
    pg_loss = -tf.reduce_sum(log_pi_a * pg_adv)
    vf_loss = 0.5 * tf.reduce_sum(tf.square(vs - values))
    entropy = -tf.reduce_sum(tf.exp(log_pi) * log_pi)
    total = pg_loss + cfg.vf_coeff * vf_loss - cfg.entropy_coeff * entropy
    return total, {"loss": total, "pg": pg_loss, "vf": vf_loss, "entropy": entropy / (T * B),
                   "rho": tf.reduce_mean(tf.exp(log_pi_a - log_mu_a))}


class Learner(threading.Thread):
    """Takes ``unrolls_per_batch`` unrolls off the queue, joins them along B, takes one Adam
    step on their loss, and publishes the new weights (flat float32) with a new version."""

    def __init__(self, cfg: Config, nets: tuple, weights: Any, version: Any, unrolls: Any,
                 stop: Any) -> None:
        super().__init__(name="learner", daemon=True)
        import keras
        import tensorflow as tf

        self.tf, self.cfg, self.nets = tf, cfg, nets
        self.weights, self.version, self.unrolls, self.stop = weights, version, unrolls, stop
        self.variables = nets[0].trainable_variables + nets[1].trainable_variables
        self.optimizer = keras.optimizers.Adam(cfg.lr, global_clipnorm=cfg.grad_clip)
        self.step = tf.function(self._step)
        self.returns: deque[float] = deque(maxlen=100)  # of the last 100 episodes
        self.env_steps, self.updates, self.lag = 0, 0, 0.0
        self.stats: dict[str, float] = {}
        self.error: BaseException | None = None
        self.publish()

    def publish(self) -> None:
        """Copy the weights into the shared vector and bump the version the actors watch."""
        flat = np.concatenate([v.numpy().ravel() for v in self.variables])
        with self.weights.get_lock():
            np.frombuffer(self.weights.get_obj(), np.float32)[:] = flat
            self.version.value += 1

    def _step(self, batch: dict) -> dict:
        with self.tf.GradientTape() as tape:
            _, stats = loss_fn(*self.nets, batch, self.cfg)
        grads = tape.gradient(stats["loss"], self.variables)
        self.optimizer.apply(grads, self.variables)  # clipped to grad_clip's global norm
        return stats

    def next_batch(self) -> dict | None:
        got: list[dict] = []
        while len(got) < self.cfg.unrolls_per_batch:
            if self.stop.is_set():
                return None
            with contextlib.suppress(queue.Empty):
                got.append(self.unrolls.get(timeout=0.2))
        batch = {k: np.concatenate([u[k] for u in got], axis=0 if k == "bootstrap_obs" else 1)
                 for k in ("obs", "actions", "rewards", "discounts", "behaviour_logits",
                           "bootstrap_obs")}
        self.lag = float(np.mean([self.version.value - u["version"] for u in got]))
        for u in got:
            self.returns.extend(u["episode_returns"])
        self.env_steps += batch["actions"].size
        return batch

    def run(self) -> None:
        try:
            while (batch := self.next_batch()) is not None:
                stats = self.step(batch)
                self.publish()
                self.stats = {k: float(v) for k, v in stats.items()}
                self.updates += 1
        except BaseException as exc:  # the main thread reports it and shuts down
            self.error = exc


# ------------------------------------------------------------------- 4. the driver (main)
def parse_args(argv: list[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in dataclasses.fields(Config):
        parser.add_argument("--" + f.name.replace("_", "-"), type=type(f.default),
                            default=f.default, help=f.metadata["help"])
    return Config(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> dict:
    start = time.monotonic()
    cfg = parse_args(argv)
    probe = gym.make(cfg.env)
    obs_dim, num_actions = probe.observation_space.shape[0], int(probe.action_space.n)
    shapes = param_shapes(obs_dim, num_actions, cfg.hidden)
    ctx = mp.get_context("spawn")  # a fresh interpreter per actor: no TF state is copied
    weights = ctx.Array("f", sum(int(np.prod(s)) for s in shapes))  # float32, with a lock
    version, unrolls, stop = ctx.Value("i", 0), ctx.Queue(cfg.queue_size), ctx.Event()
    actors = [ctx.Process(target=actor, name=f"actor-{i}", daemon=True,
                          args=(i, cfg, shapes, weights, version, unrolls, stop))
              for i in range(cfg.num_actors)]
    for p in actors:  # they start while this process imports TensorFlow
        p.start()
    learner, result = None, {"solved": False, "seconds_to_target": None}
    try:
        import keras
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(cfg.tf_threads)
        keras.utils.set_random_seed(cfg.seed)
        learner = Learner(cfg, build_nets(obs_dim, num_actions, cfg), weights, version,
                          unrolls, stop)
        learner.start()
        next_print = 0.0
        while learner.is_alive():
            time.sleep(0.05)  # check the target often, print every log_interval seconds
            now, ln, returns = time.monotonic() - start, learner, list(learner.returns)
            mean = float(np.mean(returns)) if returns else float("nan")
            solved = len(returns) == 100 and mean >= cfg.stop_return
            result.update(env_steps=ln.env_steps, updates=ln.updates, return_mean=mean)
            if now >= next_print or solved:
                next_print, s = now + cfg.log_interval, ln.stats
                print(f"{now:6.1f} s  steps {ln.env_steps:>9,}  updates {ln.updates:>5}  "
                      f"return {mean:5.1f}  loss {s.get('loss', 0):8.1f}  pg {s.get('pg', 0):7.1f}"
                      f"  vf {s.get('vf', 0):8.1f}  entropy {s.get('entropy', 0):.3f}  rho "
                      f"{s.get('rho', 0):.3f}  lag {ln.lag:.1f}", flush=True)
            if solved:
                result.update(solved=True, seconds_to_target=round(now, 2))
                print(f"solved: mean return of the last 100 episodes {mean:.1f} >= "
                      f"{cfg.stop_return:g} after {now:.1f} s, {ln.env_steps:,} env steps, "
                      f"{ln.updates} updates", flush=True)
                break
            if now > cfg.max_seconds:
                print(f"not solved within {cfg.max_seconds:g} s", flush=True)
                break
        if learner.error is not None:
            raise learner.error
    except KeyboardInterrupt:
        print("interrupted: shutting down", flush=True)
    finally:  # stop the learner and the actors; an actor that does not exit is terminated
        stop.set()
        if learner is not None:
            learner.join(timeout=10)
        for p in actors:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join()
    return result


if __name__ == "__main__":
    main()
