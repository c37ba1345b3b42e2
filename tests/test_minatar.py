"""MinAtar from pixels: the registered envs against MinAtar's own, boolean images through the
worker and the batch, the IMPALA network and the small CNN in numpy against Keras, their
config fields, whole runs on every backend, and the GIFs of a trained policy."""

from __future__ import annotations

import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

import impala_lab  # noqa: F401  (registers the MinAtar ids)
from impala_lab import model_spec
from impala_lab.actor.layers import max_pool_same
from impala_lab.actor.numpy_model import NumpyModel
from impala_lab.actor.rollout_worker import RolloutWorker
from impala_lab.config import ImpalaConfig
from impala_lab.driver.build import check_env
from impala_lab.envs.minatar import palette, to_rgb
from impala_lab.errors import ConfigError
from impala_lab.model_spec import ModelSpec

BREAKOUT = "MinAtar/Breakout-v1"
OBS = gym.spaces.Box(0, 1, (10, 10, 4), bool)
ACT = gym.spaces.Discrete(3)


def _bool_obs(n: int, seed: int = 0, shape=(10, 10, 4)) -> np.ndarray:
    return np.random.default_rng(seed).random((n, *shape)) < 0.3


# ---------------------------------------------------------------------- the envs
def test_importing_impala_lab_registers_the_games_and_making_one_loads_no_pyplot():
    code = ("import sys, impala_lab, gymnasium as gym\n"
            "e = gym.make('MinAtar/SpaceInvaders-v1'); e.reset(seed=0); e.step(0)\n"
            "print(sorted(k for k in gym.registry if k.startswith('MinAtar/')))\n"
            "print([m for m in ('minatar', 'matplotlib.pyplot', 'seaborn', 'tensorflow')"
            " if m in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0] == str(sorted(f"MinAtar/{g}-{v}" for g in
                                ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")
                                for v in ("v0", "v1")))
    assert out[1] == "[]"


@pytest.mark.parametrize("game, module, actions", [("Breakout", "breakout", 3),
                                                   ("SpaceInvaders", "space_invaders", 4)])
def test_the_env_plays_exactly_as_minatars_own_environment(game, module, actions):
    from minatar import Environment

    env = gym.make(f"MinAtar/{game}-v1")
    assert env.action_space == gym.spaces.Discrete(actions)
    assert env.observation_space.dtype == np.bool_ and env.spec.max_episode_steps is None
    reference = Environment(module)  # sticky actions 0.1 and the difficulty ramp, both
    reference.seed(7)
    reference.reset()
    obs, _ = env.reset(seed=7)
    np.testing.assert_array_equal(obs, reference.state())
    minimal = reference.minimal_action_set()
    rng = np.random.default_rng(1)
    for _ in range(300):
        a = int(rng.integers(actions))
        obs, reward, terminated, truncated, _ = env.step(a)
        ref_reward, ref_done = reference.act(minimal[a])
        np.testing.assert_array_equal(obs, reference.state())
        assert (reward, terminated, truncated) == (ref_reward, ref_done, False)
        if terminated:
            obs, _ = env.reset()
            reference.reset()
            reference.last_action = 0


def test_rendering_uses_minatars_colours_as_uint8_blocks():
    import seaborn as sns

    colours = palette(4)
    assert colours.shape == (5, 3) and colours.dtype == np.uint8
    assert (colours[0] == 0).all()
    np.testing.assert_allclose(colours[1:] / 255.0, np.asarray(sns.color_palette("cubehelix", 4)),
                               atol=0.5 / 255 + 1e-9)
    obs = np.zeros((2, 2, 4), bool)
    obs[0, 1, 0] = obs[1, 0, 2] = obs[1, 0, 3] = True  # the last channel that is on wins
    image = to_rgb(obs, colours, scale=3)
    assert image.shape == (6, 6, 3) and image.dtype == np.uint8
    np.testing.assert_array_equal(image[0, 3], colours[1])
    np.testing.assert_array_equal(image[5, 2], colours[4])
    np.testing.assert_array_equal(image[0, 0], colours[0])
    env = gym.make(BREAKOUT, render_mode="rgb_array")
    obs, _ = env.reset(seed=0)
    np.testing.assert_array_equal(env.render(), to_rgb(obs, colours, 16))


