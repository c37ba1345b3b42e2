"""TF1RMSprop: TensorFlow 1's RMSProp (mean square starts at ones), by hand, against a numpy
reimplementation and against TF1's own ``tf.compat.v1.train.RMSPropOptimizer``; its state
travels through the policy's checkpoint helpers."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from impala_lab.config import ImpalaConfig
from impala_lab.learner.optimizers import TF1RMSprop
from impala_lab.learner.vtrace_policy import VTracePolicy

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACT = gym.spaces.Discrete(2)

# RLlib's IMPALA settings
LR, RHO, EPS = 0.01, 0.99, 0.1
VAR0 = np.array([[1.0, -2.0, 0.5], [0.25, 3.0, -0.75]], np.float32)


def numpy_tf1_rmsprop(var, grads, lr, rho, momentum, epsilon):
    """TF1's ApplyRMSProp in float64: ms from ones, mom from zeros; the var after each step."""
    var = np.asarray(var, np.float64).copy()
    ms, mom, out = np.ones_like(var), np.zeros_like(var), []
    for g in grads:
        ms = rho * ms + (1 - rho) * g.astype(np.float64) ** 2
        mom = momentum * mom + lr * g / np.sqrt(ms + epsilon)
        var = var - mom
        out.append(var.copy())
    return out


def run(optimizer, grads, compiled=False):
    var = tf.Variable(VAR0)
    optimizer.build([var])
    apply = (tf.function(lambda g: optimizer.apply([g], [var])) if compiled
             else (lambda g: optimizer.apply([g], [var])))
    out = []
    for g in grads:
        apply(tf.constant(g))
        out.append(var.numpy().copy())
    return out


def random_grads(n, seed=0):
    rng = np.random.default_rng(seed)
    # float32, as TF1's kernel requires (it aborts the process on a float64 gradient)
    return [(rng.normal(0.0, 1.0, VAR0.shape) * rng.choice([0.01, 1.0, 20.0])).astype(np.float32)
            for _ in range(n)]


def test_first_step_is_tf1s_formula_by_hand():
    g = np.array([[0.1, -0.2, 3.0], [0.0, 1e-3, -40.0]], np.float32)
    (after,) = run(TF1RMSprop(learning_rate=LR, rho=RHO, epsilon=EPS), [g])
    # TF1: ms starts at 1, so ms_1 = 0.99 + 0.01 g^2 and the step is lr g / sqrt(ms_1 + eps)
    ms1 = 0.99 * 1.0 + 0.01 * g.astype(np.float64) ** 2
    expected = VAR0 - 0.01 * g / np.sqrt(ms1 + 0.1)
    np.testing.assert_allclose(after, expected, rtol=0, atol=1e-6)
    # Keras's RMSprop (ms from zeros) steps much further on small gradients: about 3.3x
    (keras_after,) = run(keras.optimizers.RMSprop(learning_rate=LR, rho=RHO, epsilon=EPS), [g])
    ratio = (keras_after - VAR0)[0, 0] / (after - VAR0)[0, 0]
    assert ratio == pytest.approx(np.sqrt(1.09 / 0.1), rel=1e-2)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("compiled", [False, True])
def test_steps_follow_the_numpy_reimplementation(momentum, compiled):
    grads = random_grads(30)
    got = run(TF1RMSprop(learning_rate=LR, rho=RHO, momentum=momentum, epsilon=EPS), grads,
              compiled=compiled)
    expected = numpy_tf1_rmsprop(VAR0, grads, LR, RHO, momentum, EPS)
    for step, (a, b) in enumerate(zip(got, expected, strict=True)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"step {step + 1}")


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_steps_equal_tensorflow_1s_own_rmsprop(momentum):
    grads = random_grads(30, seed=1)
    got = run(TF1RMSprop(learning_rate=LR, rho=RHO, momentum=momentum, epsilon=EPS), grads)
    var = tf.Variable(VAR0)
    reference = tf.compat.v1.train.RMSPropOptimizer(LR, decay=RHO, momentum=momentum,
                                                    epsilon=EPS)
    for step, (g, a) in enumerate(zip(grads, got, strict=True)):
        reference.apply_gradients([(tf.constant(g), var)])
        np.testing.assert_allclose(a, var.numpy(), rtol=1e-6, atol=1e-7,
                                   err_msg=f"step {step + 1}")


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_each_update_is_one_fused_kernel_op_and_equals_tf1_bit_for_bit(momentum):
    """The traced update holds one ResourceApplyRMSProp per variable and none of the ops the
    written-out formula needs; its result is TF1's own optimizer's, bit for bit (the same
    kernel). With momentum 0 the kernel's mom goes to a buffer that is no optimizer
    variable."""
    var = tf.Variable(VAR0)
    opt = TF1RMSprop(learning_rate=LR, rho=RHO, momentum=momentum, epsilon=EPS)

    @tf.function(autograph=False)
    def apply(g):
        opt.apply([g], [var])  # built here, inside the trace: the buffers come eagerly

    g0 = random_grads(1, seed=2)[0]
    graph = apply.get_concrete_function(tf.constant(g0)).graph
    op_types = [op.type for op in graph.get_operations()]
    assert op_types.count("ResourceApplyRMSProp") == 1
    assert "Sqrt" not in op_types and "Square" not in op_types
    assert len(opt.variables) == 2 + (2 if momentum > 0 else 1)  # iterations, lr, rms(, mom)
    reference_var = tf.Variable(VAR0)
    reference = tf.compat.v1.train.RMSPropOptimizer(LR, decay=RHO, momentum=momentum,
                                                    epsilon=EPS)
    for g in random_grads(10, seed=3):
        apply(tf.constant(g))
        reference.apply_gradients([(tf.constant(g), reference_var)])
        assert var.numpy().tobytes() == reference_var.numpy().tobytes()
    assert int(opt.iterations.numpy()) == 10


