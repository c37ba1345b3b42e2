"""The frame strip's data: which frames the driver keeps (one worker, one column, new batches
only, the run's env steps), and how they are drawn (MinAtar's palette, images as they are, no
strip for observations that are not images)."""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest

from impala_lab.batch import SampleBatch
from impala_lab.driver.actors import Actors
from impala_lab.driver.driver_loop import DriverLoop
from impala_lab.driver.latest_frames import LatestFrames
from impala_lab.driver.replay_mixer import ReplayMixer
from impala_lab.driver.run_stats import RunStats
from impala_lab.envs.frames import (
    FRAME_STRIP_LENGTH,
    Frames,
    image_kind,
    not_image_reason,
    strip_rgb,
)
from impala_lab.envs.minatar import palette, to_rgb

GREY_SPACE = gym.spaces.Box(0, 255, (2, 2, 1), np.uint8)
T, B = 4, 2


def make_batch(serial: int, *, version: int = 0, ends: tuple = (), cut: tuple = (),
               lstm: bool = False) -> SampleBatch:
    """[T, B] with obs[t, b] = (serial * 10 + t, b, ...): each frame says where it came from.
    ``ends``: (t, b) where an episode terminated; ``cut``: where one was truncated."""
    obs = np.zeros((T, B, 2, 2, 1), np.uint8)
    obs[:, :, 0, 0, 0] = serial * 10 + np.arange(T)[:, None]
    obs[:, :, 0, 1, 0] = np.arange(B)
    terminateds = np.zeros((T, B), bool)
    truncateds = np.zeros((T, B), bool)
    for t, b in ends:
        terminateds[t, b] = True
    for t, b in cut:
        truncateds[t, b] = True
    return SampleBatch(
        obs=obs, actions=np.zeros((T, B), np.int64), rewards=np.zeros((T, B), np.float32),
        terminateds=terminateds, truncateds=truncateds,
        truncation_values=np.zeros((T, B), np.float32),
        behaviour_logits=np.zeros((T, B, 2), np.float32),
        bootstrap_obs=np.zeros((B, 2, 2, 1), np.uint8),
        policy_versions=np.full(B, version, np.int64),
        episode_returns=np.zeros(0), episode_lengths=np.zeros(0, np.int64),
        state_in=np.zeros((B, 2, 3), np.float32) if lstm else None)


def frame_ids(frames: Frames) -> list[int]:
    return [int(v) for v in frames.obs[:, 0, 0, 0]]


# ---------------------------------------------------------------------- which frames
def test_the_last_k_frames_of_column_0_of_the_followed_worker_only():
    keeper = LatestFrames(GREY_SPACE, length=6)
    assert keeper.kind == "grey" and keeper.latest() is None
    assert not keeper.observe(1, make_batch(9), lowest_live_index=0, env_steps=8)
    assert keeper.latest() is None  # another worker's batch

    first = make_batch(1, ends=[(2, 0)], cut=[(1, 1)])
    assert keeper.observe(0, first, lowest_live_index=0, env_steps=16)
    f = keeper.latest()
    assert frame_ids(f) == [10, 11, 12, 13] and set(f.obs[:, 0, 1, 0]) == {0}  # column 0
    assert f.env_steps.tolist() == [16] * 4 and f.version == 1
    assert f.ends.tolist() == [False, False, True, False]  # column 1's truncation not here
    assert (f.worker_index, f.column, f.kind) == (0, 0, "grey")

    keeper.observe(0, make_batch(2, cut=[(0, 0)], lstm=True), lowest_live_index=0,
                   env_steps=40)
    f = keeper.latest()
    assert frame_ids(f) == [12, 13, 20, 21, 22, 23]  # K = 6 across the two batches
    assert f.env_steps.tolist() == [16, 16, 40, 40, 40, 40]
    assert f.ends.tolist() == [True, False, True, False, False, False]
    assert f.version == 2

    # The lowest live worker changed (worker 0 failed): the strip starts again from worker 1.
    assert not keeper.observe(0, make_batch(3), lowest_live_index=1, env_steps=48)
    keeper.observe(1, make_batch(4), lowest_live_index=1, env_steps=56)
    f = keeper.latest()
    assert frame_ids(f) == [40, 41, 42, 43] and f.worker_index == 1 and f.version == 3