# ---------------------------------------------------------------------- batches
def test_a_worker_stores_boolean_images_as_uint8_zeros_and_ones():
    worker = RolloutWorker(BREAKOUT, num_envs=2, sample_batch_size=6, seed=0,
                           model_spec=ModelSpec((8,)))
    try:
        batch = worker.sample()
    finally:
        worker.close()
    assert batch.obs.dtype == np.uint8 and batch.obs.shape == (6, 2, 10, 10, 4)
    assert set(np.unique(batch.obs)) <= {0, 1} and batch.obs.max() == 1
    assert batch.bootstrap_obs.dtype == np.uint8
    reference = gym.make(BREAKOUT)
    seed = int(np.random.SeedSequence(0, spawn_key=(0,)).spawn(3)[1].generate_state(1,
                                                                                   np.uint32)[0])
    obs, _ = reference.reset(seed=seed)
    np.testing.assert_array_equal(batch.obs[0, 0], obs.astype(np.uint8))


def test_the_memory_estimate_counts_a_byte_per_boolean_pixel_and_the_networks_units():
    shape = (10, 10, 4)
    # the small CNN: conv 16 3x3 -> 8x8x16; the IMPALA net: conv, pool and 2 blocks per stack
    cnn, impala = ModelSpec(), ModelSpec(conv_net="impala")
    assert cnn.conv_units(shape) == 8 * 8 * 16
    assert impala.conv_units(shape) == (
        10 * 10 * 16 + 5 * 5 * 16 * 11 + 5 * 5 * 32 + 3 * 3 * 32 * 11 + 3 * 3 * 32
        + 2 * 2 * 32 * 11)
    # what the dense layers (or an LSTM) read: the last map
    assert cnn.trunk_output_units(shape) == 8 * 8 * 16
    assert impala.trunk_output_units(shape) == 2 * 2 * 32
    assert cnn.trunk_output_units((84, 84, 4)) == 9 * 9 * 32  # 84 -> 20 -> 9
    # explicit layers replace the size's default: 10 -> 8 -> 3
    assert ModelSpec(conv_filters=[[4, 3, 1], [6, 3, 2]]).trunk_output_units(shape) == 3 * 3 * 6
    small, deep = (ImpalaConfig(env=BREAKOUT, conv_net=n, max_memory_gb=1000)
                   for n in ("cnn", "impala"))
    with_replay = small.replace(replay_proportion=1.0, replay_buffer_num_slots=20)
    floats = gym.spaces.Box(0, 1, (10, 10, 4), np.float32)
    per_slot_bool = with_replay.memory_estimate(OBS, ACT)["replay"] / 20
    per_slot_float = with_replay.memory_estimate(floats, ACT)["replay"] / 20
    # (T steps + the bootstrap observation) x 400 elements x 3 bytes saved
    assert per_slot_float - per_slot_bool == (50 + 1) * 400 * 3
    assert (deep.memory_estimate(OBS, ACT)["learner working set"]
            > small.memory_estimate(OBS, ACT)["learner working set"])


# ---------------------------------------------------------------------- the networks
def test_max_pool_same_pads_as_tensorflow_does():
    x = np.arange(25, dtype=np.float32).reshape(1, 5, 5, 1) * np.array([1, -1], np.float32)
    # 5 -> 3: one padded row/column before and after; windows start at -1, 1, 3
    want = np.empty((1, 3, 3, 2), np.float32)
    for i, r in enumerate((-1, 1, 3)):
        for j, c in enumerate((-1, 1, 3)):
            window = x[0, max(r, 0): r + 3, max(c, 0): c + 3]
            want[0, i, j] = window.reshape(-1, 2).max(axis=0)
    np.testing.assert_array_equal(max_pool_same(x), want)
    assert max_pool_same(np.zeros((2, 10, 10, 3), np.float32)).shape == (2, 5, 5, 3)
    assert max_pool_same(np.zeros((1, 3, 3, 1), np.float32)).shape == (1, 2, 2, 1)


def test_the_impala_network_has_the_papers_layers_for_10x10_images():
    model = NumpyModel(OBS, ACT, ModelSpec((256,), vf_share_layers=True, conv_net="impala"))
    shapes = model.weight_shapes()
    convs = [s for s in shapes if len(s) == 4]
    assert convs == ([(3, 3, 4, 16)] + [(3, 3, 16, 16)] * 4 + [(3, 3, 16, 32)]
                     + [(3, 3, 32, 32)] * 4 + [(3, 3, 32, 32)] + [(3, 3, 32, 32)] * 4)
    assert shapes[-6:] == [(2 * 2 * 32, 256), (256,), (256, 3), (3,), (256, 1), (1,)]
    assert model_spec.impala_shapes((10, 10, 4), (16, 32, 32)) == [
        (5, 5, 16), (3, 3, 32), (2, 2, 32)]
    kernels = [w for w in model.initial_weights(0) if w.ndim == 4]
    # each residual block starts as the identity: its second conv is zero, its first is not
    assert [bool(k.any()) for k in kernels[:5]] == [True, True, False, True, False]
    two = NumpyModel(OBS, ACT, ModelSpec((256,), conv_net="impala", impala_channels=(8, 8)))
    assert len(two.weight_shapes()) == 2 * (2 * 5 * 2 + 2) + 4