def test_slots_start_as_tf1s_and_the_config_round_trips():
    var = tf.Variable(VAR0)
    opt = TF1RMSprop(learning_rate=LR, rho=RHO, momentum=0.5, epsilon=EPS)
    opt.build([var])
    slots = {v.name: v.numpy() for v in opt.variables if v.shape == VAR0.shape}
    assert len(slots) == 2
    (rms,) = (v for name, v in slots.items() if "rms" in name)
    (mom,) = (v for name, v in slots.items() if "momentum" in name)
    np.testing.assert_array_equal(rms, np.ones_like(VAR0))
    np.testing.assert_array_equal(mom, np.zeros_like(VAR0))
    no_momentum = TF1RMSprop(momentum=0.0)
    no_momentum.build([tf.Variable(VAR0)])
    assert sum(v.shape == VAR0.shape for v in no_momentum.variables) == 1  # rms only
    again = TF1RMSprop.from_config(opt.get_config())
    assert (again.rho, again.momentum, again.epsilon) == (RHO, 0.5, EPS)
    assert float(again.learning_rate) == pytest.approx(LR)
    with pytest.raises(ValueError, match="epsilon"):
        TF1RMSprop(epsilon=0.0)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_rmsprop_state_round_trips_through_the_policys_checkpoint_helpers(momentum):
    from impala_lab.actor.rollout_worker import RolloutWorker

    with RolloutWorker("CartPole-v1", num_envs=4, sample_batch_size=20, seed=3) as worker:
        batches = [worker.sample() for _ in range(3)]
    config = ImpalaConfig(seed=1, opt_type="rmsprop", momentum=momentum, lr=0.01)
    source = VTracePolicy(OBS, ACT, config)
    rms = [v.numpy() for v in source.optimizer.variables if "rms" in v.name]
    assert len(rms) == len(source.model.trainable_variables)
    assert all(np.all(a == 1.0) for a in rms)  # TF1's start, saved as such
    for b in batches[:2]:
        source.learn_on_batch(b)
    state = source.optimizer_state()
    target = VTracePolicy(OBS, ACT, ImpalaConfig(seed=7, opt_type="rmsprop",
                                                 momentum=momentum, lr=0.5))
    target.set_weights(*source.get_weights())
    target.set_optimizer_state(state)
    for a, b in zip(target.optimizer_state(), state, strict=True):
        assert a.tobytes() == b.tobytes()
    assert float(target.lr.numpy()) == pytest.approx(0.01)
    # the restored learner takes the same next step, bit for bit
    source.learn_on_batch(batches[2])
    target.learn_on_batch(batches[2])
    for a, b in zip(source.model.get_weights(), target.model.get_weights(), strict=True):
        assert a.tobytes() == b.tobytes()
    with pytest.raises(ValueError, match="optimizer state has"):
        target.set_optimizer_state(state[:-1])


def test_the_policys_first_rmsprop_step_is_tf1s_formula():
    from impala_lab.actor.rollout_worker import RolloutWorker
    from impala_lab.learner.vtrace_policy import batch_to_tensors

    with RolloutWorker("CartPole-v1", num_envs=4, sample_batch_size=20, seed=3) as worker:
        batch = worker.sample()
    policy = VTracePolicy(OBS, ACT, ImpalaConfig(seed=1, opt_type="rmsprop", lr=0.01))
    before = [v.numpy().copy() for v in policy.model.trainable_variables]
    grads, _ = policy.compute_gradients(
        {k: tf.convert_to_tensor(v) for k, v in batch_to_tensors(batch).items()})
    clipped, _ = tf.clip_by_global_norm(grads, policy.config.grad_clip)
    policy.learn_on_batch(batch)
    for w0, g, var in zip(before, clipped, policy.model.trainable_variables, strict=True):
        g = g.numpy().astype(np.float64)
        expected = w0 - 0.01 * g / np.sqrt(0.99 + 0.01 * g**2 + 0.1)  # ms from ones (TF1)
        np.testing.assert_allclose(var.numpy(), expected, rtol=0, atol=1e-6)
