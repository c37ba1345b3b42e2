"""Watch a trained policy: episodes rendered frame by frame, written as an animated GIF.

``impala-lab play`` and the ``policy.gif`` of ``impala-lab train`` run the actors' numpy policy
(`impala_lab.actor.numpy_model.NumpyModel`) on the run's weights: no TensorFlow. Frames are the
env's ``rgb_array`` renders (pygame draws classic control, OpenGL MuJoCo's); Pillow writes the
GIF.
"""

from __future__ import annotations

import ctypes.util
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from impala_lab.actor.numpy_model import NumpyModel
from impala_lab.config import ImpalaConfig
from impala_lab.config_checks import env_package_hint
from impala_lab.driver.build import probe_spaces
from impala_lab.driver.evaluation import evaluation_model as policy_model  # numpy, no weights
from impala_lab.envs import make_env

_HEADLESS = not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
# pygame (gymnasium's classic-control renderer) greets on import; the run's output stays quiet.
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
if _HEADLESS:  # SDL would warn as it looks for a display; rgb_array frames need none
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")


# MuJoCo renders through the OpenGL context MUJOCO_GL names; unset, gymnasium tries GLFW,
# which needs a display. Headless, pick one before any env of this module imports mujoco (a
# value the user set wins): Mesa's EGL renders in software, no GPU needed (Debian's libegl1,
# libopengl0, libegl-mesa0, libgl1-mesa-dri: ``make mujoco-deps``), else OSMesa (libosmesa6).
if _HEADLESS and "MUJOCO_GL" not in os.environ:
    if ctypes.util.find_library("EGL"):
        os.environ["MUJOCO_GL"] = "egl"
    elif ctypes.util.find_library("OSMesa"):
        os.environ["MUJOCO_GL"] = "osmesa"


def numpy_policy(config: ImpalaConfig, weights: list[np.ndarray], source: str = "the run"
                 ) -> NumpyModel:
    """The numpy policy of ``config`` with ``weights``, for the spaces of its env.

    Raises:
      ValueError: the env cannot be made (``source``, e.g. the checkpoint, and the package to
        install are named).
    """
    try:
        spaces = probe_spaces(config.env)
    except Exception as exc:  # e.g. a MuJoCo env without mujoco: name the package to install
        hint = env_package_hint(config.env)
        raise ValueError(f"{source}: its env {config.env!r} cannot be made "
                         f"({type(exc).__name__}: {exc}){'; ' + hint if hint else ''}"
                         ) from None
    model = policy_model(config, *spaces)
    model.set_weights(weights)
    return model


def record_episodes(env_id: str, model: NumpyModel, episodes: int = 1, max_frames: int = 500,
                    seed: int | None = None, greedy: bool = False, *, clip: bool = True,
                    squash: bool = False) -> tuple[list[np.ndarray], list[float]]:
    """Plays ``episodes`` episodes of ``env_id`` with ``model`` (fewer if ``max_frames``, over
    all episodes, is reached first) and renders every step; ``seed`` seeds the first reset and
    the action sampling, ``greedy`` takes the most likely action, ``clip`` and ``squash`` are
    the run's ``clip_actions`` and ``squash_actions``.

    Returns (uint8 frames [H, W, 3] in order, the return of each episode played to its end);
    ValueError (saying why) if the env cannot render rgb_array frames.
    """
    try:
        with warnings.catch_warnings():  # said below as the error, not as gymnasium's warning
            warnings.filterwarnings("ignore", message=".*not in the possible render_modes")
            env = make_env(env_id, render_mode="rgb_array")
    except Exception as exc:
        raise ValueError(f"env {env_id!r} cannot render rgb_array frames "
                         f"({type(exc).__name__}: {exc})") from None
    modes = env.metadata.get("render_modes") or []
    if "rgb_array" not in modes:
        env.close()
        raise ValueError(f"env {env_id!r} cannot render rgb_array frames (its render_modes: "
                         f"{list(modes)})")
    rng = np.random.default_rng(seed)
    frames: list[np.ndarray] = []
    returns: list[float] = []
    try:
        obs, _ = env.reset(seed=seed)
        for _ in range(episodes):
            state = model.initial_state(1) if model.use_lstm else None
            total, done = 0.0, False
            frames.append(_frame(env))
            while not done and len(frames) < max_frames:
                if state is None:
                    logits = model.logits(np.asarray(obs)[None])
                else:
                    logits, _, state = model.step(np.asarray(obs)[None], state)
                dist = model.distribution
                action = (dist.mode(logits) if greedy else dist.sample(logits, rng))[0]
                obs, reward, terminated, truncated, _ = env.step(
                    dist.env_action(action, env.action_space, clip=clip, squash=squash))
                total += float(reward)
                done = terminated or truncated
                frames.append(_frame(env))
            if not done:
                break
            returns.append(total)
            obs, _ = env.reset()
    finally:
        env.close()
    return frames, returns