@pytest.mark.parametrize("conv_net, hiddens", [("cnn", (32,)), ("impala", (64,))])
@pytest.mark.parametrize("share", [True, False])
def test_the_numpy_forward_equals_keras_on_boolean_images(conv_net, hiddens, share):
    from impala_lab.learner.keras_model import build_keras_model, keras_forward

    keras_model = build_keras_model(OBS, ACT,
                                    ModelSpec(hiddens, vf_share_layers=share, conv_net=conv_net),
                                    seed=3)
    numpy_model = NumpyModel(OBS, ACT,
                             ModelSpec(hiddens, vf_share_layers=share, conv_net=conv_net))
    rng = np.random.default_rng(4)
    # every weight moved off its initial value, biases too, so each one shows in the output
    weights = [w + rng.normal(0.0, 0.01, w.shape).astype(np.float32)
               for w in keras_model.get_weights()]
    keras_model.set_weights(weights)
    numpy_model.set_weights(weights)
    obs = _bool_obs(16, seed=5)
    want_logits, want_values = keras_forward(keras_model, obs.astype(np.uint8))
    for given in (obs, obs.astype(np.uint8)):
        logits, values = numpy_model(given)
        np.testing.assert_allclose(logits, want_logits, rtol=0, atol=1e-5)
        np.testing.assert_allclose(values, want_values, rtol=0, atol=1e-5)
        np.testing.assert_allclose(numpy_model.logits(given), want_logits, rtol=0, atol=1e-5)
    assert np.abs(want_logits).max() > 0.05  # the check is not comparing zeros


def test_explicit_conv_filters_build_that_cnn():
    model = NumpyModel(OBS, ACT,
                       ModelSpec((8,), vf_share_layers=True, conv_filters=((4, 3, 1), (6, 3, 2))))
    assert [s for s in model.weight_shapes() if len(s) == 4] == [(3, 3, 4, 4), (3, 3, 4, 6)]
    assert model.weight_shapes()[-6] == (3 * 3 * 6, 8)  # 10 -> 8 -> 3


# ---------------------------------------------------------------------- config
@pytest.mark.parametrize("changes, message", [
    ({"conv_net": "deep"}, "conv_net='deep' is invalid: choose one of 'cnn', 'impala'"),
    ({"impala_channels": []}, "impala_channels=() is invalid: give one or more positive"),
    ({"impala_channels": [16, 0]}, "impala_channels=(16, 0) is invalid"),
    ({"conv_filters": [[16, 3]]}, "conv_filters=((16, 3),) has type tuple: it must be a list of "
                                  "[filters, kernel, stride] triples"),
    ({"conv_filters": [[16, 0, 1]]}, "conv_filters=((16, 0, 1),) is invalid: give one or more"),
])
def test_bad_network_fields_name_the_field_the_value_and_the_fix(changes, message):
    with pytest.raises(ConfigError) as info:
        ImpalaConfig(env=BREAKOUT, **changes)
    assert message in str(info.value)


def test_conv_filters_too_large_for_the_images_are_a_config_error_before_anything_starts():
    config = ImpalaConfig(env=BREAKOUT, conv_filters=[[16, 8, 4], [32, 4, 2]])
    with pytest.raises(ConfigError, match=r"conv_filters=\[\[16, 8, 4\], \[32, 4, 2\]\] is "
                       r"invalid for env='MinAtar/Breakout-v1': .* at least 20x20"):
        check_env(config)
    assert check_env(config.replace(conv_net="impala"))[0] == OBS
    round_trip = ImpalaConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert round_trip == config and round_trip.conv_filters == ((16, 8, 4), (32, 4, 2))


def test_the_cli_parses_conv_filters_and_rejects_a_bad_one(capsys):
    from impala_lab.cli.main import build_parser, config_from_args, main

    args = build_parser().parse_args(["train", "--env", BREAKOUT, "--conv-filters",
                                      "16x3x1,32x3x2", "--conv-net", "cnn",
                                      "--impala-channels", "8,16", "--preset", "rllib"])
    config = config_from_args(args)
    assert config.conv_filters == ((16, 3, 1), (32, 3, 2)) and config.impala_channels == (8, 16)
    assert main(["train", "--env", BREAKOUT, "--conv-filters", "16x3"]) == 2
    assert ("--conv-filters='16x3' is invalid: it must be conv layers FILTERSxKERNELxSTRIDE "
            "such as 16x3x1,32x3x1") in capsys.readouterr().err


