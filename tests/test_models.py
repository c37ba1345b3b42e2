"""Models: space checks, weight layout, numpy forward == Keras forward, action sampling."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from gymnasium import spaces

from impala_lab.actor.numpy_model import NumpyModel
from impala_lab.learner.keras_model import build_keras_model, keras_forward
from impala_lab.model_spec import ModelSpec, check_spaces

REPO = Path(__file__).resolve().parents[1]
CARTPOLE_OBS = spaces.Box(-np.inf, np.inf, (4,), np.float32)
TWO = spaces.Discrete(2)


# ------------------------------------------------------------------ spaces


def test_check_spaces_kinds() -> None:
    assert check_spaces(CARTPOLE_OBS, TWO) == "mlp"
    assert check_spaces(spaces.Box(0, 255, (84, 84, 4), np.uint8), spaces.Discrete(6)) == "cnn"
    assert check_spaces(spaces.Box(0, 1, (20, 20, 1), np.float32), TWO) == "cnn"


@pytest.mark.parametrize(
    "action_space, message",
    [
        (
            spaces.MultiBinary(2),
            r"action space MultiBinary\(2\) is not supported: impala_lab "
            r"supports Discrete, Box action spaces",
        ),
        (spaces.Box(-1, 1, (2,), np.int64), r"a Box action space must hold floats"),
        (spaces.MultiDiscrete([2, 3]), r"action space MultiDiscrete\(\[2 3\]\) is not supported"),
        (spaces.Tuple([TWO, TWO]), r"is not supported: impala_lab supports Discrete, Box"),
        (spaces.Discrete(3, start=1), r"Discrete action spaces starting at 0; wrap the env"),
    ],
)
def test_unsupported_action_spaces(action_space, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_spaces(CARTPOLE_OBS, action_space)


@pytest.mark.parametrize(
    "observation_space, message",
    [
        (spaces.Dict({"a": CARTPOLE_OBS}), r"observation space Dict\(.*\) is not supported"),
        (spaces.Tuple([CARTPOLE_OBS]), r"observation space Tuple\(.*\) is not supported"),
        (spaces.Discrete(16), r"observation space Discrete\(16\) is not supported"),
        (spaces.Box(0, 1, (3, 4)), r"with shape \(3, 4\) \(rank 2\) is not supported"),
        (spaces.Box(0, 1, (20, 20, 3, 2)), r"\(rank 4\) is not supported"),
    ],
)
def test_unsupported_observation_spaces(observation_space, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        check_spaces(observation_space, TWO)
    assert "supported: Box observations of rank 1 (MLP) or rank 3 (HxWxC images, CNN)" in str(
        info.value
    )
    assert "FlattenObservation" in str(info.value)


def test_too_small_image() -> None:
    # Explicit layers that need 20x20; without them a 19x30 image gets the small-image layers.
    with pytest.raises(
        ValueError,
        match=r"images must be at least 20x20 \(HxWxC\) .* resize with "
        r"gymnasium.wrappers.ResizeObservation, or choose smaller conv_filters",
    ):
        check_spaces(spaces.Box(0, 255, (19, 30, 3), np.uint8), TWO, ((16, 8, 4), (32, 4, 2)))
    assert check_spaces(spaces.Box(0, 255, (19, 30, 3), np.uint8), TWO) == "cnn"
    with pytest.raises(ValueError, match=r"images must be at least 3x3 .* \(\(16, 3, 1\),\)"):
        check_spaces(spaces.Box(0, 255, (2, 30, 3), np.uint8), TWO)


def test_spaces_are_checked_by_both_builders() -> None:
    with pytest.raises(ValueError, match="supports Discrete, Box action spaces"):
        NumpyModel(CARTPOLE_OBS, spaces.MultiBinary(1))
    with pytest.raises(ValueError, match="supports Discrete, Box action spaces"):
        build_keras_model(CARTPOLE_OBS, spaces.MultiDiscrete([2]))


@pytest.mark.parametrize("hiddens", [(64, -1), (0,), (1.5,), 7])
def test_bad_hiddens(hiddens) -> None:
    with pytest.raises(ValueError, match=r"hiddens=.* is not supported"):
        NumpyModel(CARTPOLE_OBS, TWO, ModelSpec(hiddens))


# ------------------------------------------------------------------ weights


def test_weight_shapes_mlp_and_cnn() -> None:
    assert NumpyModel(CARTPOLE_OBS, TWO, ModelSpec(vf_share_layers=True)).weight_shapes() == [
        (4, 64), (64,), (64, 64), (64,), (64, 2), (2,), (64, 1), (1,)
    ]  # fmt: skip
    # A value trunk of its own: every layer followed by its value twin, then the heads.
    assert NumpyModel(CARTPOLE_OBS, TWO).weight_shapes() == [
        (4, 64), (64,), (4, 64), (64,), (64, 64), (64,), (64, 64), (64,),
        (64, 2), (2,), (64, 1), (1,)
    ]  # fmt: skip
    image = spaces.Box(0, 255, (84, 84, 4), np.uint8)
    # 84 -> (84 - 8) // 4 + 1 = 20 -> (20 - 4) // 2 + 1 = 9; 9 * 9 * 32 = 2592 features.
    shared, separate = ModelSpec((256,), vf_share_layers=True), ModelSpec((256,))
    assert NumpyModel(image, spaces.Discrete(6), shared).weight_shapes() == [
        (8, 8, 4, 16), (16,), (4, 4, 16, 32), (32,), (2592, 256), (256,),
        (256, 6), (6,), (256, 1), (1,),
    ]  # fmt: skip
    assert NumpyModel(image, spaces.Discrete(6), separate).weight_shapes() == [
        (8, 8, 4, 16), (16,), (8, 8, 4, 16), (16,), (4, 4, 16, 32), (32,), (4, 4, 16, 32),
        (32,), (2592, 256), (256,), (2592, 256), (256,), (256, 6), (6,), (256, 1), (1,),
    ]  # fmt: skip
    # No hidden layer: both heads read the observation, shared or not.
    for share in (True, False):
        spec = ModelSpec((), vf_share_layers=share)
        assert NumpyModel(CARTPOLE_OBS, spaces.Discrete(3), spec).weight_shapes() == [
            (4, 3), (3,), (4, 1), (1,)
        ]  # fmt: skip


def test_keras_weight_order_matches_numpy_model() -> None:
    image = spaces.Box(0, 255, (24, 28, 3), np.uint8)
    shared = ModelSpec((32, 16), vf_share_layers=True)
    model = build_keras_model(image, spaces.Discrete(5), shared, seed=0)
    assert [w.path for w in model.weights] == [
        "conv_0/kernel", "conv_0/bias", "conv_1/kernel", "conv_1/bias",
        "hidden_0/kernel", "hidden_0/bias", "hidden_1/kernel", "hidden_1/bias",
        "logits_head/kernel", "logits_head/bias", "value_head/kernel", "value_head/bias",
    ]  # fmt: skip
    assert [w.shape for w in model.get_weights()] == NumpyModel(
        image, spaces.Discrete(5), shared).weight_shapes()
    assert model.output_names == ["logits", "value"]
    separate = build_keras_model(image, spaces.Discrete(5), ModelSpec((32, 16)), seed=0)
    layers = [w.path.split("/")[0] for w in separate.weights[::2]]
    assert layers == ["conv_0", "value_conv_0", "conv_1", "value_conv_1", "hidden_0",
                      "value_hidden_0", "hidden_1", "value_hidden_1", "logits_head",
                      "value_head"]
    assert [w.shape for w in separate.get_weights()] == NumpyModel(
        image, spaces.Discrete(5), ModelSpec((32, 16))).weight_shapes()


def test_initial_weights_scheme() -> None:
    model = NumpyModel(CARTPOLE_OBS, TWO, ModelSpec((64, 64), vf_share_layers=True))
    w = model.initial_weights(7)
    assert all(a.dtype == np.float32 for a in w)
    for bias in w[1::2]:
        assert not bias.any()
    # Orthogonal: rows (4 < 64) or columns are orthonormal, times the gain.
    np.testing.assert_allclose(w[0] @ w[0].T, 2.0 * np.eye(4), atol=1e-5)
    np.testing.assert_allclose(w[2].T @ w[2], 2.0 * np.eye(64), atol=1e-5)
    np.testing.assert_allclose(w[4].T @ w[4], 0.01**2 * np.eye(2), atol=1e-8)
    np.testing.assert_allclose(w[6].T @ w[6], [[1.0]], atol=1e-6)
    again = model.initial_weights(7)
    assert all(np.array_equal(a, b) for a, b in zip(w, again, strict=True))
    assert not np.array_equal(w[0], model.initial_weights(8)[0])


def test_keras_model_starts_from_numpy_initial_weights() -> None:
    image = spaces.Box(0, 255, (20, 20, 2), np.uint8)
    for obs_space in (CARTPOLE_OBS, image):
        keras_w = build_keras_model(obs_space, TWO, seed=5).get_weights()
        numpy_w = NumpyModel(obs_space, TWO).initial_weights(5)
        assert all(np.array_equal(a, b) for a, b in zip(keras_w, numpy_w, strict=True))


def test_set_weights_validation() -> None:
    model = NumpyModel(CARTPOLE_OBS, TWO, ModelSpec((64, 64), vf_share_layers=True))
    weights = model.initial_weights(0)
    with pytest.raises(
        ValueError,
        match=r"weights has 7 arrays but this mlp network \(obs \(4,\), 2 actions, hiddens "
        r"\(64, 64\)\) needs 8: expected shapes \[\(4, 64\), ",
    ):
        model.set_weights(weights[:-1])
    bad = list(weights)
    bad[2] = np.zeros((64, 32), np.float32)
    with pytest.raises(
        ValueError,
        match=r"weights\[2\] has shape \(64, 32\) but this mlp network .* expects "
        r"\(64, 64\)",
    ):
        model.set_weights(bad)
    with pytest.raises(RuntimeError, match=r"call set_weights\(...\) first"):
        model(np.zeros((1, 4), np.float32))
    model.set_weights([w.astype(np.float64) for w in weights])  # converted to float32
    assert all(w.dtype == np.float32 for w in model.get_weights())
    with pytest.raises(
        ValueError,
        match=r"obs has shape \(4,\) but this model expects "
        r"\[N, \*obs_shape\] = \[N, 4\]; add a batch axis",
    ):
        model(np.zeros(4, np.float32))


# ------------------------------------------------------------------ forward


def _random_weights(model: NumpyModel, seed: int) -> list[np.ndarray]:
    """Fan-in scaled random weights (heads too, so every output is O(1) and informative)."""
    rng = np.random.default_rng(seed)
    out = []
    for shape in model.weight_shapes():
        if len(shape) == 1:
            out.append(rng.normal(scale=0.1, size=shape).astype(np.float32))
        else:
            fan_in = int(np.prod(shape[:-1]))
            out.append(rng.normal(scale=1.5 / np.sqrt(fan_in), size=shape).astype(np.float32))
    return out


def _observations(space: spaces.Box, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if space.dtype == np.uint8:
        return rng.integers(0, 256, size=(n, *space.shape), dtype=np.uint8)
    return rng.normal(scale=2.0, size=(n, *space.shape)).astype(space.dtype)


@pytest.mark.parametrize(
    "obs_space, num_actions, hiddens",
    [
        (CARTPOLE_OBS, 2, (64, 64)),
        (spaces.Box(-1, 1, (11,), np.float64), 5, (32,)),
        (spaces.Box(0, 255, (16,), np.uint8), 3, (8, 8, 8)),
        (spaces.Box(-1, 1, (6,), np.float32), 4, ()),
        (spaces.Box(0, 255, (36, 28, 3), np.uint8), 6, (64,)),
        (spaces.Box(0, 1, (20, 24, 2), np.float32), 1, (16, 16)),
        (spaces.Box(0, 255, (36, 28, 3), np.uint8), 2, ()),  # heads right on the conv map
    ],
)
@pytest.mark.parametrize("vf_share_layers", [True, False])
def test_numpy_forward_equals_keras(obs_space, num_actions: int, hiddens,
                                    vf_share_layers: bool) -> None:
    action_space = spaces.Discrete(num_actions)
    keras_model = build_keras_model(obs_space, action_space,
                                    ModelSpec(hiddens, vf_share_layers=vf_share_layers), seed=1)
    numpy_model = NumpyModel(obs_space, action_space,
                             ModelSpec(hiddens, vf_share_layers=vf_share_layers))
    for weights in (numpy_model.initial_weights(3), _random_weights(numpy_model, 4)):
        keras_model.set_weights(weights)
        numpy_model.set_weights(weights)
        for n in (1, 8, 33):
            obs = _observations(obs_space, n, seed=n)
            before = obs.copy()
            logits, values = numpy_model(obs)
            assert logits.shape == (n, num_actions) and logits.dtype == np.float32
            assert values.shape == (n,) and values.dtype == np.float32
            want_logits, want_values = keras_forward(keras_model, obs)
            np.testing.assert_allclose(logits, want_logits, rtol=1e-5, atol=1e-5)
            # The actors' per-step forward: the policy's path alone, the same logits.
            np.testing.assert_allclose(numpy_model.logits(obs), logits, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(values, want_values, rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(obs, before)  # the forward never writes to obs
    # Guard against a vacuous comparison: the random weights give spread-out outputs.
    assert np.std(values) > 0.05


def test_uint8_observations_are_scaled() -> None:
    obs_space = spaces.Box(0, 255, (3,), np.uint8)
    model = NumpyModel(obs_space, TWO, ModelSpec(()))
    # logits = obs / 255 @ W: with W = identity-like columns the logits are the scaled obs.
    model.set_weights([
        np.array([[1, 0], [0, 1], [0, 0]], np.float32), np.zeros(2, np.float32),
        np.array([[0], [0], [1]], np.float32), np.zeros(1, np.float32),
    ])  # fmt: skip
    logits, values = model(np.array([[255, 51, 0]], np.uint8))
    np.testing.assert_allclose(logits, [[1.0, 0.2]], rtol=1e-6)
    np.testing.assert_allclose(values, [0.0])


# ------------------------------------------------------------------ actor imports


def test_numpy_part_never_imports_tensorflow() -> None:
    code = textwrap.dedent(
        """
        import sys
        import numpy as np
        from gymnasium import spaces
        from impala_lab.actor import numpy_model as models
        m = models.NumpyModel(spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2))
        m.set_weights(m.initial_weights(0))
        logits, values = m(np.zeros((8, 4), np.float32))
        m.distribution.sample(logits, np.random.default_rng(0))
        img = spaces.Box(0, 255, (20, 20, 1), np.uint8)
        c = models.NumpyModel(img, spaces.Discrete(2))
        c.set_weights(c.initial_weights(0))
        c(np.zeros((2, 20, 20, 1), np.uint8))
        from impala_lab.model_spec import check_spaces
        check_spaces(img, spaces.Discrete(2))
        heavy = sorted(k for k in sys.modules if k.split(".")[0] in ("tensorflow", "keras"))
        print("HEAVY", heavy)
        assert not heavy, heavy
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stdout


