"""`RolloutWorker`: gymnasium envs stepped by a numpy policy, returning `SampleBatch`es.

This is IMPALA's actor (RLlib's ``PolicyEvaluator`` in the seed). It holds
``num_envs`` envs and a numpy copy of the policy network, and each `sample` call steps
every env ``sample_batch_size`` (T) times, giving one time-major [T, num_envs] batch with
the behaviour logits and the weights version used, which V-trace needs to correct for the
policy lag between this actor and the learner.

Episode boundaries. The worker loops over a plain list of envs and resets an env itself
the moment it reports ``terminated`` or ``truncated`` (measured about 1.3-1.6x faster
than ``gymnasium.vector.SyncVectorEnv`` for 8 CartPole envs here). So:

- ``obs[t, b]`` is always the observation the action ``actions[t, b]`` was taken in; a
  final observation is never recorded as ``obs`` and the reset is never an action.
- At an episode's last step ``terminateds[t, b]`` (discount 0) or ``truncateds[t, b]``
  is set and ``obs[t + 1, b]`` is the first observation of the next episode (the learner
  cuts the trace there). A step that is both terminated and truncated counts as terminated.
- At a truncated step the final observation is lost to the next ``obs`` row, so the
  worker stores ``truncation_values[t, b]`` = V(final obs) under its current numpy model
  and the learner bootstraps from it.

This module imports numpy and gymnasium only (no TensorFlow): actor processes import it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from impala_lab import models
from impala_lab.batch import SampleBatch

__all__ = ["RolloutWorker", "env_description"]

EnvSpec = str | Callable[[], gym.Env]
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def env_description(env: EnvSpec) -> str:
    """A short name for an env id or factory: the id itself, or the factory's __qualname__
    (for a ``functools.partial``, that of the wrapped callable)."""
    if isinstance(env, str):
        return env
    name = getattr(env, "__qualname__", None)
    if name is None and hasattr(env, "func"):  # functools.partial
        name = getattr(env.func, "__qualname__", None)
    return name if name is not None else type(env).__name__


class Int64Discrete(gym.spaces.Discrete):
    """A `Discrete` space whose ``contains`` answers an ``np.int64`` scalar directly.

    Envs such as CartPole assert ``action_space.contains(action)`` on every step, and
    gymnasium's check spends about 2 us on dtype tests: a fifth of a CartPole worker's CPU
    (py-spy, issue 8). The worker's actions are np.int64 scalars, for which the answer is the
    range test alone, as in `Discrete.contains`; any other value goes to `Discrete.contains`.
    """

    def contains(self, x: Any) -> bool:
        if type(x) is np.int64:
            return bool(self.start <= x < self.start + self.n)
        return super().contains(x)


def fast_int64_action_check(env: gym.Env) -> None:
    """Gives ``env``'s own int64 `Discrete` action space the `Int64Discrete` check (in place;
    the space stays equal to what it was and answers every ``contains`` the same)."""
    space = getattr(env.unwrapped, "action_space", None)
    if type(space) is gym.spaces.Discrete and space.dtype == np.int64:
        space.__class__ = Int64Discrete


class RolloutWorker:
    """Steps ``num_envs`` gymnasium envs with a numpy policy; `sample` returns [T, num_envs].

    Args:
      env: a gymnasium env id (built with ``gymnasium.make``) or a zero-argument callable
        returning a ``gymnasium.Env`` (called ``num_envs`` times).
      num_envs: envs stepped side by side; the batch's B.
      sample_batch_size: unroll length T of each `sample`.
      hiddens: hidden layer sizes of the policy network (must match the learner's model).
      vf_share_layers: whether the value head shares the policy's trunk (as the learner's).
      gamma: discount; kept for the learner and reports (the worker does not discount).
      seed: seeds envs, action sampling and the initial weights; None = random. Env ``i`` is
        seeded from ``SeedSequence(seed, spawn_key=(worker_index,))``'s child ``i + 1``,
        action sampling from child 0, so equal (seed, worker_index) give equal batches.
      worker_index: this worker's index in the run (seeding and error messages).

    Raises:
      ValueError: if an env cannot be built (naming the env), the spaces are unsupported,
        the envs disagree on their spaces, or an argument is out of range.
    """

    def __init__(
        self,
        env: EnvSpec,
        num_envs: int = 1,
        sample_batch_size: int = 50,
        hiddens: Sequence[int] = (64, 64),
        vf_share_layers: bool = False,
        gamma: float = 0.99,
        seed: int | None = None,
        worker_index: int = 0,
    ) -> None:
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"RolloutWorker: num_envs={num_envs!r} must be an int >= 1.")
        if not isinstance(sample_batch_size, int) or sample_batch_size < 1:
            raise ValueError(
                f"RolloutWorker: sample_batch_size={sample_batch_size!r} must be an int >= 1."
            )
        if not (isinstance(env, str) or callable(env)):
            raise TypeError(
                f"RolloutWorker: env={env!r} must be a gymnasium env id (str) or a "
                "zero-argument callable returning a gymnasium.Env."
            )
        self._env_spec = env
        self._env_id = env_description(env)
        self._num_envs = num_envs
        self._T = sample_batch_size
        self.gamma = float(gamma)
        self.worker_index = int(worker_index)
        self.seed = seed
        self._envs: list[gym.Env] = []
        self._closed = False
        self._ep_returns = [0.0] * num_envs  # running return of each env's episode
        self._ep_lengths = [0] * num_envs
        self._steps_per_env = 0  # step() calls each env has had (they step in lockstep)
        self.num_env_steps = 0
        self.num_episodes = 0

        seq = np.random.SeedSequence(seed, spawn_key=(self.worker_index,))
        children = seq.spawn(num_envs + 1)
        self._rng = np.random.default_rng(children[0])
        env_seeds = [int(c.generate_state(1, np.uint32)[0]) for c in children[1:]]

        try:
            for i in range(num_envs):
                self._envs.append(self._make_env(i))
            self._observation_space = self._envs[0].observation_space
            self._action_space = self._envs[0].action_space
            for i, e in enumerate(self._envs[1:], start=1):
                if e.observation_space != self._observation_space or (
                    e.action_space != self._action_space
                ):
                    raise ValueError(
                        f"RolloutWorker: env index {i} of {self._env_id!r} has spaces "
                        f"({e.observation_space}, {e.action_space}) but env 0 has "
                        f"({self._observation_space}, {self._action_space}); all envs of a "
                        "worker need the same spaces."
                    )
            try:
                models.check_spaces(self._observation_space, self._action_space)
            except ValueError as err:
                raise ValueError(f"RolloutWorker: env {self._env_id!r}: {err}") from err

            self._obs_shape = tuple(self._observation_space.shape)
            # The fast path of the observation check: an ndarray of exactly the space's shape
            # and dtype (the dtype object compared by identity; any other passes or fails in
            # `_checked_obs`).
            self._space_dtype = np.dtype(self._observation_space.dtype)
            is_image = self._space_dtype == np.uint8
            self._obs_dtype = np.dtype(np.uint8 if is_image else np.float32)
            self._check_obs = self._obs_dtype.kind == "f"
            self._num_actions = int(self._action_space.n)

            self._model = models.NumpyModel(
                self._observation_space, self._action_space, hiddens=tuple(hiddens),
                vf_share_layers=vf_share_layers,
            )
            init_seed = seed if seed is not None else int(seq.entropy % (2**63))
            self._weights: list[np.ndarray] = list(self._model.initial_weights(init_seed))
            self._model.set_weights(self._weights)
            self._version = -1

            self._obs = np.empty((num_envs, *self._obs_shape), self._obs_dtype)
            for i, (e, s) in enumerate(zip(self._envs, env_seeds, strict=True)):
                self._obs[i] = self._reset_env(i, e, seed=s)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ construction
    def _make_env(self, index: int) -> gym.Env:
        spec = self._env_spec
        where = f"env index {index} of worker {self.worker_index}"
        try:
            # A registered env has passed gymnasium's checks; its passive checker is one more
            # wrapper call per step (and the NaN checks here are stricter).
            e = gym.make(spec, disable_env_checker=True) if isinstance(spec, str) else spec()
        except Exception as err:
            kind = "gymnasium.make" if isinstance(spec, str) else "the env factory"
            raise ValueError(
                f"RolloutWorker could not build env {self._env_id!r} ({where}): {kind} raised "
                f"{type(err).__name__}: {err}"
            ) from err
        if not isinstance(e, gym.Env):
            raise TypeError(
                f"RolloutWorker: env factory {self._env_id!r} returned {type(e).__name__}, "
                "expected a gymnasium.Env."
            )
        fast_int64_action_check(e)
        return e

    def _reset_env(self, index: int, env: gym.Env, seed: int | None = None) -> np.ndarray:
        obs, _ = env.reset(seed=seed)
        after = f"after env step {self._steps_per_env}" if self._steps_per_env else (
            "before any step"
        )
        obs = self._checked_obs(index, obs, f"from reset() {after}")
        if self._check_obs and not np.isfinite(obs).all():
            self._raise_nonfinite(index, "observation", obs, f"from reset() {after}")
        return obs

    # ------------------------------------------------------------------ properties
    @property
    def observation_space(self) -> gym.Space:
        return self._observation_space

    @property
    def action_space(self) -> gym.Space:
        return self._action_space

    @property
    def num_actions(self) -> int:
        return self._num_actions

    @property
    def num_envs(self) -> int:
        return self._num_envs

    @property
    def sample_batch_size(self) -> int:
        return self._T

    @property
    def env_id(self) -> str:
        """The env id, or the factory's __qualname__."""
        return self._env_id

    @property
    def weights_version(self) -> int:
        """Version of the weights in use; -1 until the first `set_weights`."""
        return self._version

    @property
    def model(self) -> models.NumpyModel:
        """The numpy policy the worker acts with (read it; change it with `set_weights`)."""
        return self._model

    # ------------------------------------------------------------------ weights
    def set_weights(self, weights: list[np.ndarray], version: int) -> None:
        """Installs the learner's weights (``keras_model.get_weights()`` order).

        The arrays are used as given, not copied: do not mutate them afterwards.
        """
        self._model.set_weights(weights)
        self._weights = list(weights)
        self._version = int(version)

    def get_weights(self) -> tuple[list[np.ndarray], int]:
        """Returns ``(weights, version)``."""
        return self._weights, self._version

    # ------------------------------------------------------------------ sampling
    def sample(self) -> SampleBatch:
        """Steps every env T times with the current weights.

        Returns:
          A `SampleBatch` of shape [T, num_envs]; ``policy_versions`` is the current
          `weights_version` for every column; the episode arrays hold the episodes that
          ended during this call, in order of (step, env index).

        Raises:
          ValueError: if an env returns a non-finite observation or reward (naming the env,
            its index, the step and the quantity).
          Exception: whatever an env raises, with a note naming the env and step.
        """
        if self._closed:
            raise RuntimeError(f"RolloutWorker {self.worker_index} is closed; build a new one.")
        T, n = self._T, self._num_envs
        obs_buf = np.empty((T + 1, n, *self._obs_shape), self._obs_dtype)
        obs_buf[0] = self._obs
        actions = np.empty((T, n), np.int64)
        logits_buf = np.empty((T, n, self._num_actions), np.float32)
        # float64 first: a reward too large for float32 (1e39) is checked, not cast to inf.
        rewards64 = np.empty((T, n), np.float64)
        terminateds = np.zeros((T, n), np.bool_)
        truncateds = np.zeros((T, n), np.bool_)
        truncation_values = np.zeros((T, n), np.float32)
        done_returns: list[float] = []
        done_lengths: list[int] = []

        # Locals: this loop is the actor's hot path.
        model = self._model
        sample_actions = models.sample_actions
        rng = self._rng
        envs = self._envs
        steps = [e.step for e in envs]
        ep_ret = self._ep_returns
        ep_len = self._ep_lengths
        check_obs = self._check_obs
        isfinite = np.isfinite
        ndarray = np.ndarray
        shape = self._obs_shape
        space_dtype = self._space_dtype
        checked_obs = self._checked_obs
        first_step = self._steps_per_env + 1  # the env step of row 0
        r_row = [0.0] * n
        i = -1
        t = 0
        try:
            for t in range(T):
                logits = model.logits(obs_buf[t])  # values only at truncations
                acts = sample_actions(logits, rng)
                logits_buf[t] = logits
                actions[t] = acts
                nxt = obs_buf[t + 1]
                truncated_final: list[tuple[int, Any]] | None = None
                # np.int64 scalars, as a vector env passes them: `Int64Discrete` answers
                # those with the range test alone.
                for i, a in enumerate(acts):
                    o, r, term, trunc, _ = steps[i](a)
                    # Numpy would broadcast a wrong-shaped observation into the batch (a
                    # scalar, or (1, 4) into (4,)) and cast a wrong dtype: checked here, with
                    # the common case (the space's exact shape and dtype) as one cheap test.
                    if type(o) is not ndarray or o.shape != shape or o.dtype is not space_dtype:
                        o = checked_obs(i, o, f"from step() at env step {first_step + t}")
                    r_row[i] = r
                    ep_ret[i] += float(r)  # float64 sum, whatever r's type
                    ep_len[i] += 1
                    if term or trunc:
                        if term:
                            terminateds[t, i] = True
                        else:
                            truncateds[t, i] = True
                            if truncated_final is None:
                                truncated_final = []
                            # Copied: reset() may reuse the env's obs buffer.
                            truncated_final.append((i, np.array(o, copy=True)))
                        done_returns.append(float(ep_ret[i]))
                        done_lengths.append(ep_len[i])
                        ep_ret[i] = 0.0
                        ep_len[i] = 0
                        o, _ = envs[i].reset()
                        if (type(o) is not ndarray or o.shape != shape
                                or o.dtype is not space_dtype):
                            o = checked_obs(i, o, "from reset() after env step "
                                            f"{first_step + t}")
                    nxt[i] = o
                i = -1
                self._steps_per_env += 1
                rewards64[t] = r_row
                if check_obs and not isfinite(nxt).all():
                    self._check_row(nxt, t, terminateds, truncateds)
                if truncated_final is not None:
                    self._fill_truncation_values(truncated_final, truncation_values[t])
        except Exception as err:
            if not getattr(err, "_impala_lab_located", False):
                if i >= 0:
                    where = f"stepping env index {i}"
                else:
                    where = "computing the policy's actions"
                err.add_note(
                    f"(RolloutWorker {self.worker_index}, env {self._env_id!r}: raised while "
                    f"{where}, at step {t} of the fragment, env step "
                    f"{self._steps_per_env + 1})"
                )
            raise
        # Rewards are checked once per fragment, after the cast to float32 that the batch
        # holds (NaN, inf and |r| > 3.4e38 all fail the comparison).
        if not (np.abs(rewards64) <= _FLOAT32_MAX).all():
            self._check_rewards(rewards64, first_step)
        rewards = rewards64.astype(np.float32)

        self._obs = obs_buf[T].copy()
        self.num_env_steps += T * n
        self.num_episodes += len(done_returns)
        policy_versions = np.full(n, self._version, np.int64)
        return SampleBatch(
            obs=obs_buf[:T],
            actions=actions,
            rewards=rewards,
            terminateds=terminateds,
            truncateds=truncateds,
            truncation_values=truncation_values,
            behaviour_logits=logits_buf,
            bootstrap_obs=self._obs.copy(),
            policy_versions=policy_versions,
            episode_returns=np.asarray(done_returns, np.float64),
            episode_lengths=np.asarray(done_lengths, np.int64),
        )

    def _fill_truncation_values(
        self, finals: list[tuple[int, Any]], out_row: np.ndarray
    ) -> None:
        """out_row[i] = V(final obs of env i) for every truncated env i of this step."""
        idx = [i for i, _ in finals]
        final_obs = np.stack([o for _, o in finals]).astype(self._obs_dtype, copy=False)
        if self._check_obs and not np.isfinite(final_obs).all():
            k = int(np.argwhere(~np.isfinite(final_obs).reshape(len(idx), -1).all(1))[0, 0])
            self._raise_nonfinite(
                idx[k], "observation", final_obs[k],
                f"at env step {self._steps_per_env} (the final observation of a truncated "
                "episode, needed for its bootstrap value)",
            )
        _, values = self._model(final_obs)
        out_row[idx] = values

    def _check_rewards(self, rewards: np.ndarray, first_step: int) -> None:
        """Raise for the first reward (in step order) that float32 cannot hold finitely."""
        t, i = (int(k) for k in np.argwhere(~(np.abs(rewards) <= _FLOAT32_MAX))[0])
        r = float(rewards[t, i])
        when = f"at env step {first_step + t}"
        if not math.isfinite(r):
            self._raise_nonfinite(i, "reward", r, when)
        err = ValueError(  # finite as a Python float, infinite in the batch's float32
            f"env {self._env_id!r} (env index {i} of worker {self.worker_index}) returned "
            f"a reward of {r:g} {when}: the batch holds rewards as float32, whose largest "
            f"finite value is {_FLOAT32_MAX:.4g}, so it would become inf. Fix the env (or wrap "
            "it to scale or clip its rewards); an infinite reward would otherwise surface as "
            "a NaN loss much later."
        )
        err._impala_lab_located = True  # type: ignore[attr-defined]
        raise err

    def _checked_obs(self, index: int, obs: Any, when: str) -> np.ndarray:
        """The slow path of the observation check: ``obs`` as an array if the batch can hold
        it exactly, else a ValueError naming the env, the step and what the space expects.

        Accepted: the space's shape exactly, and for a float batch any bool, integer or float
        dtype (cast to float32; a value float32 cannot hold shows up as non-finite); for a
        uint8 (image) batch uint8, or bool/integer values within 0-255. Not accepted: any other
        shape (numpy would broadcast a scalar or a (1, 4) array into (4,)), floats for an image
        (they would be truncated), complex, strings, objects.
        """
        try:
            arr = np.asarray(obs)
        except Exception as exc:  # ragged lists and the like
            self._raise_bad_obs(index, when, f"that numpy cannot read as an array "
                                f"({type(obs).__name__}; {type(exc).__name__}: {exc})")
        got = f"{type(obs).__name__}, dtype {arr.dtype}"
        if arr.shape != self._obs_shape:
            self._raise_bad_obs(index, when, f"of shape {arr.shape} ({got})")
        kind = arr.dtype.kind
        if self._obs_dtype == np.uint8:
            ok = arr.dtype == np.uint8 or (kind in "biu" and (
                arr.size == 0 or (int(arr.min()) >= 0 and int(arr.max()) <= 255)))
        else:
            ok = kind in "biuf"
        if not ok:
            self._raise_bad_obs(index, when, f"of dtype {arr.dtype} ({type(obs).__name__}, "
                                f"shape {arr.shape})")
        return arr

    def _raise_bad_obs(self, index: int, when: str, what: str) -> None:
        err = ValueError(
            f"env {self._env_id!r} (env index {index} of worker {self.worker_index}) returned "
            f"an observation {what} {when}, but its observation space "
            f"{self._observation_space} expects shape {self._obs_shape} and dtype "
            f"{self._space_dtype}. Fix the env (or wrap it to reshape or cast its "
            "observation); numpy would otherwise broadcast or cast it into the batch and the "
            "policy would train on corrupted data."
        )
        err._impala_lab_located = True  # type: ignore[attr-defined]
        raise err

    def _check_row(
        self, row: np.ndarray, t: int, terminateds: np.ndarray, truncateds: np.ndarray
    ) -> None:
        bad = ~np.isfinite(row.reshape(len(row), -1)).all(axis=1)
        i = int(np.argmax(bad))
        step = self._steps_per_env
        reset = bool(terminateds[t, i] or truncateds[t, i])
        when = f"from reset() after env step {step}" if reset else f"at env step {step}"
        self._raise_nonfinite(i, "observation", row[i], when)

    def _raise_nonfinite(self, index: int, quantity: str, value: Any, when: str) -> None:
        text = np.array2string(np.asarray(value), threshold=8, precision=4)
        err = ValueError(
            f"env {self._env_id!r} (env index {index} of worker {self.worker_index}) returned "
            f"a non-finite {quantity} {when}: {text}. "
            "Fix the env (or wrap it to clip/validate its output); a NaN here would "
            "otherwise surface as a NaN loss much later."
        )
        err._impala_lab_located = True  # type: ignore[attr-defined]
        raise err

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Closes the envs (idempotent)."""
        self._closed = True
        envs, self._envs = self._envs, []
        for e in envs:
            # Closing must not mask the error that brought us here.
            with contextlib.suppress(Exception):
                e.close()

    def __enter__(self) -> RolloutWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"RolloutWorker(env={self._env_id!r}, num_envs={self._num_envs}, "
            f"sample_batch_size={self._T}, worker_index={self.worker_index}, "
            f"weights_version={getattr(self, '_version', None)})"
        )