def _frame(env: gym.Env) -> np.ndarray:
    try:
        frame = env.render()
    except Exception as exc:  # e.g. CartPole without pygame, MuJoCo without OpenGL
        gl = ("; MuJoCo renders through OpenGL: without a display install EGL (Debian's "
              "libegl1 libopengl0 libegl-mesa0 libgl1-mesa-dri; make mujoco-deps) or set "
              "MUJOCO_GL=osmesa with libosmesa6" if "OpenGL" in str(exc) else "")
        raise ValueError(f"env {env.spec.id if env.spec else env!r} cannot render rgb_array "
                         f"frames ({type(exc).__name__}: {exc}){gl}") from None
    frame = np.asarray(frame)
    if frame.dtype != np.uint8:  # float renders in [0, 1]
        frame = np.clip(np.round(frame * 255.0), 0, 255).astype(np.uint8)
    return frame


def write_gif(frames: Sequence[np.ndarray], path: str | Path, fps: float = 15.0,
              max_width: int = 320) -> Path:
    """Writes uint8 frames [H, W, 3] as a looping GIF, each frame 1/fps s; frames wider than
    ``max_width`` are scaled down (nearest neighbour, so MinAtar's cells stay sharp). Frames
    that hold at most 256 colours in all share one exact palette (`_with_one_palette`)."""
    from PIL import Image

    if not frames:
        raise ValueError("write_gif: no frames to write")
    images = []
    for frame in frames:
        image = Image.fromarray(np.asarray(frame, np.uint8))
        if image.width > max_width:
            image = image.resize((max_width, round(image.height * max_width / image.width)),
                                 Image.Resampling.NEAREST)
        images.append(image)
    images = _with_one_palette(images) or images
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    images[0].save(path, save_all=True, append_images=images[1:], loop=0,
                   duration=round(1000 / fps), optimize=False)
    return path


def _with_one_palette(images: list) -> list | None:
    """RGB images as 'P' images over one exact palette of all their colours; None if they hold
    more than 256 (Pillow then picks a palette for each frame, which costs far more)."""
    from PIL import Image

    codes = [a[..., 0] << 16 | a[..., 1] << 8 | a[..., 2]  # [H, W] of 24-bit colours
             for a in (np.asarray(image).astype(np.uint32) for image in images)]
    seen = np.zeros(1 << 24, bool)
    for frame in codes:
        seen[frame] = True
    colours = np.flatnonzero(seen)
    if len(colours) > 256:
        return None
    index = np.zeros(1 << 24, np.uint8)
    index[colours] = np.arange(len(colours))
    palette = np.stack([colours >> 16, colours >> 8 & 255, colours & 255], -1).astype(np.uint8)
    shared = [Image.fromarray(index[frame]) for frame in codes]
    for image in shared:
        image.putpalette(palette.tobytes())
    return shared


