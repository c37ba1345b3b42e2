"""`RolloutWorker`: gymnasium envs stepped by a numpy policy, returning `SampleBatch`es.

This is IMPALA's actor (RLlib's ``PolicyEvaluator``). It holds ``num_envs`` envs and a numpy
copy of the policy network; each `sample` call steps every env ``sample_batch_size`` (T)
times, giving one time-major [T, num_envs] batch with the behaviour logits and the weights
version used, which V-trace needs to correct for the policy lag.

Episode boundaries. The worker loops over a plain list of envs and resets an env itself the
moment it reports ``terminated`` or ``truncated``. So:

- ``obs[t, b]`` is always the observation the action ``actions[t, b]`` was taken in; a
  final observation is never recorded as ``obs`` and the reset is never an action.
- At an episode's last step ``terminateds[t, b]`` (discount 0) or ``truncateds[t, b]``
  is set and ``obs[t + 1, b]`` is the first observation of the next episode (the learner
  cuts the trace there). A step that is both terminated and truncated counts as terminated.
- At a truncated step the final observation is lost to the next ``obs`` row, so the
  worker stores ``truncation_values[t, b]`` = V(final obs) under its current numpy model
  and the learner bootstraps from it (the batch's ``final_obs`` keeps the observation too).

Recurrent policies (``use_lstm``). The worker keeps each env's LSTM state (h, c) across
`sample` calls, stores the state before row 0 as the batch's ``state_in`` [B, 2, C], and
zeroes an env's state after the step that ended its episode (terminated or truncated), so the
next episode starts from zeros; a truncated episode's ``truncation_values`` use the state
after its final step, before that reset.

Actions. A Discrete index goes to the env as it is; a Box draw [D] is clipped to the space's
finite bounds (``clip_actions``) and reshaped on its way, while the batch keeps the draw
(`impala_lab.actor.policy_output`). What an env returns is checked in
`impala_lab.actor.env_checks`. numpy and gymnasium only (actor processes import it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from impala_lab.actor.env_checks import FLOAT32_MAX, EnvOutputChecks, fast_int64_action_check
from impala_lab.actor.numpy_model import NumpyModel
from impala_lab.actor.policy_output import Fragment, PolicyOutput
from impala_lab.batch import SampleBatch
from impala_lab.envs import make_env
from impala_lab.model_spec import ModelSpec, check_spaces

__all__ = ["RolloutWorker", "env_description"]

EnvSpec = str | Callable[[], gym.Env]


def env_description(env: EnvSpec) -> str:
    """A short name for an env id or factory: the id itself, or the factory's __qualname__
    (for a ``functools.partial``, that of the wrapped callable)."""
    if isinstance(env, str):
        return env
    name = getattr(env, "__qualname__", None)
    if name is None and hasattr(env, "func"):  # functools.partial
        name = getattr(env.func, "__qualname__", None)
    return name if name is not None else type(env).__name__


class RolloutWorker:
    """Steps ``num_envs`` gymnasium envs with a numpy policy; `sample` returns [T, num_envs].

    Args:
      env: a registered env id (made by `impala_lab.envs.make_env`) or a zero-argument callable
        returning a ``gymnasium.Env`` (called ``num_envs`` times).
      num_envs: envs stepped side by side; the batch's B.
      sample_batch_size: unroll length T of each `sample`.
      model_spec: the policy network (`impala_lab.model_spec.ModelSpec`; must be the
        learner's); None: ``ModelSpec()``. With ``use_lstm`` batches carry ``state_in``.
      seed: seeds envs, action sampling and the initial weights; None = random. Env ``i`` is
        seeded from ``SeedSequence(seed, spawn_key=(worker_index,))``'s child ``i + 1``,
        action sampling from child 0, so equal (seed, worker_index) give equal batches.
      worker_index: this worker's index in the run (seeding and error messages).
      clip_actions: clip Box actions to the space's finite bounds at the env (the batch
        keeps the unclipped draw); no effect on Discrete actions.
      squash_actions: squash Box actions into the bounds with tanh instead of clipping.

    Attributes:
      observation_space, action_space: the envs' spaces.
      num_envs: B; num_actions: A, the width of the behaviour logits.
      env_id: the env id, or the factory's __qualname__.
      model: the `NumpyModel` the worker acts with (change it with `set_weights`).

    Raises:
      ValueError: if an env cannot be built (naming the env), the spaces are unsupported,
        the envs disagree on their spaces, or an argument is out of range.
    """

    def __init__(self, env: EnvSpec, num_envs: int = 1, sample_batch_size: int = 50,
                 model_spec: ModelSpec | None = None, seed: int | None = None,
                 worker_index: int = 0, clip_actions: bool = True,
                 squash_actions: bool = False) -> None:
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"RolloutWorker: num_envs={num_envs!r} must be an int >= 1.")
        if not isinstance(sample_batch_size, int) or sample_batch_size < 1:
            raise ValueError(
                f"RolloutWorker: sample_batch_size={sample_batch_size!r} must be an int >= 1.")
        if not (isinstance(env, str) or callable(env)):
            raise TypeError(
                f"RolloutWorker: env={env!r} must be a gymnasium env id (str) or a "
                "zero-argument callable returning a gymnasium.Env.")
        self._env_spec = env
        self.env_id = env_description(env)
        self.num_envs = num_envs
        self._T = sample_batch_size
        self.worker_index = int(worker_index)
        self.seed = seed
        self._clip_actions = bool(clip_actions)
        self._squash_actions = bool(squash_actions)
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

        spec = ModelSpec() if model_spec is None else model_spec
        try:
            self._build_envs(num_envs, spec.conv_filters if spec.conv_net == "cnn" else None)
            init_seed = seed if seed is not None else int(seq.entropy % (2**63))
            self._build_model(spec, init_seed)
            self._obs = np.empty((num_envs, *self._obs_shape), self._obs_dtype)
            self._reset_all(env_seeds)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ construction
    def _build_envs(self, num_envs: int, conv_filters: Sequence[Sequence[int]] | None) -> None:
        """Builds the envs, checks that they share supported spaces, and sets the batch's
        observation layout from them."""
        for i in range(num_envs):
            self._envs.append(self._make_env(i))
        for i, e in enumerate(self._envs[1:], start=1):
            if (e.observation_space, e.action_space) != (self._envs[0].observation_space,
                                                          self._envs[0].action_space):
                raise ValueError(
                    f"RolloutWorker: env index {i} of {self.env_id!r} has spaces "
                    f"({e.observation_space}, {e.action_space}) but env 0 has "
                    f"({self._envs[0].observation_space}, {self._envs[0].action_space}); all "
                    "envs of a worker need the same spaces.")
        self._set_spaces(self._envs[0].observation_space, self._envs[0].action_space,
                         conv_filters)

    def _set_spaces(self, observation_space: gym.Space, action_space: gym.Space,
                    conv_filters: Sequence[Sequence[int]] | None) -> None:
        """Checks that the model takes one env's spaces and sets the batch's observation
        layout from them."""
        self.observation_space = observation_space
        self.action_space = action_space
        try:
            check_spaces(self.observation_space, self.action_space, conv_filters)
        except ValueError as err:
            raise ValueError(f"RolloutWorker: env {self.env_id!r}: {err}") from err

        self._obs_shape = tuple(self.observation_space.shape)
        # The observation check's fast path: exactly the space's shape and dtype (identity).
        self._space_dtype = np.dtype(self.observation_space.dtype)
        # uint8 frames, and bool images (MinAtar's) as uint8 0/1: a quarter of float32's bytes.
        is_image = self._space_dtype in (np.uint8, np.bool_)
        self._obs_dtype = np.dtype(np.uint8 if is_image else np.float32)
        self._check_obs = self._obs_dtype.kind == "f"
        self._checks = EnvOutputChecks(self.env_id, self.worker_index,
                                       self.observation_space, self._obs_dtype)

    def _build_model(self, spec: ModelSpec, init_seed: int) -> None:
        """The numpy policy, with initial weights drawn from ``init_seed`` (version -1), and
        for a recurrent one each env's state (zeros)."""
        self.model = NumpyModel(self.observation_space, self.action_space, spec)
        self.num_actions = self.model.num_actions  # width of the behaviour logits
        self._policy_output = PolicyOutput(self.model.distribution, self.action_space,
                                           self._clip_actions, self._squash_actions)
        # Each env's (h, c) [num_envs, 2, C]; None for a feed-forward policy.
        self._state = self.model.initial_state(self.num_envs) if spec.use_lstm else None
        self._weights: list[np.ndarray] = list(self.model.initial_weights(init_seed))
        self.model.set_weights(self._weights)
        self._version = -1

    def _make_env(self, index: int) -> gym.Env:
        spec = self._env_spec
        where = f"env index {index} of worker {self.worker_index}"
        try:
            # No passive env checker: one more call per step, and the checks here are stricter.
            e = make_env(spec, disable_env_checker=True) if isinstance(spec, str) else spec()
        except Exception as err:
            kind = "gymnasium.make" if isinstance(spec, str) else "the env factory"
            raise ValueError(
                f"RolloutWorker could not build env {self.env_id!r} ({where}): {kind} raised "
                f"{type(err).__name__}: {err}") from err
        if not isinstance(e, gym.Env):
            raise TypeError(
                f"RolloutWorker: env factory {self.env_id!r} returned {type(e).__name__}, "
                "expected a gymnasium.Env.")
        fast_int64_action_check(e)
        return e

    def _reset_all(self, env_seeds: list[int]) -> None:
        """Resets every env, env ``i`` with seed ``env_seeds[i]``, into ``self._obs``."""
        when = "from reset() before any step"
        for i, (e, s) in enumerate(zip(self._envs, env_seeds, strict=True)):
            obs = self._checks.checked_obs(i, e.reset(seed=s)[0], when)
            if self._check_obs and not np.isfinite(obs).all():
                self._checks.raise_nonfinite(i, "observation", obs, when)
            self._obs[i] = obs

    # ------------------------------------------------------------------ properties
    @property
    def sample_batch_size(self) -> int:
        """T, the unroll length of each `sample`."""
        return self._T

    @property
    def weights_version(self) -> int:
        """Version of the weights in use; -1 until the first `set_weights`."""
        return self._version

    @property
    def state(self) -> np.ndarray | None:
        """Each env's LSTM state [num_envs, 2, C] that the next step starts from (a copy);
        None for a feed-forward policy."""
        return None if self._state is None else self._state.copy()

    # ------------------------------------------------------------------ weights
    def set_weights(self, weights: list[np.ndarray], version: int) -> None:
        """Installs the learner's weights (``keras_model.get_weights()`` order), as given:
        not copied, so do not mutate them afterwards."""
        self.model.set_weights(weights)
        self._weights = list(weights)
        self._version = int(version)

    def get_weights(self) -> tuple[list[np.ndarray], int]:
        """Returns ``(weights, version)``."""
        return self._weights, self._version

    # ------------------------------------------------------------------ sampling
    def sample(self) -> SampleBatch:
        """Steps every env T times with the current weights: a `SampleBatch` [T, num_envs]
        whose ``policy_versions`` are all `weights_version`, its episode arrays the episodes
        that ended in this call, in order of (step, env index).

        Raises:
          ValueError: if an env returns a non-finite observation or reward (naming the env,
            its index, the step and the quantity).
          Exception: whatever an env raises, with a note naming the env and step.
        """
        if self._closed:
            raise RuntimeError(f"RolloutWorker {self.worker_index} is closed; build a new one.")
        dist = self.model.distribution
        frag = Fragment(self._T, self.num_envs, self._obs_shape, self._obs_dtype,
                         self.num_actions, dist.action_shape(self.action_space),
                         dist.action_dtype)
        frag.obs[0] = self._obs
        state_in = None if self._state is None else self._state.copy()
        first_step = self._steps_per_env + 1  # the env step of row 0
        self._step_all(frag, first_step)
        # Rewards are checked once per fragment, for the batch's float32 (NaN, inf and
        # |r| > 3.4e38 all fail the comparison).
        if not (np.abs(frag.rewards64) <= FLOAT32_MAX).all():
            self._checks.check_rewards(frag.rewards64, first_step)
        return self._finish(frag, state_in)

    def _step_all(self, frag: Fragment, first_step: int) -> None:
        """Fills ``frag``: T rows, each one policy forward and one step of every env (the
        hot path: the loop over envs uses locals; only episode ends call a method)."""
        steps = [e.step for e in self._envs]
        ep_ret = self._ep_returns
        ep_len = self._ep_lengths
        ndarray = np.ndarray
        shape = self._obs_shape
        space_dtype = self._space_dtype
        checked_obs = self._checks.checked_obs
        obs_buf = frag.obs
        r_row = [0.0] * self.num_envs
        state = self._state  # None: a feed-forward policy
        i = -1
        t = 0
        try:
            for t in range(self._T):
                acts, state = self._act(frag, t, state)
                nxt = obs_buf[t + 1]
                finals: list[tuple[int, Any]] | None = None
                # np.int64 scalars, as a vector env passes them: `Int64Discrete` answers
                # those with the range test alone.
                for i, a in enumerate(acts):
                    o, r, term, trunc, _ = steps[i](a)
                    # Wrong shapes and dtypes would be broadcast or cast into the batch: the
                    # common case (exact shape and dtype, float reward, bool flags) costs one test.
                    if type(o) is not ndarray or o.shape != shape or o.dtype is not space_dtype:
                        o = checked_obs(i, o, f"from step() at env step {first_step + t}")
                    if type(r) is not float or type(term) is not bool or type(trunc) is not bool:
                        r, term, trunc = self._checks.checked_step(i, r, term, trunc,
                                                                   first_step + t)
                    r_row[i] = r
                    ep_ret[i] += float(r)  # float64 sum, whatever r's type
                    ep_len[i] += 1
                    if term or trunc:
                        o, finals = self._end_episode(frag, t, i, o, bool(term), finals,
                                                      first_step)
                    nxt[i] = o
                i = -1
                self._end_row(frag, t, r_row, finals, state)
            self._state = state
        except Exception as err:
            self._locate(err, f"stepping env index {i}" if i >= 0
                         else "computing the policy's actions", t)
            raise

    def _act(self, frag: Fragment, t: int, state: Any) -> tuple[Any, Any]:
        """Row ``t``'s policy forward: stores the distribution's inputs and the draw in
        ``frag``; returns the actions for the envs (a Box's clipped) and the next LSTM state."""
        model, out, version = self.model, self._policy_output, self._version
        if state is None:
            logits = model.logits(frag.obs[t])  # values only at truncations
        else:
            logits, _, state = model.step(frag.obs[t], state)
        out.check(logits, version)
        frag.logits[t] = logits
        frag.actions[t] = acts = model.distribution.sample(logits, self._rng)
        return out.env_actions(acts, logits, version), state

    def _end_episode(self, frag: Fragment, t: int, i: int, final_obs: Any, terminated: bool,
                     finals: list[tuple[int, Any]] | None, first_step: int
                     ) -> tuple[Any, list[tuple[int, Any]] | None]:
        """Env ``i``'s episode ended at row ``t``: records it and resets the env; returns the
        reset observation and ``finals``, with ``(i, final observation)`` if truncated."""
        if terminated:
            frag.terminateds[t, i] = True
        else:
            frag.truncateds[t, i] = True
            finals = finals or []  # None until the row's first truncation
            # Copied: reset() may reuse the env's obs buffer.
            finals.append((i, np.array(final_obs, copy=True)))
        frag.done_returns.append(float(self._ep_returns[i]))
        frag.done_lengths.append(self._ep_lengths[i])
        self._ep_returns[i] = 0.0
        self._ep_lengths[i] = 0
        o, _ = self._envs[i].reset()
        if (type(o) is not np.ndarray or o.shape != self._obs_shape
                or o.dtype is not self._space_dtype):
            o = self._checks.checked_obs(i, o, f"from reset() after env step {first_step + t}")
        return o, finals

    def _end_row(self, frag: Fragment, t: int, r_row: list[Any],
                 finals: list[tuple[int, Any]] | None, state: np.ndarray | None) -> None:
        """Every env stepped once: stores the rewards, checks the next observations, computes
        the truncated episodes' bootstrap values (keeping their final observations), and zeroes
        a recurrent ``state`` in place where an episode ended."""
        self._steps_per_env += 1
        frag.rewards64[t] = r_row
        nxt = frag.obs[t + 1]
        if self._check_obs and not np.isfinite(nxt).all():
            self._checks.check_row(nxt, t, self._steps_per_env, frag.terminateds,
                                    frag.truncateds)
        if finals is not None:
            self._fill_truncation_values(finals, frag.truncation_values[t], state)
            frag.finals += [(i, t, o) for i, o in finals]
        if state is not None:
            ended = frag.terminateds[t] | frag.truncateds[t]
            if ended.any():
                state[ended] = 0.0

    def _locate(self, err: Exception, where: str, t: int) -> None:
        """Notes where ``err`` happened (what the worker did, at row ``t``) unless a check did."""
        if getattr(err, "_impala_lab_located", False):
            return
        err.add_note(
            f"(RolloutWorker {self.worker_index}, env {self.env_id!r}: raised while "
            f"{where}, at step {t} of the fragment, env step {self._steps_per_env + 1})")

    def _finish(self, frag: Fragment, state_in: np.ndarray | None) -> SampleBatch:
        """The `SampleBatch` of a filled fragment; the worker moves on past it."""
        T, n = self._T, self.num_envs
        rewards = frag.rewards64.astype(np.float32)
        self._obs = frag.obs[T].copy()
        self.num_env_steps += T * n
        self.num_episodes += len(frag.done_returns)
        return SampleBatch(
            obs=frag.obs[:T], actions=frag.actions, rewards=rewards,
            terminateds=frag.terminateds, truncateds=frag.truncateds,
            truncation_values=frag.truncation_values, behaviour_logits=frag.logits,
            bootstrap_obs=self._obs.copy(),
            policy_versions=np.full(n, self._version, np.int64),
            episode_returns=np.asarray(frag.done_returns, np.float64),
            episode_lengths=np.asarray(frag.done_lengths, np.int64),
            state_in=state_in, final_obs=frag.final_obs())

    def _fill_truncation_values(self, finals: list[tuple[int, Any]], out_row: np.ndarray,
                                state: np.ndarray | None) -> None:
        """out_row[i] = V(final obs of env i) for every truncated env i of this step; a
        recurrent policy reads it with env i's ``state`` after the step (before its reset)."""
        idx = [i for i, _ in finals]
        final_obs = np.stack([o for _, o in finals]).astype(self._obs_dtype, copy=False)
        if self._check_obs and not np.isfinite(final_obs).all():
            k = int(np.argwhere(~np.isfinite(final_obs).reshape(len(idx), -1).all(1))[0, 0])
            self._checks.raise_nonfinite(
                idx[k], "observation", final_obs[k],
                f"at env step {self._steps_per_env} (the final observation of a truncated "
                "episode, needed for its bootstrap value)")
        if state is None:
            _, values = self.model(final_obs)
        else:
            _, values, _ = self.model.step(final_obs, state[idx])
        out_row[idx] = values

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
            f"RolloutWorker(env={self.env_id!r}, num_envs={self.num_envs}, "
            f"sample_batch_size={self._T}, worker_index={self.worker_index}, "
            f"weights_version={getattr(self, '_version', None)})")