def test_frames_are_read_only_copies_that_keep_no_batch_alive():
    keeper = LatestFrames(GREY_SPACE, length=3)
    batch = make_batch(5)
    keeper.observe(0, batch, lowest_live_index=0, env_steps=8)
    f = keeper.latest()
    assert frame_ids(f) == [51, 52, 53] and FRAME_STRIP_LENGTH == 8
    assert not np.shares_memory(f.obs, batch.obs)
    assert not (f.obs.flags.writeable or f.env_steps.flags.writeable or f.ends.flags.writeable)
    ref = weakref.ref(batch)
    del batch
    gc.collect()
    assert ref() is None


def test_observations_that_are_not_images_are_never_kept_and_say_why():
    cartpole = gym.make("CartPole-v1").observation_space
    keeper = LatestFrames(cartpole)
    assert keeper.kind is None
    assert not keeper.observe(0, make_batch(1), lowest_live_index=0, env_steps=8)
    assert keeper.latest() is None
    assert not_image_reason(cartpole) == (
        "this env's observations (float32 [4]) are not images (bool or uint8 [H, W, C]): no "
        "frame strip")
    floats = gym.spaces.Box(0, 1, (84, 84, 4), np.float32)
    assert image_kind(floats) is None and "(float32 [84, 84, 4])" in not_image_reason(floats)
    assert image_kind(gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)) == "stack"  # Atari's
    assert not_image_reason(gym.spaces.Discrete(3)).startswith(
        "this env's observations (int64 [])")
    assert image_kind(gym.spaces.Box(0, 1, (10, 10, 4), bool)) == "channels"
    assert image_kind(gym.spaces.Box(0, 255, (6, 5, 3), np.uint8)) == "rgb"
    assert not_image_reason(gym.spaces.Box(0, 1, (10, 10, 4), bool)) == ""
    with pytest.raises(ValueError, match="length=0 is invalid: keep at least one frame"):
        LatestFrames(GREY_SPACE, length=0)


# ---------------------------------------------------------------------- in the driver loop
class _Tasks:
    """The task pool: the next turn's finished samples, in the order given."""

    def __init__(self) -> None:
        self.next_turn: list = []

    def completed_prefetch(self, blocking_wait: bool, timeout: float):
        done, self.next_turn = self.next_turn, []
        yield from done

    def add(self, worker, future) -> None:
        pass


def _worker(index: int) -> SimpleNamespace:
    return SimpleNamespace(index=index, set_weights=lambda ref: None, sample=lambda: None)


def test_the_driver_loop_shows_new_batches_dropped_ones_too_and_never_replays():
    config = SimpleNamespace(train_batch_size=8, broadcast_interval=1, max_policy_lag=5,
                             max_sample_requests_in_flight_per_worker=1, learner_queue_size=100)
    replay = ReplayMixer(3.0, 10, train_batch_size=8, sample_batch_size=T, seed=0)
    # A learner port that never trains: weights_version is set by hand below.
    learner = SimpleNamespace(put_batch=lambda batch, timeout: True, drain_trained=lambda: 0,
                              take_weights_updated=lambda: False, weights_version=0,
                              get_weights=lambda: ([], learner.weights_version),
                              raise_if_failed=lambda: None, is_alive=lambda: True)
    w0, w1, w2 = _worker(0), _worker(1), _worker(2)
    supervisor = SimpleNamespace(workers=[w0, w1], sample_returned=lambda w: None)
    stats, tasks = RunStats(), _Tasks()
    frames = LatestFrames(GREY_SPACE, length=6)
    actors = Actors(SimpleNamespace(put_weights=lambda w, v: "ref"), tasks, supervisor)
    loop = DriverLoop(config, replay, learner, stats, actors=actors, frames=frames)
    mixed = []
    mix = replay.mix
    replay.mix = lambda pairs: (mixed.append(p) or p for p in mix(pairs))

    def turn(*pairs):
        tasks.next_turn = list(pairs)
        sampled, trained = loop.step(0.0)
        stats.count_step(sampled, trained)  # as Impala.step does after the turn

    turn((w0, make_batch(0)), (w1, make_batch(1)))
    assert frame_ids(frames.latest()) == [0, 1, 2, 3]
    assert frames.latest().env_steps.tolist() == [8] * 4  # w0's batch came first

    s3 = make_batch(3, ends=[(1, 0)])
    turn((w1, make_batch(2)), (w0, s3))
    # replays of older batches followed w0's batch; the frames are still w0's newest
    assert mixed[-1][0] is None and mixed[-1][1] is not s3 and replay.num_replayed_batches
    f = frames.latest()
    assert frame_ids(f) == [2, 3, 30, 31, 32, 33]
    assert f.env_steps.tolist() == [8, 8, 32, 32, 32, 32]  # 16 before the turn, then 8 + 8
    assert f.ends.tolist() == [False, False, False, True, False, False]

    # A batch dropped for lag is new env steps all the same (counted at once, not twice).
    learner.weights_version = 10
    turn((w0, make_batch(4, version=0)), (w1, make_batch(5, version=10)))
    assert stats.num_samples_dropped_for_lag == 8 and stats.num_steps_sampled == 48
    f = frames.latest()
    assert frame_ids(f) == [32, 33, 40, 41, 42, 43]
    assert f.env_steps.tolist() == [32, 32, 40, 40, 40, 40]

    # Worker 0 was replaced by worker 2: worker 1 is the lowest live index now.
    supervisor.workers = [w1, w2]
    turn((w2, make_batch(6, version=10)), (w1, make_batch(7, version=10)))
    f = frames.latest()
    assert (frame_ids(f), f.worker_index) == ([70, 71, 72, 73], 1)
    assert f.env_steps.tolist() == [64] * 4