# ------------------------------------------------------------------ the spec
@pytest.mark.parametrize("kwargs, message", [
    ({"hiddens": (64, 0)}, r"hiddens=\(64, 0\) is not supported: every size must be a positive"),
    ({"impala_channels": ()}, r"impala_channels=\(\) is not supported: every size must be a "),
    ({"conv_net": "deep"}, r"conv_net='deep' is not supported: choose one of 'cnn', 'impala'"),
    ({"conv_filters": ((16, 3),)}, r"conv_filters=\(\(16, 3\),\) is not supported: give one or "
                                   r"more \(filters, kernel, stride\) triples"),
    ({"use_lstm": True, "lstm_cell_size": 0}, r"lstm_cell_size=0 is not supported: give a "
                                             r"positive integer"),
])
def test_a_bad_model_spec_names_the_field_the_value_and_the_fix(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        ModelSpec(**kwargs)


def test_a_model_spec_stores_lists_as_tuples_and_resolves_the_image_layers() -> None:
    spec = ModelSpec(hiddens=[8], conv_filters=[[4, 3, 1], [6, 3, 2]], impala_channels=[2])
    assert spec == ModelSpec((8,), conv_filters=((4, 3, 1), (6, 3, 2)), impala_channels=(2,))
    assert spec.conv_maps((10, 10, 4)) == [(8, 8, 4), (3, 3, 6)]  # 10 -> 8 -> 3
    # unset layers follow the image's size: MinAtar's below 20x20, Atari's from 20x20
    assert ModelSpec().small_cnn_filters((10, 10, 4)) == ((16, 3, 1),)
    assert ModelSpec().small_cnn_filters((84, 84, 4)) == ((16, 8, 4), (32, 4, 2))
    with pytest.raises(TypeError, match=r"spec=\(64,\) must be a ModelSpec"):
        NumpyModel(CARTPOLE_OBS, TWO, (64,))  # type: ignore[arg-type]


def test_both_builders_read_one_spec() -> None:
    spec = ModelSpec((16,), use_lstm=True, lstm_cell_size=4)
    numpy_model = NumpyModel(CARTPOLE_OBS, TWO, spec)
    keras_model = build_keras_model(CARTPOLE_OBS, TWO, spec, seed=0)
    assert numpy_model.spec is spec
    assert [tuple(w.shape) for w in keras_model.weights] == numpy_model.weight_shapes() == [
        (4, 16), (16,), (16, 16), (4, 16), (16,), (4, 2), (2,), (4, 1), (1,)]
