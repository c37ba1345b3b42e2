"""MuJoCo's envs (the mujoco extra, in dev): Hopper-v5 and HalfCheetah-v5 train a few updates
with finite stats; the policy plays headless into a GIF (``impala-lab play`` and the GIF that
``impala-lab train`` leaves); without mujoco the error names the package and the extra.

Frames are never drawn in this process: TensorFlow is loaded here, and MuJoCo's rendering
context beside it crashes the process (`impala_lab.cli.play.renders_with_opengl`).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from impala_lab.config import ImpalaConfig
from impala_lab.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
MUJOCO_REASON = ("needs the mujoco extra (pip install 'impala_lab[mujoco]'; dev includes it, "
                 "so make test and CI run these)")


def _needs_mujoco() -> None:
    pytest.importorskip("mujoco", reason=MUJOCO_REASON)


def run_cli(*args: str, extra_env: dict | None = None, timeout: float = 240
            ) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(extra_env or {})}
    env.pop("MUJOCO_GL", None)  # play.py picks a headless backend itself
    return subprocess.run([sys.executable, "-m", "impala_lab.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------- without mujoco
def test_without_mujoco_the_error_names_the_package_and_the_extra(tmp_path):
    # A fresh interpreter in which `import mujoco` fails, as where the extra is not installed.
    code = ("import sys; sys.modules['mujoco'] = None\n"
            "from impala_lab.cli.main import main\n"
            "sys.exit(main(['train', '--env', 'Hopper-v5', '--max-seconds', '5',"
            f" '--out', {str(tmp_path / 'run')!r}]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "env='Hopper-v5' is invalid: it could not be made" in out.stderr
    assert "MuJoCo's envs come with the mujoco package: pip install 'impala_lab[mujoco]'" \
        in out.stderr


def test_a_missing_package_is_named_only_for_an_import_failure(monkeypatch):
    from gymnasium.error import DependencyNotInstalled

    from impala_lab.driver import build

    def fails(exc):
        def probe(env):
            raise exc
        return probe

    monkeypatch.setattr(build, "probe_spaces", fails(DependencyNotInstalled("no mujoco")))
    with pytest.raises(ConfigError, match=r"no mujoco\); MuJoCo's .*impala_lab\[mujoco\]"):
        build.check_env(ImpalaConfig(env="HalfCheetah-v5"))
    monkeypatch.setattr(build, "probe_spaces", fails(ModuleNotFoundError("No module 'imageio'")))
    with pytest.raises(ConfigError, match=r"impala_lab\[mujoco\]"):
        build.check_env(ImpalaConfig(env="Hopper-v5"))
    monkeypatch.setattr(build, "probe_spaces", fails(RuntimeError("the model file is bad")))
    with pytest.raises(ConfigError) as info:
        build.check_env(ImpalaConfig(env="Hopper-v5"))
    assert str(info.value).endswith("(RuntimeError: the model file is bad)")


def test_which_envs_render_with_opengl():
    from impala_lab.cli.play import renders_with_opengl

    assert renders_with_opengl("Hopper-v5") and renders_with_opengl("HalfCheetah-v5")
    assert not renders_with_opengl("CartPole-v1") and not renders_with_opengl("Nope-v0")


# ---------------------------------------------------------------------- with mujoco
def _train(env: str, **overrides):
    from impala_lab import Impala

    run = Impala(env=env, backend="inline", num_workers=1, num_envs_per_worker=2,
                 sample_batch_size=20, train_batch_size=80, model=(32, 32), seed=0,
                 **overrides)
    # A hang guard, not a time limit: a loaded machine may take long over the first traces.
    deadline = time.monotonic() + 600
    try:
        # The learner's reported stats (which the test reads), not policy.version, which
        # moves before the thread publishes the step's stats.
        while run.num_steps_sampled < 400 or (
                run.stats().get("learner") or {}).get("policy_version", 0) < 3:
            assert time.monotonic() < deadline, "no third update within 600 s"
            run.step()
    except BaseException:
        run.stop()
        raise
    return run


@pytest.mark.parametrize("env, obs_dim, act_dim", [("Hopper-v5", 11, 3),
                                                   ("HalfCheetah-v5", 17, 6)])
def test_a_mujoco_env_trains_a_few_updates_with_finite_stats(env, obs_dim, act_dim):
    _needs_mujoco()
    run = _train(env)
    try:
        assert run.observation_space.shape == (obs_dim,)
        assert run.action_space.shape == (act_dim,)
        s = run.stats()
        learner = s["learner"]
        assert learner["policy_version"] >= 3 and s["num_steps_sampled"] >= 400
        for key in ("total_loss", "policy_loss", "vf_loss", "entropy", "grad_gnorm",
                    "action_mean", "action_std"):
            assert math.isfinite(learner[key]), (key, learner)
        assert learner["action_std"] > 0
    finally:
        run.stop()


@pytest.fixture(scope="module")
def hopper_checkpoint(tmp_path_factory):
    _needs_mujoco()
    path = tmp_path_factory.mktemp("hopper") / "checkpoint"
    run = _train("Hopper-v5")
    try:
        run.save(path)
        yield path, run.config, run.policy.get_weights()[0]
    finally:
        run.stop()


def _gif_frames(path: Path) -> list[np.ndarray]:
    from PIL import Image

    frames = []
    with Image.open(path) as gif:
        assert gif.format == "GIF" and gif.info.get("loop") == 0
        for k in range(gif.n_frames):
            gif.seek(k)
            frames.append(np.asarray(gif.convert("RGB")))
    return frames


def _assert_hopper_frames(frames: list[np.ndarray], n: int) -> None:
    assert len(frames) == n
    # Hopper renders 480x480 RGB; write_gif scales frames wider than 320 px down to 320
    assert all(f.shape == (320, 320, 3) and f.dtype == np.uint8 for f in frames)
    assert frames[0].std() > 10  # a scene, not a blank canvas
    assert any(not np.array_equal(frames[0], f) for f in frames[1:])  # and it moves


def test_play_renders_a_hopper_checkpoint_headless_into_a_gif(hopper_checkpoint, tmp_path):
    checkpoint, _, _ = hopper_checkpoint
    out = run_cli("play", "--checkpoint", str(checkpoint), "--max-frames", "12", "--seed", "0",
                  "--out", str(tmp_path / "hopper.gif"),
                  extra_env={"DISPLAY": "", "WAYLAND_DISPLAY": ""})
    assert out.returncode == 0, out.stderr
    assert f"wrote {tmp_path / 'hopper.gif'} (12 frames" in out.stdout
    _assert_hopper_frames(_gif_frames(tmp_path / "hopper.gif"), 12)


def test_the_train_gif_is_drawn_in_a_process_of_its_own(hopper_checkpoint, tmp_path):
    from impala_lab.cli.play import gif_in_child

    _, config, weights = hopper_checkpoint
    assert "tensorflow" in sys.modules  # why the frames are drawn in a child
    _, frames = gif_in_child(config, weights, tmp_path / "policy.gif", max_frames=8, seed=0)
    assert frames == 8
    _assert_hopper_frames(_gif_frames(tmp_path / "policy.gif"), 8)
