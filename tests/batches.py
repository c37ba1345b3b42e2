"""SampleBatch builders and checks the tests share: a valid batch of random contents, and
equality of every field (values and dtype)."""

from __future__ import annotations

import numpy as np

from impala_lab.batch import FIELDS, SampleBatch


def make_batch(
    T: int = 4,
    B: int = 3,
    obs_shape: tuple[int, ...] = (2,),
    A: int = 3,
    K: int = 2,
    seed: int = 0,
    obs_dtype: type = np.float32,
    version: int = 0,
) -> SampleBatch:
    """A valid batch with distinct random contents."""
    rng = np.random.default_rng(seed)
    if obs_dtype == np.uint8:
        obs = rng.integers(0, 256, (T + 1, B, *obs_shape)).astype(np.uint8)
    else:
        obs = rng.standard_normal((T + 1, B, *obs_shape)).astype(obs_dtype)
    terminateds = rng.random((T, B)) < 0.2
    truncateds = (rng.random((T, B)) < 0.2) & ~terminateds
    return SampleBatch(
        obs=obs[:T],
        actions=rng.integers(0, A, (T, B)).astype(np.int64),
        rewards=rng.standard_normal((T, B)).astype(np.float32),
        terminateds=terminateds,
        truncateds=truncateds,
        truncation_values=np.where(truncateds, rng.standard_normal((T, B)), 0).astype(
            np.float32
        ),
        behaviour_logits=rng.standard_normal((T, B, A)).astype(np.float32),
        bootstrap_obs=obs[T].copy(),
        policy_versions=np.full(B, version, np.int64),
        episode_returns=rng.standard_normal(K),
        episode_lengths=rng.integers(1, 100, K).astype(np.int64),
    )


def assert_batches_equal(a: SampleBatch, b: SampleBatch) -> None:
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)
