"""Off-policy corrections: each one's targets and advantages by hand and against a numpy
reference, the policy's loss with each (feed-forward and recurrent), the config's rules."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from impala_lab.config import ImpalaConfig
from impala_lab.errors import ConfigError
from impala_lab.learner import vtrace
from impala_lab.learner.corrections import EPSILON, correction_terms

CORRECTIONS = ("vtrace", "is1", "epsilon", "none")
OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACT = gym.spaces.Discrete(2)


def _config(correction: str, **kw) -> ImpalaConfig:
    return ImpalaConfig(seed=1, vtrace=correction == "vtrace", off_policy_correction=correction,
                        **kw)


# ---------------------------------------------------------------------- by hand
def _hand_batch() -> dict:
    """T = 3, B = 1; the episode terminates at step 1 (discount 0 there).

    mu = (0.5, 0.5) everywhere; pi = (0.75, 0.25); actions 0, 1, 0, so pi(a_t) = 0.75, 0.25,
    0.75 and rho_t = 1.5, 0.5, 1.5.
    """
    return dict(
        behaviour_logits=np.zeros((3, 1, 2), np.float32),
        target_logits=np.tile(np.array([np.log(3.0), 0.0], np.float32), (3, 1, 1)),
        actions=np.array([[0], [1], [0]], np.int32),
        discounts=np.array([[0.9], [0.0], [0.9]], np.float32),
        rewards=np.array([[1.0], [0.0], [2.0]], np.float32),
        values=np.array([[0.5], [1.0], [-0.5]], np.float32),
        bootstrap_value=np.array([2.0], np.float32))


# G_2 = 2 + 0.9 * 2 = 3.8; G_1 = 0 + 0 * G_2 = 0; G_0 = 1 + 0.9 * G_1 = 1.
HAND_RETURNS = [1.0, 0.0, 3.8]
HAND_ADVANTAGES = [1.0 - 0.5, 0.0 - 1.0, 3.8 + 0.5]  # G_t - V(x_t)
# V-trace, rho_bar = c_bar = 1: clipped rho = c = (1, 0.5, 1);
# delta = (1 * (1 + 0.9 * 1.0 - 0.5), 0.5 * (0 + 0 - 1.0), 1 * (2 + 0.9 * 2 + 0.5))
#       = (1.4, -0.5, 4.3)
# v_2 - V_2 = 4.3; v_1 - V_1 = -0.5 + 0 * 0.5 * 4.3; v_0 - V_0 = 1.4 + 0.9 * 1 * (-0.5) = 0.95
HAND_VTRACE_VS = [0.5 + 0.95, 1.0 - 0.5, -0.5 + 4.3]
# pg advantage = rho_pg * (r_t + gamma_t * v_{t+1} - V(x_t)), v_3 = V(x_3) = 2
HAND_VTRACE_PG = [1.0 * (1.0 + 0.9 * 0.5 - 0.5), 0.5 * (0.0 - 1.0), 1.0 * (2.0 + 0.9 * 2.0 + 0.5)]
HAND_LOG_PI = np.log([0.75, 0.25, 0.75])

HAND = {
    "none": (HAND_RETURNS, HAND_ADVANTAGES, HAND_LOG_PI),
    "epsilon": (HAND_RETURNS, HAND_ADVANTAGES, np.log(np.array([0.75, 0.25, 0.75]) + 1e-6)),
    "is1": (HAND_RETURNS, [1.0 * 0.5, 0.5 * -1.0, 1.0 * 4.3], HAND_LOG_PI),
    "vtrace": (HAND_VTRACE_VS, HAND_VTRACE_PG, HAND_LOG_PI),
}


@pytest.mark.parametrize("correction", CORRECTIONS)
def test_each_correction_gives_the_hand_computed_targets_and_advantages(correction):
    terms = correction_terms(correction, **_hand_batch())
    vs, adv, log_probs = HAND[correction]
    np.testing.assert_allclose(terms.vs.numpy()[:, 0], vs, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(terms.pg_advantages.numpy()[:, 0], adv, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(terms.log_probs.numpy()[:, 0], log_probs, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(terms.log_rhos.numpy()[:, 0], np.log([1.5, 0.5, 1.5]), atol=1e-6)


def test_an_unknown_correction_is_named():
    with pytest.raises(ValueError, match="off_policy_correction='retrace' is invalid"):
        correction_terms("retrace", **_hand_batch())


# ---------------------------------------------------------------------- numpy reference
def _reference(correction: str, b: dict, rho_bar: float | None, pg_bar: float | None):
    """(vs, pg_advantages, log_probs) in float64, with explicit loops."""
    log_pi = vtrace.log_probs_from_logits_and_actions_numpy(b["target_logits"], b["actions"])
    log_mu = vtrace.log_probs_from_logits_and_actions_numpy(b["behaviour_logits"], b["actions"])
    rho = np.exp(log_pi - log_mu)
    if correction == "vtrace":
        ret = vtrace.from_importance_weights_numpy(
            log_pi - log_mu, b["discounts"], b["rewards"], b["values"], b["bootstrap_value"],
            rho_bar, pg_bar)
        return ret.vs, ret.pg_advantages, log_pi
    T = len(b["rewards"])
    returns = np.zeros_like(log_pi)
    following = b["bootstrap_value"].astype(np.float64)
    for t in reversed(range(T)):
        following = b["rewards"][t] + b["discounts"][t] * following
        returns[t] = following
    advantages = returns - b["values"]
    if correction == "is1":
        advantages = advantages * (rho if pg_bar is None else np.minimum(pg_bar, rho))
    if correction == "epsilon":
        log_pi = np.log(np.exp(log_pi) + 1e-6)
    return returns, advantages, log_pi


def _random_batch(rng: np.random.Generator, T: int = 7, B: int = 5, A: int = 3) -> dict:
    return dict(
        behaviour_logits=rng.normal(size=(T, B, A)).astype(np.float32),
        target_logits=rng.normal(size=(T, B, A)).astype(np.float32),
        actions=rng.integers(0, A, size=(T, B)).astype(np.int32),
        discounts=np.where(rng.random((T, B)) < 0.2, 0.0, 0.97).astype(np.float32),
        rewards=rng.normal(size=(T, B)).astype(np.float32),
        values=rng.normal(size=(T, B)).astype(np.float32),
        bootstrap_value=rng.normal(size=B).astype(np.float32))


@pytest.mark.parametrize("correction", CORRECTIONS)
@pytest.mark.parametrize("clips", [(1.0, 1.0), (None, None), (2.0, 0.5)])
def test_each_correction_matches_the_numpy_reference(correction, clips):
    rng = np.random.default_rng(len(correction) * 10 + len(str(clips)))
    b = _random_batch(rng)
    terms = correction_terms(correction, **b, clip_rho_threshold=clips[0],
                             clip_pg_rho_threshold=clips[1])
    vs, adv, log_probs = _reference(correction, b, *clips)
    np.testing.assert_allclose(terms.vs.numpy(), vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(terms.pg_advantages.numpy(), adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(terms.log_probs.numpy(), log_probs, rtol=1e-5, atol=1e-5)


def test_the_epsilon_inside_the_log_bounds_the_gradient_of_an_unlikely_action():
    # pi(a) = sigmoid(-30) ~ 1e-13: d log pi / d logit is about 1, d log(pi + eps) about pi/eps
    b = dict(_hand_batch(), actions=np.array([[1], [1], [1]], np.int32),
             target_logits=np.tile(np.array([30.0, 0.0], np.float32), (3, 1, 1)))
    grads = {}
    for correction in ("none", "epsilon"):
        logits = tf.Variable(b["target_logits"])
        with tf.GradientTape() as tape:
            terms = correction_terms(correction, **dict(b, target_logits=logits))
            loss = -tf.reduce_sum(terms.log_probs * terms.pg_advantages)
        grads[correction] = np.abs(tape.gradient(loss, logits).numpy()).max()
    assert grads["none"] == pytest.approx(4.3, rel=1e-3)  # |advantage| at step 2, times ~1
    assert grads["epsilon"] < 4.3 * 1e-6
    assert EPSILON == 1e-6


# ---------------------------------------------------------------------- the policy's loss
def _loss_inputs(rng: np.random.Generator, T: int = 5, B: int = 4) -> dict:
    """A batch the way batch_to_tensors gives it, with terminations and a truncation."""
    terminateds = np.zeros((T, B), np.float32)
    truncateds = np.zeros((T, B), np.float32)
    terminateds[2, 0] = terminateds[4, 3] = 1.0
    truncateds[1, 2] = 1.0
    return {
        "obs": rng.normal(size=(T, B, 4)).astype(np.float32),
        "actions": rng.integers(0, 2, size=(T, B)).astype(np.int32),
        "rewards": rng.normal(size=(T, B)).astype(np.float32),
        "terminateds": terminateds, "truncateds": truncateds,
        "truncation_values": rng.normal(size=(T, B)).astype(np.float32),
        "behaviour_logits": rng.normal(size=(T, B, 2)).astype(np.float32),
        "bootstrap_obs": rng.normal(size=(B, 4)).astype(np.float32),
    }


def _expected_losses(correction, t, logits, values, bootstrap, gamma, vf_coeff, ent_coeff):
    """policy, value and total loss by the numpy reference, from the model's own outputs."""
    truncated = t["truncateds"] * (1 - t["terminateds"])
    b = dict(behaviour_logits=t["behaviour_logits"], target_logits=logits,
             actions=t["actions"],
             discounts=gamma * (1 - np.maximum(t["terminateds"], truncated)),
             rewards=t["rewards"] + gamma * truncated * t["truncation_values"],
             values=values, bootstrap_value=bootstrap)
    vs, adv, log_probs = _reference(correction, b, 1.0, 1.0)
    policy_loss = -np.sum(log_probs * adv)
    vf_loss = 0.5 * np.sum((vs - values) ** 2)
    shifted = logits - logits.max(-1, keepdims=True)
    log_soft = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    entropy = -np.sum(np.exp(log_soft) * log_soft)
    return policy_loss, vf_loss, policy_loss + vf_coeff * vf_loss - ent_coeff * entropy


