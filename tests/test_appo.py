"""APPO (``loss="appo"``): the clipped surrogate and its KL term against a numpy reference
written from the formula (loss and gradients, Discrete and Box), the policy's loss with it
(feed-forward and LSTM), more passes lowering the surrogate, minibatches, the adaptive KL
coefficient and the config's rules."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tensorflow as tf

from impala_lab.actor.rollout_worker import RolloutWorker
from impala_lab.config import ImpalaConfig
from impala_lab.errors import ConfigError
from impala_lab.learner.appo import (
    APPO_STAT_KEYS,
    adapt_kl_coeff,
    appo_advantages,
    clipped_surrogate,
)
from impala_lab.learner.corrections import correction_terms
from impala_lab.learner.distributions import TFCategorical, TFDiagGaussian
from impala_lab.learner.keras_model import lstm_unroll
from impala_lab.learner.vtrace_policy import VTracePolicy, batch_to_tensors
from impala_lab.learner.vtrace_reference import from_importance_weights_numpy

CLIP, KL_COEFF = 0.2, 0.7


# ---------------------------------------------------------------------- the numpy reference
def np_logp(dist: str, z: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log pi(a|z) [T, B] and its gradient d logp / dz [T, B, A], float64."""
    if dist == "categorical":
        p = np.exp(z - z.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        onehot = np.eye(z.shape[-1])[a]
        return np.log((p * onehot).sum(-1)), onehot - p
    m, ls = np.split(z, 2, axis=-1)
    s2 = np.exp(2 * ls)
    logp = (-0.5 * (a - m) ** 2 / s2 - ls - 0.5 * np.log(2 * np.pi)).sum(-1)
    return logp, np.concatenate([(a - m) / s2, (a - m) ** 2 / s2 - 1.0], axis=-1)


def np_kl(dist: str, mu: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """KL(mu || pi) [T, B] and its gradient with respect to pi's inputs z, float64."""
    if dist == "categorical":
        def log_softmax(x):
            x = x - x.max(-1, keepdims=True)
            return x - np.log(np.exp(x).sum(-1, keepdims=True))
        lq, lp = log_softmax(mu), log_softmax(z)
        return (np.exp(lq) * (lq - lp)).sum(-1), np.exp(lp) - np.exp(lq)
    m1, ls1 = np.split(mu, 2, axis=-1)
    m2, ls2 = np.split(z, 2, axis=-1)
    s1, s2 = np.exp(2 * ls1), np.exp(2 * ls2)
    kl = (ls2 - ls1 + (s1 + (m1 - m2) ** 2) / (2 * s2) - 0.5).sum(-1)
    return kl, np.concatenate([(m2 - m1) / s2, 1.0 - (s1 + (m1 - m2) ** 2) / s2], axis=-1)


def np_appo(dist, mu, z, a, rewards, discounts, values, bootstrap, rho_bar=1.0):
    """The APPO policy term from the formula: (policy_loss, kl_loss, clip fraction, and the
    gradient of policy_loss + KL_COEFF * kl_loss with respect to z)."""
    logp, dlogp = np_logp(dist, z, a)
    log_mu, _ = np_logp(dist, mu, a)
    rho = np.exp(logp - log_mu)
    vs = from_importance_weights_numpy(logp - log_mu, discounts, rewards, values, bootstrap,
                                       clip_rho_threshold=rho_bar).vs
    next_vs = np.concatenate([vs[1:], bootstrap[None]], axis=0)
    adv = rewards + discounts * next_vs - values
    clipped = np.clip(rho, 1 - CLIP, 1 + CLIP)
    loss = -np.minimum(rho * adv, clipped * adv).sum()
    # d/dlogp of -min(rho A, clip(rho) A): -rho A where the unclipped term is the smaller
    active = rho * adv <= clipped * adv
    g_logp = np.where(active, -rho * adv, 0.0)
    kl, dkl = np_kl(dist, mu, z)
    grad = g_logp[..., None] * dlogp + KL_COEFF * dkl
    return loss, kl.sum(), np.mean(np.abs(rho - 1) > CLIP), grad


def _case(dist: str, seed: int = 0, T: int = 6, B: int = 5) -> dict:
    rng = np.random.default_rng(seed)
    width = 3 if dist == "categorical" else 4  # 3 actions; or D = 2 means and 2 log-stds
    mu = rng.normal(0, 0.4, (T, B, width))
    z = mu + rng.normal(0, 0.4, (T, B, width))  # ratios from about 0.3 to 3: both branches
    if dist == "categorical":
        a = rng.integers(0, 3, (T, B))
    else:
        m, ls = np.split(mu, 2, axis=-1)
        a = m + np.exp(ls) * rng.normal(size=m.shape)
    return dict(mu=mu, z=z, a=a, rewards=rng.normal(size=(T, B)),
                discounts=np.where(rng.random((T, B)) < 0.15, 0.0, 0.9),
                values=rng.normal(size=(T, B)), bootstrap=rng.normal(size=B))


@pytest.mark.parametrize("dist", ["categorical", "diag_gaussian"])
def test_the_surrogate_and_its_kl_term_match_the_formula_in_value_and_gradient(dist):
    c = _case(dist)
    distribution = TFCategorical if dist == "categorical" else TFDiagGaussian
    f32 = {k: tf.constant(v, tf.int32 if k == "a" and dist == "categorical" else tf.float32)
           for k, v in c.items()}
    z = tf.Variable(f32["z"])
    with tf.GradientTape() as tape:
        terms = correction_terms("vtrace", behaviour_logits=f32["mu"], target_logits=z,
                                 actions=f32["a"], discounts=f32["discounts"],
                                 rewards=f32["rewards"], values=f32["values"],
                                 bootstrap_value=f32["bootstrap"], distribution=distribution)
        adv = appo_advantages(terms.vs, f32["rewards"], f32["discounts"], f32["values"],
                              f32["bootstrap"])
        loss, clip_fraction = clipped_surrogate(terms.log_rhos, adv, CLIP)
        kl = tf.reduce_sum(distribution.kl(f32["mu"], z))
        total = loss + KL_COEFF * kl
    grad = tape.gradient(total, z).numpy()
    ref_loss, ref_kl, ref_fraction, ref_grad = np_appo(dist, **c)
    assert 0.1 < ref_fraction < 0.9  # the case exercises both branches of the min
    assert float(loss) == pytest.approx(ref_loss, rel=1e-4, abs=1e-4)
    assert float(kl) == pytest.approx(ref_kl, rel=1e-4, abs=1e-5)
    assert float(clip_fraction) == pytest.approx(ref_fraction)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-3, atol=1e-4)


def test_advantages_use_the_vtrace_targets_and_carry_no_gradient():
    vs, values = tf.constant([[2.0], [3.0]]), tf.Variable([[1.0], [0.5]])
    with tf.GradientTape() as tape:
        adv = appo_advantages(vs, tf.constant([[1.0], [0.5]]), tf.constant([[0.9], [0.0]]),
                              values, tf.constant([4.0]))
    # A_0 = 1 + 0.9 * v_1 - V_0 = 1 + 2.7 - 1; A_1 = 0.5 + 0 * V(x_2) - 0.5
    np.testing.assert_allclose(adv.numpy(), [[2.7], [0.0]], atol=1e-6)
    assert tape.gradient(adv, values) is None


def test_the_kl_coefficient_follows_rllibs_rule():
    assert adapt_kl_coeff(1.0, 0.03, 0.01) == 1.5
    assert adapt_kl_coeff(1.0, 0.004, 0.01) == 0.5
    assert adapt_kl_coeff(1.0, 0.01, 0.01) == 1.0


# ---------------------------------------------------------------------- the policy's loss
@pytest.fixture(scope="module")
def batches() -> dict:
    rng = np.random.default_rng(5)
    out = {}
    for env in ("CartPole-v1", "Pendulum-v1"):
        with RolloutWorker(env, num_envs=4, sample_batch_size=16, seed=3) as worker:
            b = worker.sample()
            out[env] = (b, worker.observation_space, worker.action_space)
        # a lagged behaviour policy: ratios away from 1, so the clip matters
        b.behaviour_logits += rng.normal(0, 0.3, b.behaviour_logits.shape).astype(np.float32)
    return out


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("use_lstm", [False, True])
def test_the_policys_appo_loss_is_the_formula_on_its_own_network_outputs(batches, env,
                                                                        use_lstm):
    batch, obs_space, act_space = batches[env]
    cfg = ImpalaConfig(seed=2, loss="appo", clip_param=CLIP, use_kl_loss=True,
                       kl_coeff=KL_COEFF, use_lstm=use_lstm, gamma=0.9)
    if use_lstm:  # the actors' state at the start of the unroll (zeros: episodes start)
        batch = batch.slice_columns(0, batch.B)
        batch.state_in = np.zeros((batch.B, 2, cfg.lstm_cell_size), np.float32)
    policy = VTracePolicy(obs_space, act_space, cfg)
    tensors = {k: tf.constant(v) for k, v in batch_to_tensors(batch).items()}
    _, stats = policy.loss_and_stats(tensors)
    if use_lstm:
        dones = tf.constant((batch.terminateds | batch.truncateds).astype(np.float32))
        logits, values, bootstrap, _ = lstm_unroll(policy.model, policy.trunk, tensors["obs"],
                                                   tensors["state_in"], dones,
                                                   tensors["bootstrap_obs"])
        logits, values, bootstrap = logits.numpy(), values.numpy(), bootstrap.numpy()
    else:
        flat, values = policy.compute_logits_and_values(batch.obs.reshape(batch.count, -1))
        logits = flat.reshape(batch.T, batch.B, -1)
        values = values.reshape(batch.T, batch.B)
        bootstrap = policy.compute_logits_and_values(batch.bootstrap_obs)[1]
    truncated = batch.truncateds & ~batch.terminateds
    rewards = batch.rewards + 0.9 * truncated * batch.truncation_values
    discounts = 0.9 * ~(batch.terminateds | batch.truncateds)
    dist = "categorical" if env == "CartPole-v1" else "diag_gaussian"
    loss, kl, fraction, _ = np_appo(dist, batch.behaviour_logits.astype(np.float64),
                                    logits.astype(np.float64), batch.actions, rewards,
                                    discounts, values, bootstrap)
    assert float(stats["policy_loss"]) == pytest.approx(loss, rel=1e-3, abs=1e-3)
    assert float(stats["kl"]) == pytest.approx(kl / batch.count, rel=1e-3, abs=1e-6)
    assert float(stats["clip_fraction"]) == pytest.approx(fraction, abs=1e-6)
    assert float(stats["kl_coeff"]) == pytest.approx(KL_COEFF)


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_more_passes_over_one_batch_lower_the_surrogate_loss(batches, env):
    batch, obs_space, act_space = batches[env]
    # No value loss and no entropy: the value net stays put, so the passes optimise the
    # surrogate alone; its loss is read with the weights after 0, 1, 2, 4 and 8 passes.
    # (Adam at lr 0.003 overshoots on CartPole's batch after 4 passes.)
    cfg = ImpalaConfig(seed=2, loss="appo", vf_loss_coeff=0.0, entropy_coeff=0.0, lr=0.0003)
    policy = VTracePolicy(obs_space, act_space, cfg)
    tensors = {k: tf.constant(v) for k, v in batch_to_tensors(batch).items()}
    losses, passes = [], 0
    for target in (0, 1, 2, 4, 8):
        while passes < target:
            stats = policy.learn_on_batch(batch)
            passes += 1
        losses.append(float(policy.loss_and_stats(tensors)[1]["policy_loss"]))
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    assert stats["clip_fraction"] > 0  # by 8 passes some ratios have left the clip range


def test_minibatches_are_one_update_each_on_the_columns_in_order(batches):
    batch, obs_space, act_space = batches["CartPole-v1"]  # 4 columns of 16 steps
    cfg = dict(seed=2, loss="appo", sample_batch_size=16, num_envs_per_worker=4,
               train_batch_size=64)
    split = VTracePolicy(obs_space, act_space, ImpalaConfig(minibatch_size=32, **cfg))
    by_hand = VTracePolicy(obs_space, act_space, ImpalaConfig(**cfg))
    stats = split.learn_on_batch(batch)
    parts = [by_hand.learn_on_batch(batch.slice_columns(i, i + 2)) for i in (0, 2)]
    assert split.version == 2 == stats["policy_version"]
    for a, b in zip(split.get_weights()[0], by_hand.get_weights()[0], strict=True):
        np.testing.assert_array_equal(a, b)
    assert stats["policy_loss"] == pytest.approx(np.mean([p["policy_loss"] for p in parts]))


def test_the_kl_coefficient_adapts_after_each_update(batches):
    batch, obs_space, act_space = batches["Pendulum-v1"]
    cfg = ImpalaConfig(seed=2, loss="appo", use_kl_loss=True, kl_coeff=2.0, kl_target=1e-6)
    policy = VTracePolicy(obs_space, act_space, cfg)
    coeffs = []
    for _ in range(3):
        stats = policy.learn_on_batch(batch)
        coeffs.append(stats["kl_coeff"])  # the coefficient the update used
        assert stats["kl"] > 2 * cfg.kl_target  # the lagged batch: KL far above 1e-6
    assert coeffs == pytest.approx([2.0, 3.0, 4.5])
    assert float(policy.kl_coeff.numpy()) == pytest.approx(6.75)
    assert set(APPO_STAT_KEYS) <= set(stats)


# ---------------------------------------------------------------------- config
@pytest.mark.parametrize(("kw", "match"), [
    ({"loss": "ppo"}, r"loss='ppo' is invalid: choose one of 'impala', 'appo'"),
    ({"loss": "appo", "off_policy_correction": "none"},
     r"loss='appo' is invalid: APPO's advantages are V-trace's.*off_policy_correction='vtrace'"),
    ({"use_kl_loss": True}, r"use_kl_loss=True is invalid: .*set loss='appo'"),
    ({"clip_param": 0.0}, r"clip_param=0.0 is invalid: it must be a positive finite number"),
    ({"kl_target": -1.0}, r"kl_target=-1.0 is invalid"),
    ({"kl_coeff": -1.0}, r"kl_coeff=-1.0 is invalid"),
    ({"truncation_bootstrap": "lerner"}, r"truncation_bootstrap='lerner' is invalid: .*"
                                         r"did you mean 'learner'"),
    ({"minibatch_size": 75}, r"minibatch_size=75 is invalid: a minibatch is whole columns of "
                             r"sample_batch_size=50 .* choose one of \[50, 100, 250, 500\]"),
    ({"minibatch_size": 150}, r"minibatch_size=150 is invalid: .*split the train batch's 10 "
                              r"columns evenly"),
    ({"minibatch_size": 100, "num_data_loader_buffers": 2},
     r"minibatch_size=100 is invalid: minibatches run on the single-device learner"),
])
def test_bad_appo_settings_name_the_field_the_value_and_the_fix(kw, match):
    with pytest.raises(ConfigError, match=match):
        ImpalaConfig(**kw)


def test_the_appo_fields_round_trip_and_have_groups():
    from impala_lab.config import field_group

    cfg = ImpalaConfig(loss="appo", clip_param=0.3, use_kl_loss=True, kl_coeff=0.5,
                       kl_target=0.02, minibatch_size=100, truncation_bootstrap="learner")
    assert ImpalaConfig.from_dict(cfg.to_dict()) == cfg
    assert {field_group(n) for n in ("loss", "clip_param", "use_kl_loss", "kl_coeff",
                                     "kl_target", "truncation_bootstrap")} == {"training"}
    assert field_group("minibatch_size") == "pipeline"