# ---------------------------------------------------------------------- drawing
def _frames(obs: np.ndarray, kind: str, ends=None) -> Frames:
    k = len(obs)
    return Frames(obs=obs, env_steps=np.zeros(k, np.int64),
                  ends=np.zeros(k, bool) if ends is None else np.asarray(ends),
                  worker_index=0, column=0, kind=kind, version=1)


def test_minatar_frames_are_drawn_with_to_rgb_in_its_palette_and_separated():
    obs = (np.random.default_rng(0).random((3, 10, 10, 4)) < 0.3).astype(np.uint8)
    strip = strip_rgb(_frames(obs, "channels", ends=[False, True, False]))
    assert strip.dtype == np.uint8 and strip.shape == (80, 3 * 80 + 2 * 2, 3)
    colours = palette(4)
    for i in range(3):
        x = i * 82
        np.testing.assert_array_equal(strip[:, x:x + 80], to_rgb(obs[i], colours, 8))
    assert (strip[:, 80:82] == [200, 200, 200]).all()  # frame 0 -> 1: the same episode
    assert (strip[:, 162:164] == [192, 57, 43]).all()  # frame 1 ended its episode
    small = strip_rgb(_frames(obs[:1], "channels"), scale=1)
    np.testing.assert_array_equal(small, to_rgb(obs[0], colours))


def test_uint8_images_are_drawn_as_they_are_and_grey_ones_in_grey():
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (2, 6, 5, 3), dtype=np.uint8)
    strip = strip_rgb(_frames(rgb, "rgb"), scale=1, gap=1)
    np.testing.assert_array_equal(strip[:, :5], rgb[0])
    np.testing.assert_array_equal(strip[:, 6:], rgb[1])
    scaled = strip_rgb(_frames(rgb, "rgb"))  # 6 rows: scaled by 80 // 6 = 13
    assert scaled.shape == (78, 2 * 65 + 2, 3)
    np.testing.assert_array_equal(scaled[:, :65], rgb[0].repeat(13, 0).repeat(13, 1))
    big = rng.integers(0, 256, (1, 90, 70, 3), dtype=np.uint8)
    np.testing.assert_array_equal(strip_rgb(_frames(big, "rgb")), big[0])
    grey = rng.integers(0, 256, (1, 4, 4, 1), dtype=np.uint8)
    drawn = strip_rgb(_frames(grey, "grey"), scale=1)
    assert all(np.array_equal(drawn[..., c], grey[0, ..., 0]) for c in range(3))
    with pytest.raises(ValueError, match="kind='vector' is not an image kind"):
        strip_rgb(_frames(grey, "vector"))


def test_a_stack_of_grey_frames_is_drawn_as_its_newest_frame():
    stacks = np.random.default_rng(2).integers(0, 256, (3, 84, 84, 4), dtype=np.uint8)
    strip = strip_rgb(_frames(stacks, "stack"), gap=2)  # 84 rows: no scaling
    assert strip.shape == (84, 3 * 84 + 2 * 2, 3)
    for i in range(3):
        x = i * 86
        assert all(np.array_equal(strip[:, x:x + 84, c], stacks[i, ..., 3]) for c in range(3))