def renders_with_opengl(env_id: str) -> bool:
    """Whether a registered env draws its frames through OpenGL (MuJoCo's envs): never in a
    process that has loaded TensorFlow (Mesa's software renderer and TensorFlow each bring
    LLVM, and the process crashes), so `gif_in_child` draws them in a process of their own."""
    try:
        entry = gym.spec(env_id).entry_point
    except Exception:  # not registered: a factory, or an id gymnasium does not know
        return False
    return "mujoco" in str(entry)


def policy_gif(config: ImpalaConfig, weights: list[np.ndarray], path: str | Path,
               episodes: int = 1, max_frames: int = 300, seed: int | None = None,
               greedy: bool = False, fps: float = 15.0, source: str = "the run"
               ) -> tuple[list[float], int]:
    """`record_episodes` of `numpy_policy` (the run's ``clip_actions`` and ``squash_actions``)
    written to ``path`` as a GIF; returns (the returns of the episodes played to their end,
    the number of frames)."""
    model = numpy_policy(config, weights, source)
    frames, returns = record_episodes(config.env, model, episodes, max_frames, seed, greedy,
                                      clip=config.clip_actions, squash=config.squash_actions)
    write_gif(frames, path, fps)
    return returns, len(frames)


def _gif_child(conn: Any, config: dict, weights: list, path: str, max_frames: int,
               seed: int | None) -> None:
    """`gif_in_child`'s process: numpy and gymnasium only, never TensorFlow."""
    try:
        returns, frames = policy_gif(ImpalaConfig.from_dict(config), weights, path,
                                     max_frames=max_frames, seed=seed)
        conn.send((None, returns, frames))
    except Exception as exc:
        conn.send((str(exc), [], 0))


def gif_in_child(config: ImpalaConfig, weights: list, path: str | Path, max_frames: int = 300,
                 seed: int | None = None, timeout: float = 300.0) -> tuple[list[float], int]:
    """`policy_gif` of one episode, drawn in a spawned process (see `renders_with_opengl`);
    ValueError if the env cannot render (the child's message), or the child crashed or
    outlived ``timeout``."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # never fork a process that holds TensorFlow
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_gif_child, name="impala-lab-gif", daemon=True,
                       args=(child, config.to_dict(), weights, str(path), max_frames, seed))
    proc.start()
    child.close()
    try:
        if not parent.poll(timeout):
            raise ValueError(f"the process drawing {Path(path).name} ended without a word "
                             f"(exit code {proc.exitcode}) or took over {timeout:g} s")
        error, returns, frames = parent.recv()
    except EOFError:
        raise ValueError(f"the process drawing {Path(path).name} crashed "
                         f"(exit code {proc.exitcode})") from None
    finally:
        proc.join(5)
        if proc.is_alive():
            proc.terminate()
            proc.join(5)
        parent.close()
    if error is not None:
        raise ValueError(error)
    return returns, frames


def play_checkpoint(checkpoint: str | Path, out: str | Path, episodes: int = 1,
                    max_frames: int = 2000, seed: int | None = None, greedy: bool = False,
                    fps: float = 15.0) -> tuple[Path, list[float], int]:
    """`policy_gif` of a checkpoint (`Impala.save`'s directory) written to ``out``; returns
    (the GIF's path, the episodes' returns, the number of frames).

    Raises:
      ValueError: the checkpoint's env is a factory (only its name was saved) or cannot be
        made; FileNotFoundError / ValueError from `read_checkpoint` for a bad directory.
    """
    from impala_lab.driver.checkpoint import read_checkpoint

    state, weights, _ = read_checkpoint(checkpoint)
    if str(state["config"].get("env", "")).startswith("factory:"):
        raise ValueError(f"{checkpoint}: its env was a factory ({state['config']['env']}), "
                         "which a checkpoint does not keep; play needs a registered env id")
    config = ImpalaConfig.from_dict(state["config"])
    returns, frames = policy_gif(config, weights, out, episodes, max_frames, seed, greedy, fps,
                                 source=str(checkpoint))
    return Path(out), returns, frames
