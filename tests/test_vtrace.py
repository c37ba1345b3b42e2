"""V-trace: TensorFlow against the numpy reference (the paper's explicit sum) and by hand."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from impala_lab.learner import vtrace

CLIPS = [(1.0, 1.0), (None, None), (0.5, 2.0), (3.7, None)]


def _inputs(rng: np.random.Generator, T: int, B: int, trailing: tuple[int, ...] = ()) -> dict:
    shape = (T, B, *trailing)
    # Discount 0 marks terminations; log_rhos wide enough that clips bite both ways.
    discounts = np.where(rng.random(shape) < 0.1, 0.0, 0.95).astype(np.float32)
    return dict(
        log_rhos=rng.normal(scale=1.0, size=shape).astype(np.float32),
        discounts=discounts,
        rewards=rng.normal(size=shape).astype(np.float32),
        values=rng.normal(size=shape).astype(np.float32),
        bootstrap_value=rng.normal(size=(B, *trailing)).astype(np.float32),
    )


def _assert_close(tf_returns, np_returns) -> None:
    for field in ("vs", "pg_advantages"):
        actual = getattr(tf_returns, field).numpy()
        expected = getattr(np_returns, field)
        assert actual.shape == expected.shape, field
        assert actual.dtype == np.float32
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=2e-5, err_msg=field)


@pytest.mark.parametrize("T", [1, 5, 50])
@pytest.mark.parametrize("B", [1, 7])
@pytest.mark.parametrize("clips", CLIPS)
def test_matches_numpy_reference(T: int, B: int, clips) -> None:
    rng = np.random.default_rng(T * 100 + B)
    inputs = _inputs(rng, T, B)
    rho, pg_rho = clips
    got = vtrace.from_importance_weights(
        **inputs, clip_rho_threshold=rho, clip_pg_rho_threshold=pg_rho
    )
    want = vtrace.from_importance_weights_numpy(
        **inputs, clip_rho_threshold=rho, clip_pg_rho_threshold=pg_rho
    )
    assert want.vs.shape == (T, B)
    _assert_close(got, want)


def test_clips_change_the_result() -> None:
    # Guards the reference comparison above: the thresholds must actually matter.
    inputs = _inputs(np.random.default_rng(3), 20, 7)
    clipped = vtrace.from_importance_weights_numpy(**inputs)
    unclipped = vtrace.from_importance_weights_numpy(
        **inputs, clip_rho_threshold=None, clip_pg_rho_threshold=None
    )
    assert np.abs(clipped.vs - unclipped.vs).max() > 0.1
    assert np.abs(clipped.pg_advantages - unclipped.pg_advantages).max() > 0.1


def test_hand_computed_two_steps() -> None:
    # rewards [1, 2], values [0.5, 1.0], V(x_2) = 3, gamma 0.9, rhos [2, 0.5].
    inputs = dict(
        log_rhos=np.log([[2.0], [0.5]]),
        discounts=np.full((2, 1), 0.9),
        rewards=np.array([[1.0], [2.0]]),
        values=np.array([[0.5], [1.0]]),
        bootstrap_value=np.array([3.0]),
    )
    # clip 1: rhos -> [1, 0.5], cs [1, 0.5]; delta_1 = 0.5 * 3.7 = 1.85, delta_0 = 1.4.
    # vs_1 = 1 + 1.85, vs_0 = 0.5 + 1.4 + 0.9 * 1 * 1.85; pg_0 = 1 + 0.9 * 2.85 - 0.5.
    clipped_vs, clipped_pg = [[3.565], [2.85]], [[3.065], [1.85]]
    # no clip: rho_0 = 2 doubles delta_0 and pg_0; c_0 = min(1, 2) = 1 still.
    free_vs, free_pg = [[4.965], [2.85]], [[6.13], [1.85]]
    for fn in (vtrace.from_importance_weights, vtrace.from_importance_weights_numpy):
        out = fn(**inputs)
        np.testing.assert_allclose(np.asarray(out.vs), clipped_vs, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(out.pg_advantages), clipped_pg, rtol=1e-6)
        out = fn(**inputs, clip_rho_threshold=None, clip_pg_rho_threshold=None)
        np.testing.assert_allclose(np.asarray(out.vs), free_vs, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(out.pg_advantages), free_pg, rtol=1e-6)


@pytest.mark.parametrize("rank_one_trailing", [False, True])
def test_trailing_dimension(rank_one_trailing: bool) -> None:
    rng = np.random.default_rng(11)
    inputs = _inputs(rng, 6, 7, (3,))
    if rank_one_trailing:
        # Only log_rhos carries 3 entries; the rest broadcast from a trailing dim of 1.
        for key in ("discounts", "rewards", "values", "bootstrap_value"):
            inputs[key] = inputs[key][..., :1]
    got = vtrace.from_importance_weights(**inputs, clip_rho_threshold=0.8)
    want = vtrace.from_importance_weights_numpy(**inputs, clip_rho_threshold=0.8)
    assert got.vs.shape == (6, 7, 3)
    _assert_close(got, want)
    # Each trailing slice is an independent [T, B] problem.
    sliced = {k: v[..., 1] if v.shape[-1] == 3 else v[..., 0] for k, v in inputs.items()}
    np.testing.assert_allclose(
        got.vs.numpy()[..., 1],
        vtrace.from_importance_weights(**sliced, clip_rho_threshold=0.8).vs.numpy(),
        rtol=1e-6,
        atol=1e-6,
    )


def _n_step_returns(discounts, rewards, bootstrap_value) -> np.ndarray:
    """sum_{t>=s} (prod_{i<t} gamma_i) r_t + (prod gamma) V(x_T), one element at a time."""
    T, B = rewards.shape
    out = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            total, scale = 0.0, 1.0
            for t in range(s, T):
                total += scale * float(rewards[t, b])
                scale *= float(discounts[t, b])
            out[s, b] = total + scale * float(bootstrap_value[b])
    return out


@pytest.mark.parametrize("T", [1, 5, 50])
def test_on_policy_equals_n_step_return(T: int) -> None:
    inputs = _inputs(np.random.default_rng(T), T, 7)
    inputs["log_rhos"] = np.zeros_like(inputs["log_rhos"])
    out = vtrace.from_importance_weights(
        **inputs, clip_rho_threshold=None, clip_pg_rho_threshold=None
    )
    returns = _n_step_returns(inputs["discounts"], inputs["rewards"], inputs["bootstrap_value"])
    np.testing.assert_allclose(out.vs.numpy(), returns, rtol=1e-5, atol=2e-5)
    next_vs = np.concatenate([returns[1:], inputs["bootstrap_value"][None]], axis=0)
    advantages = inputs["rewards"] + inputs["discounts"] * next_vs - inputs["values"]
    np.testing.assert_allclose(out.pg_advantages.numpy(), advantages, rtol=1e-5, atol=2e-5)
    # On-policy, the default clips (1.0) change nothing.
    default = vtrace.from_importance_weights(**inputs)
    np.testing.assert_allclose(default.vs.numpy(), out.vs.numpy(), rtol=1e-6)


def test_scan_path_for_unknown_or_long_T() -> None:
    # T unknown while tracing, or T > _MAX_UNROLL, takes the tf.scan path.
    spec = tf.TensorSpec([None, None], tf.float32)
    fn = tf.function(
        vtrace.from_importance_weights, input_signature=[spec] * 4 + [tf.TensorSpec([None])]
    )
    for T in (3, 17):
        inputs = _inputs(np.random.default_rng(T), T, 4)
        _assert_close(fn(*inputs.values()), vtrace.from_importance_weights_numpy(**inputs))
    assert fn.experimental_get_tracing_count() == 1
    long_inputs = _inputs(np.random.default_rng(0), vtrace._MAX_UNROLL + 22, 2)
    _assert_close(
        vtrace.from_importance_weights(**long_inputs, clip_rho_threshold=None),
        vtrace.from_importance_weights_numpy(**long_inputs, clip_rho_threshold=None),
    )


def _logits_inputs(rng: np.random.Generator, T: int, B: int, A: int) -> dict:
    base = _inputs(rng, T, B)
    del base["log_rhos"]
    return dict(
        behaviour_policy_logits=rng.normal(size=(T, B, A)).astype(np.float32),
        target_policy_logits=rng.normal(size=(T, B, A)).astype(np.float32),
        actions=rng.integers(0, A, size=(T, B)),
        **base,
    )


@pytest.mark.parametrize("clips", CLIPS[:2])
def test_from_logits_consistent_with_importance_weights(clips) -> None:
    inputs = _logits_inputs(np.random.default_rng(5), 9, 7, 4)
    rho, pg_rho = clips
    out = vtrace.from_logits(**inputs, clip_rho_threshold=rho, clip_pg_rho_threshold=pg_rho)
    assert isinstance(out, vtrace.VTraceFromLogitsReturns)

    ref = vtrace.from_logits_numpy(**inputs, clip_rho_threshold=rho, clip_pg_rho_threshold=pg_rho)
    for field in vtrace.VTraceFromLogitsReturns._fields:
        np.testing.assert_allclose(
            getattr(out, field).numpy(), getattr(ref, field), rtol=1e-5, atol=2e-5, err_msg=field
        )

    target_lp = vtrace.log_probs_from_logits_and_actions(
        inputs["target_policy_logits"], inputs["actions"]
    )
    behaviour_lp = vtrace.log_probs_from_logits_and_actions(
        inputs["behaviour_policy_logits"], inputs["actions"]
    )
    np.testing.assert_allclose(out.target_action_log_probs.numpy(), target_lp.numpy())
    np.testing.assert_allclose(out.log_rhos.numpy(), (target_lp - behaviour_lp).numpy())
    direct = vtrace.from_importance_weights(
        log_rhos=out.log_rhos,
        discounts=inputs["discounts"],
        rewards=inputs["rewards"],
        values=inputs["values"],
        bootstrap_value=inputs["bootstrap_value"],
        clip_rho_threshold=rho,
        clip_pg_rho_threshold=pg_rho,
    )
    np.testing.assert_array_equal(out.vs.numpy(), direct.vs.numpy())
    np.testing.assert_array_equal(out.pg_advantages.numpy(), direct.pg_advantages.numpy())


def test_log_probs_by_hand() -> None:
    logits = np.array([[[0.0, np.log(3.0)]]], np.float32)  # probs [0.25, 0.75]
    out = vtrace.log_probs_from_logits_and_actions(logits, np.array([[1]]))
    np.testing.assert_allclose(out.numpy(), [[np.log(0.75)]], rtol=1e-6)
    np.testing.assert_allclose(
        vtrace.log_probs_from_logits_and_actions_numpy(logits, np.array([[0]])),
        [[np.log(0.25)]],
        rtol=1e-6,
    )


def test_outputs_carry_no_gradient() -> None:
    inputs = {
        k: tf.constant(v) for k, v in _logits_inputs(np.random.default_rng(2), 5, 3, 4).items()
    }
    watched = [k for k in inputs if k != "actions"]
    with tf.GradientTape(persistent=True) as tape:
        for key in watched:
            tape.watch(inputs[key])
        out = vtrace.from_logits(**inputs)
        loss = tf.reduce_sum(out.vs) + tf.reduce_sum(out.pg_advantages)
        log_prob_sum = tf.reduce_sum(out.target_action_log_probs)
    grads = tape.gradient(loss, [inputs[k] for k in watched])
    assert grads == [None] * len(watched)
    # Like scalable_agent, the log-probs keep their gradient (the policy loss needs it).
    grad = tape.gradient(log_prob_sum, inputs["target_policy_logits"])
    assert grad is not None and float(tf.reduce_max(tf.abs(grad))) > 0.0


def test_importance_weights_outputs_carry_no_gradient() -> None:
    inputs = [tf.Variable(v) for v in _inputs(np.random.default_rng(4), 4, 2).values()]
    with tf.GradientTape() as tape:
        out = vtrace.from_importance_weights(*inputs)
        loss = tf.reduce_sum(out.vs * 2.0) + tf.reduce_sum(out.pg_advantages)
    assert tape.gradient(loss, inputs) == [None] * 5


def test_no_retracing_for_same_shapes() -> None:
    traces = []

    @tf.function
    def step(log_rhos, discounts, rewards, values, bootstrap_value):
        traces.append(log_rhos.shape)
        return vtrace.from_importance_weights(
            log_rhos, discounts, rewards, values, bootstrap_value, clip_rho_threshold=1.0
        )

    rng = np.random.default_rng(8)
    for _ in range(5):
        inputs = {k: tf.constant(v) for k, v in _inputs(rng, 20, 8).items()}
        _assert_close(step(**inputs), vtrace.from_importance_weights_numpy(**inputs))
    assert traces == [tf.TensorShape([20, 8])]
    step(**{k: tf.constant(v) for k, v in _inputs(rng, 10, 8).items()})
    assert len(traces) == 2  # a new shape traces once more, as expected


def test_from_logits_no_retracing() -> None:
    fn = tf.function(vtrace.from_logits)
    rng = np.random.default_rng(9)
    for _ in range(4):
        inputs = {k: tf.constant(v) for k, v in _logits_inputs(rng, 7, 3, 2).items()}
        fn(**inputs)
    assert fn.experimental_get_tracing_count() == 1


GOOD = _inputs(np.random.default_rng(0), 4, 3)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"values": GOOD["values"][0]},
            r"values has shape \(3,\) \(rank 1\) but must have rank 2: expected the rank of "
            r"log_rhos, \[T, B\]",
        ),
        (
            {"bootstrap_value": GOOD["values"]},
            r"bootstrap_value has shape \(4, 3\) \(rank 2\) but must have rank 1: expected \[B\]",
        ),
        (
            {"discounts": GOOD["discounts"][..., None]},
            r"discounts has shape \(4, 3, 1\) \(rank 3\) but must have rank 2",
        ),
        ({"rewards": GOOD["rewards"][0]}, r"rewards has shape \(3,\) \(rank 1\)"),
        (
            {"log_rhos": GOOD["log_rhos"][0]},
            r"log_rhos has shape \(3,\) but must have a known rank of at least 2: expected "
            r"\[T, B\]",
        ),
        (
            {"bootstrap_value": np.zeros(5, np.float32)},
            r"bootstrap_value has shape \(5,\) but values has shape \(4, 3\): expected "
            r"bootstrap_value of shape values.shape\[1:\] = \(3,\)",
        ),
        (
            {"clip_rho_threshold": [1.0, 2.0]},
            r"clip_rho_threshold has shape \(2,\) \(rank 1\) but must have rank 0: expected a "
            r"scalar \(or None\)",
        ),
        (
            {key: GOOD[key][:0] for key in ("log_rhos", "discounts", "rewards", "values")},
            r"log_rhos has shape \(0, 3\) with T = 0 steps",
        ),
    ],
)
def test_rank_errors(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        vtrace.from_importance_weights(**{**GOOD, **change})


def test_numpy_reference_rank_errors() -> None:
    with pytest.raises(
        ValueError, match=r"values has shape \(3,\) \(rank 1\) but must have rank 2"
    ):
        vtrace.from_importance_weights_numpy(**{**GOOD, "values": GOOD["values"][0]})
    with pytest.raises(ValueError, match=r"bootstrap_value has shape \(4, 3\) \(rank 2\)"):
        vtrace.from_importance_weights_numpy(**{**GOOD, "bootstrap_value": GOOD["values"]})


def test_from_logits_rank_errors() -> None:
    inputs = _logits_inputs(np.random.default_rng(1), 4, 3, 2)
    with pytest.raises(
        ValueError,
        match=r"behaviour_policy_logits has shape \(4, 3\) \(rank 2\) but must have rank 3: "
        r"expected \[T, B, NUM_ACTIONS\]",
    ):
        vtrace.from_logits(**{**inputs, "behaviour_policy_logits": inputs["rewards"]})
    with pytest.raises(ValueError, match=r"target_policy_logits has shape \(3, 2\) \(rank 2\)"):
        vtrace.from_logits(**{**inputs, "target_policy_logits": inputs["target_policy_logits"][0]})
    with pytest.raises(
        ValueError, match=r"actions has shape \(4, 3, 1\) \(rank 3\) but must have rank 2"
    ):
        vtrace.from_logits(**{**inputs, "actions": inputs["actions"][..., None]})
    with pytest.raises(ValueError, match=r"actions has dtype float32 but must be an integer"):
        vtrace.log_probs_from_logits_and_actions(inputs["target_policy_logits"], inputs["rewards"])


def test_vtrace_numpy_alias() -> None:
    assert vtrace.vtrace_numpy is vtrace.from_importance_weights_numpy
