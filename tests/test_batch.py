"""Tests for impala_lab.batch.SampleBatch."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from impala_lab.batch import FIELDS, SampleBatch, concat_samples
from tests.batches import assert_batches_equal, make_batch

# ---------------------------------------------------------------------- sizes, repr


def test_sizes_and_properties():
    b = make_batch(T=5, B=3, obs_shape=(4,), A=2, K=2)
    assert (b.T, b.B, b.count, b.num_actions, b.obs_shape) == (5, 3, 15, 2, (4,))
    expected = sum(getattr(b, name).nbytes for name in FIELDS)
    # obs 5*3*4*4 + actions 15*8 + rewards 15*4 + 2 flags 15 + tv 15*4 + logits 30*4
    # + bootstrap 3*4*4 + versions 3*8 + returns 2*8 + lengths 2*8
    assert expected == 240 + 120 + 60 + 30 + 60 + 120 + 48 + 24 + 16 + 16
    assert b.nbytes == expected
    text = repr(b)
    assert text.startswith("SampleBatch(T=5, B=3, obs=float32[5, 3, 4], actions=int64[5, 3]")
    assert "episode_lengths=int64[2]" in text


def test_validate_accepts_valid_batches():
    b = make_batch()
    assert b.validate() is b
    assert b.validate(check_values=True) is b
    make_batch(obs_shape=(16, 16, 3), obs_dtype=np.uint8).validate(check_values=True)
    make_batch(K=0).validate(check_values=True)


@pytest.mark.parametrize(
    "field, bad_shape",
    [
        ("obs", (4, 2, 2)),
        ("rewards", (4, 2)),
        ("terminateds", (3, 3)),
        ("truncateds", (4, 3, 1)),
        ("truncation_values", (4,)),
        ("bootstrap_obs", (3, 5)),
        ("policy_versions", (2,)),
    ],
)
def test_validate_rejects_wrong_shapes(field, bad_shape):
    b = make_batch(T=4, B=3, obs_shape=(2,))
    setattr(b, field, np.zeros(bad_shape, getattr(b, field).dtype))
    with pytest.raises(ValueError, match=f"SampleBatch field '{field}' has shape "):
        b.validate()


def test_validate_messages_name_expected_shape():
    b = make_batch(T=4, B=3, obs_shape=(2,))
    b.rewards = np.zeros((4, 2), np.float32)
    with pytest.raises(ValueError) as info:
        b.validate()
    assert str(info.value) == (
        "SampleBatch field 'rewards' has shape (4, 2), expected (4, 3) "
        "(T=4, B=3, obs_shape=(2,))."
    )
    b = make_batch(T=4, B=3, A=3)
    b.behaviour_logits = np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match=r"'behaviour_logits' has shape \(4, 3\), expected"):
        b.validate()
    b = make_batch(K=2)
    b.episode_lengths = np.ones(3, np.int64)
    with pytest.raises(ValueError, match="'episode_returns' \\(2,\\) and 'episode_lengths'"):
        b.validate()
    b = make_batch()
    b.actions = np.zeros(4, np.int64)
    with pytest.raises(ValueError, match=r"'actions' has shape \(4,\), expected \[T, B\]"):
        b.validate()
    b = make_batch()
    b.rewards = [0.0]
    with pytest.raises(ValueError, match="'rewards' is list, expected a numpy array"):
        b.validate()


@pytest.mark.parametrize(
    "field, dtype",
    [
        ("actions", np.int32),
        ("rewards", np.float64),
        ("terminateds", np.int8),
        ("truncation_values", np.float64),
        ("behaviour_logits", np.float16),
        ("policy_versions", np.int32),
        ("episode_returns", np.float32),
        ("episode_lengths", np.int32),
    ],
)
def test_validate_rejects_wrong_dtypes(field, dtype):
    b = make_batch()
    setattr(b, field, getattr(b, field).astype(dtype))
    with pytest.raises(ValueError, match=f"field '{field}' has dtype {np.dtype(dtype)}, expected"):
        b.validate()


def test_validate_obs_dtypes():
    b = make_batch()
    b.obs = b.obs.astype(np.float64)
    with pytest.raises(ValueError, match="'obs' has dtype float64, expected float32"):
        b.validate()
    b = make_batch()
    b.bootstrap_obs = b.bootstrap_obs.astype(np.float64)
    with pytest.raises(ValueError, match="'bootstrap_obs' has dtype float64 but 'obs' has float32"):
        b.validate()


def test_validate_check_values():
    b = make_batch()
    b.rewards[2, 1] = np.nan
    b.validate()  # shapes are fine
    with pytest.raises(ValueError, match=r"field 'rewards' is not finite at index \(2, 1\)"):
        b.validate(check_values=True)

    b = make_batch()
    b.terminateds[:] = False
    b.truncateds[:] = False
    b.truncation_values[:] = 0
    b.terminateds[1, 2] = b.truncateds[1, 2] = True
    with pytest.raises(ValueError, match=r"\[t=1, b=2\] is both terminated and truncated"):
        b.validate(check_values=True)

    b.terminateds[1, 2] = False
    b.truncation_values[3, 0] = 0.5
    with pytest.raises(ValueError, match=r"'truncation_values' is 0.5 at \[t=3, b=0\]"):
        b.validate(check_values=True)


# ---------------------------------------------------------------------- concat


def test_concat_values_and_shapes():
    a = make_batch(T=4, B=3, K=2, seed=1, version=7)
    b = make_batch(T=4, B=2, K=0, seed=2, version=8)
    c = make_batch(T=4, B=1, K=1, seed=3, version=9)
    out = concat_samples([a, b, c])
    out.validate(check_values=True)
    assert (out.T, out.B, out.count) == (4, 6, 24)
    np.testing.assert_array_equal(out.obs[:, :3], a.obs)
    np.testing.assert_array_equal(out.obs[:, 3:5], b.obs)
    np.testing.assert_array_equal(out.obs[:, 5:], c.obs)
    np.testing.assert_array_equal(out.behaviour_logits[:, 3:5], b.behaviour_logits)
    np.testing.assert_array_equal(out.truncation_values[:, 5], c.truncation_values[:, 0])
    np.testing.assert_array_equal(
        out.bootstrap_obs, np.concatenate([a.bootstrap_obs, b.bootstrap_obs, c.bootstrap_obs])
    )
    np.testing.assert_array_equal(out.policy_versions, [7, 7, 7, 8, 8, 9])
    np.testing.assert_array_equal(
        out.episode_returns, np.concatenate([a.episode_returns, c.episode_returns])
    )
    np.testing.assert_array_equal(
        out.episode_lengths, np.concatenate([a.episode_lengths, c.episode_lengths])
    )
    # The result owns fresh arrays.
    assert not np.shares_memory(out.obs, a.obs)


def test_concat_method_forms():
    a, b = make_batch(seed=1), make_batch(seed=2)
    ref = concat_samples([a, b])
    assert_batches_equal(SampleBatch.concat_samples([a, b]), ref)
    assert_batches_equal(a.concat_samples([a, b]), ref)  # RLlib's call style
    assert_batches_equal(concat_samples((a, b)), ref)
    assert concat_samples([a]) is a


def test_concat_uint8_obs_keeps_dtype():
    a = make_batch(obs_shape=(16, 16, 3), obs_dtype=np.uint8, seed=1)
    b = make_batch(obs_shape=(16, 16, 3), obs_dtype=np.uint8, seed=2)
    out = concat_samples([a, b])
    assert out.obs.dtype == np.uint8 and out.obs.shape == (4, 6, 16, 16, 3)
    assert out.bootstrap_obs.dtype == np.uint8


def test_concat_rejects_mismatched_T():
    a = make_batch(T=4, B=3, obs_shape=(2,))
    b = make_batch(T=5, B=3, obs_shape=(2,))
    with pytest.raises(ValueError) as info:
        concat_samples([a, b])
    assert str(info.value) == (
        "concat_samples: field 'obs' of batch 1 has shape (5, 3, 2) but batch 0 has "
        "(4, 3, 2); batches are joined along axis 1 and need equal T (axis 0) and trailing "
        "dims (same sample_batch_size, env and model)."
    )


def test_concat_rejects_mismatched_field_shapes():
    a = make_batch(obs_shape=(2,))
    b = make_batch(obs_shape=(3,))
    with pytest.raises(ValueError, match=r"field 'obs' of batch 1 has shape \(4, 3, 3\) but "
                       r"batch 0 has \(4, 3, 2\)"):
        concat_samples([a, b])
    c = make_batch(A=3)
    d = make_batch(A=4)
    with pytest.raises(ValueError, match=r"field 'behaviour_logits' of batch 2 has shape "
                       r"\(4, 3, 4\) but batch 0 has \(4, 3, 3\)"):
        concat_samples([c, c, d])
    e = make_batch()
    e.bootstrap_obs = np.zeros((3, 5), np.float32)
    with pytest.raises(ValueError, match=r"field 'bootstrap_obs' of batch 1 has shape \(3, 5\) "
                       r"but batch 0 has \(3, 2\); batches are joined along axis 0 and need "
                       r"equal trailing dims"):
        concat_samples([make_batch(), e])


def test_concat_rejects_mismatched_dtypes_and_missing_fields():
    a = make_batch()
    b = make_batch(obs_dtype=np.uint8)
    with pytest.raises(ValueError, match="field 'obs' of batch 1 has dtype uint8 but batch 0 "
                       "has float32"):
        concat_samples([a, b])
    c = make_batch()
    c.truncation_values = None
    with pytest.raises(ValueError, match="batch 1 is missing field 'truncation_values'"):
        concat_samples([a, c])
    with pytest.raises(ValueError, match="batch 0 is missing field 'truncation_values'"):
        concat_samples([c, a])
    with pytest.raises(ValueError, match="at least one SampleBatch"):
        concat_samples([])
    with pytest.raises(TypeError, match="item 1 is dict, expected a SampleBatch"):
        concat_samples([a, a.to_dict()])


# ---------------------------------------------------------------------- slice / split


def test_slice_columns():
    b = make_batch(T=4, B=5, K=3)
    part = b.slice_columns(1, 4)
    part.validate(check_values=True)
    assert (part.T, part.B) == (4, 3)
    np.testing.assert_array_equal(part.obs, b.obs[:, 1:4])
    np.testing.assert_array_equal(part.behaviour_logits, b.behaviour_logits[:, 1:4])
    np.testing.assert_array_equal(part.bootstrap_obs, b.bootstrap_obs[1:4])
    np.testing.assert_array_equal(part.policy_versions, b.policy_versions[1:4])
    # Episodes go whole to the part starting at column 0, and nowhere else.
    assert part.episode_returns.shape == (0,) and part.episode_lengths.shape == (0,)
    assert part.episode_returns.dtype == np.float64 and part.episode_lengths.dtype == np.int64
    first = b.slice_columns(0, 2)
    np.testing.assert_array_equal(first.episode_returns, b.episode_returns)
    np.testing.assert_array_equal(first.episode_lengths, b.episode_lengths)
    assert np.shares_memory(part.obs, b.obs)  # views, no copy


@pytest.mark.parametrize("start, stop", [(-1, 2), (2, 2), (3, 1), (0, 6)])
def test_slice_columns_out_of_range(start, stop):
    with pytest.raises(ValueError, match=f"slice_columns\\(start={start}, stop={stop}\\) is out "
                       "of range for a batch with B=5"):
        make_batch(B=5).slice_columns(start, stop)


def test_split_columns_round_trip():
    b = make_batch(T=3, B=6, K=4)
    parts = b.split_columns(3)
    assert [p.B for p in parts] == [2, 2, 2]
    assert [len(p.episode_returns) for p in parts] == [4, 0, 0]
    assert_batches_equal(concat_samples(parts), b)
    assert b.split_columns(1)[0].B == 6


def test_split_columns_errors():
    b = make_batch(B=6)
    with pytest.raises(ValueError) as info:
        b.split_columns(4)
    assert str(info.value).startswith(
        "split_columns: B=6 columns cannot be split into n=4 equal parts"
    )
    with pytest.raises(ValueError, match="n=0"):
        b.split_columns(0)


@settings(max_examples=25, deadline=None)
@given(
    widths=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    T=st.integers(1, 5),
    seed=st.integers(0, 1000),
)
def test_concat_then_slice_recovers_parts(widths, T, seed):
    parts = [make_batch(T=T, B=w, K=0, seed=seed + i) for i, w in enumerate(widths)]
    whole = concat_samples(parts)
    assert sum(widths) == whole.B
    start = 0
    for p in parts:
        assert_batches_equal(whole.slice_columns(start, start + p.B), p)
        start += p.B


# ---------------------------------------------------------------------- transport


def test_dict_round_trip(tmp_path):
    b = make_batch(K=3)
    d = b.to_dict()
    assert list(d) == list(FIELDS)
    assert d["obs"] is b.obs
    assert_batches_equal(SampleBatch.from_dict(d), b)
    path = tmp_path / "batch.npz"
    np.savez(path, **d)
    with np.load(path) as data:
        loaded = SampleBatch.from_dict(data)
    assert_batches_equal(loaded, b)


def test_dict_round_trip_empty_episodes(tmp_path):
    b = make_batch(K=0, obs_shape=(16, 16, 3), obs_dtype=np.uint8)
    path = tmp_path / "b.npz"
    np.savez_compressed(path, **b.to_dict())
    with np.load(path) as data:
        assert_batches_equal(SampleBatch.from_dict(data), b)


def test_from_dict_errors():
    d = make_batch().to_dict()
    del d["rewards"]
    d["reward"] = np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match=r"missing fields \['rewards'\], unknown fields "
                       r"\['reward'\]"):
        SampleBatch.from_dict(d)
    d = make_batch().to_dict()
    d["actions"] = d["actions"].astype(np.int32)
    with pytest.raises(ValueError, match="field 'actions' has dtype int32"):
        SampleBatch.from_dict(d)


def test_pickle_round_trip():
    import pickle

    b = make_batch(K=2)
    assert_batches_equal(pickle.loads(pickle.dumps(b)), b)
