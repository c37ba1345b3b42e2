"""Action distributions: the numpy twin (actors) against the TensorFlow twin (learner) on
random logits, against closed forms, the sampler against softmax, and the picker's choices and
errors."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from gymnasium import spaces

from impala_lab.actor.distributions import DISTRIBUTIONS, Categorical, pick_distribution
from impala_lab.errors import ConfigError
from impala_lab.learner.distributions import TWINS, TFCategorical, tf_distribution
from impala_lab.spaces import ACTION_SPACES

TOL = 1e-6  # float32 twins


def _logits(seed: int, shape: tuple[int, ...], scale: float = 1.5) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


# ---------------------------------------------------------------------- twins
@pytest.mark.parametrize("shape", [(7, 2), (5, 3, 6), (4, 8, 18)])
def test_the_twins_agree_on_logp_entropy_and_kl(shape):
    logits, other = _logits(0, shape), _logits(1, shape)
    actions = np.random.default_rng(2).integers(0, shape[-1], shape[:-1])
    np_logp = Categorical.logp(logits, actions)
    tf_logp = TFCategorical.logp(tf.constant(logits), tf.constant(actions, tf.int32)).numpy()
    assert np_logp.shape == shape[:-1] and np_logp.dtype == np.float32
    np.testing.assert_allclose(np_logp, tf_logp, rtol=0, atol=TOL)
    np.testing.assert_allclose(Categorical.entropy(logits),
                               TFCategorical.entropy(tf.constant(logits)).numpy(),
                               rtol=0, atol=TOL)
    np_kl = Categorical.kl(logits, other)
    np.testing.assert_allclose(np_kl, TFCategorical.kl(tf.constant(logits),
                                                       tf.constant(other)).numpy(),
                               rtol=0, atol=TOL)
    assert np_kl.min() > 0.001 and np_kl.max() > 0.1  # the check compares non-zeros


def test_the_categorical_matches_its_closed_forms():
    logits = np.array([[0.0, np.log(3.0)], [2.0, 2.0]], np.float32)  # pi = (1/4, 3/4), (1/2, 1/2)
    np.testing.assert_allclose(Categorical.logp(logits, np.array([1, 0])),
                               [np.log(0.75), np.log(0.5)], rtol=1e-6)
    h = -(0.25 * np.log(0.25) + 0.75 * np.log(0.75))
    np.testing.assert_allclose(Categorical.entropy(logits), [h, np.log(2.0)], rtol=1e-6)
    # KL((1/4, 3/4) || (1/2, 1/2)) = ln 2 - H; KL((1/2, 1/2) || (1/4, 3/4)) = ln(4/3) / 2
    np.testing.assert_allclose(Categorical.kl(logits, logits[::-1]),
                               [np.log(2.0) - h, 0.5 * np.log(4.0 / 3.0)], rtol=1e-6)
    np.testing.assert_allclose(Categorical.kl(logits, logits), [0.0, 0.0], atol=1e-7)
    np.testing.assert_array_equal(Categorical.mode(logits[:1]), [1])


def test_the_tf_logp_is_scalable_agents_arithmetic_bit_for_bit():
    from impala_lab.learner import vtrace

    logits = _logits(3, (6, 4, 5))
    actions = np.random.default_rng(4).integers(0, 5, (6, 4)).astype(np.int32)
    np.testing.assert_array_equal(
        TFCategorical.logp(tf.constant(logits), tf.constant(actions)).numpy(),
        vtrace.log_probs_from_logits_and_actions(logits, actions).numpy())


def test_a_masked_action_has_log_probability_minus_infinity():
    logits = np.array([[0.0, -np.inf, 1.0]], np.float32)
    np.testing.assert_allclose(Categorical.logp(logits, np.array([0, 2])[:1]),
                               [-np.log1p(np.e)], rtol=1e-6)
    assert Categorical.logp(logits, np.array([1]))[0] == -np.inf


# ---------------------------------------------------------------------- sampling
def test_sample_matches_softmax() -> None:
    logits = np.array([[0.0, 1.0, 2.0, -np.inf], [3.0, 3.0, -1.0, 0.5]], np.float32)
    reps = 50_000
    actions = Categorical.sample(np.repeat(logits, reps, axis=0), np.random.default_rng(0))
    assert actions.dtype == np.int64 and actions.shape == (2 * reps,)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    for row in range(2):
        counts = np.bincount(actions[row * reps : (row + 1) * reps], minlength=4)
        freq = counts / reps
        # 5 standard errors: a correct sampler fails this with probability ~1e-6.
        bound = 5 * np.sqrt(probs[row] * (1 - probs[row]) / reps) + 1e-12
        assert np.all(np.abs(freq - probs[row]) <= bound), (row, freq, probs[row])
    assert counts[3] > 0 and np.bincount(actions[:reps], minlength=4)[3] == 0  # -inf: never


def test_sample_is_seeded() -> None:
    logits = np.zeros((64, 5), np.float32)
    a = Categorical.sample(logits, np.random.default_rng(3))
    b = Categorical.sample(logits, np.random.default_rng(3))
    np.testing.assert_array_equal(a, b)
    assert set(a.tolist()) == set(range(5))


# ---------------------------------------------------------------------- the picker
def test_the_picker_gives_both_sides_the_categorical_for_discrete_spaces():
    assert pick_distribution(spaces.Discrete(4)) is Categorical
    assert tf_distribution(spaces.Discrete(4)) is TFCategorical
    assert Categorical.inputs_size(spaces.Discrete(4)) == 4
    assert Categorical.action_shape(spaces.Discrete(4)) == ()
    # every action space kind has a numpy distribution and a TF twin of its name
    assert {kind.name for _, kind in ACTION_SPACES} == set(DISTRIBUTIONS) == set(TWINS)


@pytest.mark.parametrize("space, shown", [
    (spaces.MultiDiscrete([2, 3]), r"MultiDiscrete\(\[2 3\]\)"),
    (spaces.MultiBinary(3), r"MultiBinary\(3\)"),
    (spaces.Tuple([spaces.Discrete(2)]), r"Tuple\(Discrete\(2\)\)"),
    (spaces.Dict({"a": spaces.Discrete(2)}), r"Dict\('a': Discrete\(2\)\)"),
])
def test_the_picker_names_an_unsupported_space_and_what_is_supported(space, shown):
    message = (shown + r" is not supported: impala_lab supports Discrete, Box action spaces "
               r"\(action distributions: Discrete -> categorical, Box -> diag_gaussian\); ")
    with pytest.raises(ConfigError, match=message):
        pick_distribution(space)
    with pytest.raises(ConfigError, match=message):
        tf_distribution(space)


def test_the_picker_refuses_a_discrete_space_that_does_not_start_at_0():
    with pytest.raises(ConfigError, match=r"Discrete action spaces starting at 0; wrap the env "
                                          r"to map actions 0..n-1 to 2..4"):
        pick_distribution(spaces.Discrete(3, start=2))