@pytest.mark.parametrize("correction", CORRECTIONS)
def test_the_policy_loss_with_each_correction_matches_the_reference(correction):
    from impala_lab.learner.vtrace_policy import VTracePolicy

    policy = VTracePolicy(OBS, ACT, _config(correction))
    t = _loss_inputs(np.random.default_rng(3))
    T, B = t["actions"].shape
    logits, values = policy.compute_logits_and_values(
        np.concatenate([t["obs"].reshape(T * B, 4), t["bootstrap_obs"]]))
    expected = _expected_losses(correction, t, logits[: T * B].reshape(T, B, 2),
                                values[: T * B].reshape(T, B), values[T * B:], 0.99, 0.5,
                                0.01)
    total, stats = policy.loss_and_stats({k: tf.constant(v) for k, v in t.items()})
    actual = (float(stats["policy_loss"]), float(stats["vf_loss"]), float(total))
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("correction", CORRECTIONS)
def test_a_recurrent_policys_loss_with_each_correction_matches_the_reference(correction):
    from impala_lab.learner.keras_model import lstm_unroll
    from impala_lab.learner.vtrace_policy import VTracePolicy

    policy = VTracePolicy(OBS, ACT, _config(correction, model=(16,), use_lstm=True,
                                            lstm_cell_size=8))
    rng = np.random.default_rng(4)
    t = dict(_loss_inputs(rng), state_in=rng.normal(size=(4, 2, 8)).astype(np.float32))
    tensors = {k: tf.constant(v) for k, v in t.items()}
    dones = np.maximum(t["terminateds"], t["truncateds"])
    logits, values, bootstrap, _ = lstm_unroll(policy.model, policy.trunk, tensors["obs"],
                                               tensors["state_in"], tf.constant(dones),
                                               tensors["bootstrap_obs"])
    expected = _expected_losses(correction, t, logits.numpy(), values.numpy(),
                                bootstrap.numpy(), 0.99, 0.5, 0.01)
    total, stats = policy.loss_and_stats(tensors)
    np.testing.assert_allclose((float(stats["policy_loss"]), float(stats["vf_loss"]),
                                float(total)), expected, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------- config
def test_the_default_is_vtrace_and_the_knob_names_a_bad_choice():
    c = ImpalaConfig()
    assert (c.vtrace, c.off_policy_correction) == (True, "vtrace")
    with pytest.raises(ConfigError, match=r"off_policy_correction='is2' is invalid: choose one "
                                          r"of 'vtrace', 'is1', 'epsilon', 'none'"):
        ImpalaConfig(vtrace=False, off_policy_correction="is2")


def test_one_switch_is_enough_the_other_follows():
    for correction in ("is1", "epsilon", "none"):
        config = ImpalaConfig(off_policy_correction=correction)
        assert (config.vtrace, config.off_policy_correction) == (False, correction)
    assert ImpalaConfig(vtrace=False).off_policy_correction == "none"  # RLlib's loss
    assert ImpalaConfig(vtrace=True).off_policy_correction == "vtrace"
    # a copy that changes one switch re-derives the other, and the saved dict round-trips
    assert ImpalaConfig().replace(off_policy_correction="is1").vtrace is False
    assert ImpalaConfig(off_policy_correction="is1").replace(vtrace=True).off_policy_correction \
        == "vtrace"
    saved = ImpalaConfig(off_policy_correction="epsilon").to_dict()
    assert ImpalaConfig.from_dict(saved).off_policy_correction == "epsilon"


def test_the_cli_trains_with_is1_from_one_option():
    from impala_lab.cli.main import build_parser, config_from_args

    args = build_parser().parse_args(["train", "--off-policy-correction", "is1"])
    config = config_from_args(args)
    assert (config.vtrace, config.off_policy_correction) == (False, "is1")
    args = build_parser().parse_args(["train", "--off-policy-correction", "none"])
    assert config_from_args(args).off_policy_correction == "none"  # the name, not None


def test_vtrace_and_off_policy_correction_given_together_must_agree():
    with pytest.raises(ConfigError, match=r"vtrace=False and off_policy_correction='vtrace' "
                                          r"conflict: .*set off_policy_correction='none'"):
        ImpalaConfig(vtrace=False, off_policy_correction="vtrace")
    with pytest.raises(ConfigError, match=r"vtrace=True and off_policy_correction='is1' "
                                          r"conflict: .*leave vtrace out"):
        ImpalaConfig(vtrace=True, off_policy_correction="is1")
    for correction in ("is1", "epsilon", "none"):
        assert ImpalaConfig(vtrace=False, off_policy_correction=correction).vtrace is False


# ---------------------------------------------------------------------- the seam
def test_vtrace_through_the_seam_is_from_logits_bit_for_bit():
    b = _hand_batch()
    terms = correction_terms("vtrace", **b)
    ref = vtrace.from_logits(
        behaviour_policy_logits=b["behaviour_logits"], target_policy_logits=b["target_logits"],
        actions=b["actions"], discounts=b["discounts"], rewards=b["rewards"],
        values=b["values"], bootstrap_value=b["bootstrap_value"])
    for got, want in ((terms.vs, ref.vs), (terms.pg_advantages, ref.pg_advantages),
                      (terms.log_probs, ref.target_action_log_probs),
                      (terms.log_rhos, ref.log_rhos)):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("correction", CORRECTIONS)
def test_every_correction_takes_its_log_probabilities_from_the_distribution(correction):
    from impala_lab.learner.distributions import TFCategorical

    class Tempered(TFCategorical):
        """softmax(logits / 2): another policy, so the terms show which logp was used."""

        calls = 0

        @staticmethod
        def logp(logits, actions):
            Tempered.calls += 1
            return TFCategorical.logp(logits / 2.0, actions)

    b = _hand_batch()
    terms = correction_terms(correction, **b, distribution=Tempered)
    assert Tempered.calls == 2  # the target's and the behaviour's
    want_log_pi = TFCategorical.logp(tf.constant(b["target_logits"]) / 2.0, b["actions"])
    want_log_mu = TFCategorical.logp(tf.constant(b["behaviour_logits"]) / 2.0, b["actions"])
    np.testing.assert_allclose(terms.log_rhos.numpy(), (want_log_pi - want_log_mu).numpy(),
                               atol=1e-6)
    if correction != "epsilon":
        np.testing.assert_allclose(terms.log_probs.numpy(), want_log_pi.numpy(), atol=1e-6)