# ---------------------------------------------------------------------- runs
@pytest.mark.parametrize("backend", ["inline", "process", "ray"])
def test_the_impala_network_trains_on_breakout_with_every_backend(backend):
    if backend == "ray":
        pytest.importorskip("ray")  # CI installs the ray extra: there it runs
    from impala_lab import Impala

    config = ImpalaConfig(env=BREAKOUT, backend=backend, num_workers=1, num_envs_per_worker=2,
                          sample_batch_size=10, train_batch_size=20, model=(16,),
                          conv_net="impala", impala_channels=(4, 4), seed=0)
    with Impala(config) as run:
        new_frames = _spy_on_new_batches(run)
        run.train(stop={"num_steps_trained": 60}, max_seconds=120)
        stats = run.stats()
        assert stats["num_steps_trained"] >= 60 and run.policy.version >= 3
        # the dashboard's frame strip: the last 8 observations of worker 0's first env
        frames = run.latest_frames()
        np.testing.assert_array_equal(frames.obs, new_frames[-1])
        assert frames.obs.shape == (8, 10, 10, 4) and frames.worker_index == 0
        assert frames.env_steps[-1] <= stats["num_steps_sampled"]
        weights, _ = run.policy.get_weights()
        spec = ModelSpec((16,), conv_net="impala", impala_channels=(4, 4))
        assert [w.shape for w in weights] == NumpyModel(OBS, ACT, spec).weight_shapes()


def _spy_on_new_batches(run) -> list:
    """The last 8 observations of column 0 of each new batch, as the task pool hands them to
    the driver (one worker)."""
    seen, prefetch = [], run.loop.actors.tasks.completed_prefetch

    def spy(**kwargs):
        for worker, batch in prefetch(**kwargs):
            seen.append(batch.obs[-8:, 0].copy())
            yield worker, batch

    run.loop.actors.tasks.completed_prefetch = spy
    return seen


def test_train_writes_a_gif_of_the_final_policy_and_play_renders_the_checkpoint(tmp_path):
    from PIL import Image

    from impala_lab.cli.main import main

    out = tmp_path / "run"
    assert main(["train", "--env", BREAKOUT, "--backend", "inline", "--num-workers", "1",
                 "--num-envs-per-worker", "2", "--sample-batch-size", "10",
                 "--train-batch-size", "20", "--model", "8", "--max-env-steps", "200",
                 "--seed", "1", "--quiet", "--out", str(out)]) == 0
    with Image.open(out / "policy.gif") as gif:
        assert gif.size == (160, 160) and 2 <= gif.n_frames <= 300
    assert main(["play", "--checkpoint", str(out / "checkpoint"), "--episodes", "2",
                 "--out", str(tmp_path / "play.gif"), "--seed", "3"]) == 0
    with Image.open(tmp_path / "play.gif") as gif:
        frames = gif.n_frames
        gif.seek(0)
        first = np.asarray(gif.convert("RGB"))
    env = gym.make(BREAKOUT, render_mode="rgb_array")
    env.reset(seed=3)
    np.testing.assert_array_equal(first, env.render())  # the first frame is the seeded reset
    assert frames >= 4  # two episodes, each at least its first frame and one step


def test_play_refuses_a_missing_checkpoint(tmp_path, capsys):
    from impala_lab.cli.main import main

    assert main(["play", "--checkpoint", str(tmp_path / "nothing"), "--out",
                 str(tmp_path / "x.gif")]) == 2
    assert "state.json is missing" in capsys.readouterr().err


def test_an_env_without_rgb_array_frames_is_refused_by_name_without_gymnasiums_warning():
    import warnings

    from impala_lab.cli.play import record_episodes

    class Silent(gym.Env):
        observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        action_space = gym.spaces.Discrete(2)

    gym.register("impala_lab_test/NoRender-v0", entry_point=lambda **kw: Silent())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # gymnasium's render_modes warning would fail here
            with pytest.raises(ValueError, match=r"env 'impala_lab_test/NoRender-v0' cannot "
                               r"render rgb_array frames \(its render_modes: \[\]\)"):
                record_episodes("impala_lab_test/NoRender-v0", model=None)
    finally:
        gym.registry.pop("impala_lab_test/NoRender-v0")
