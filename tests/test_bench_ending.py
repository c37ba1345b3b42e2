"""bench.ending: its summary on known data, and its "before" GIF writer draws the same frames
as `write_gif` (the bench compares two ways of writing one GIF, not two GIFs)."""

from __future__ import annotations

import numpy as np
from PIL import Image

from bench.ending import markdown, pillow_gif, summarize
from impala_lab.cli.play import write_gif


def test_the_summary_gives_each_sides_median_and_what_the_change_saves():
    s = summarize([(0.8, 0.3), (0.9, 0.3), (0.7, 0.4)], np.random.default_rng(0))
    assert s["n"] == 3 and np.isclose(s["before"], 0.8) and np.isclose(s["after"], 0.3)
    assert np.isclose(s["saves"], 0.5)  # the median of 0.5, 0.6 and 0.3
    lo, hi = s["interval"]
    assert 0.3 - 1e-9 <= lo <= 0.5 <= hi <= 0.6 + 1e-9
    assert markdown({"gif": s}).splitlines()[2].startswith("| gif | 3 | 0.800 | 0.300 | +0.500 [")


def test_both_writers_draw_the_same_frames(tmp_path):
    rng = np.random.default_rng(1)
    colours = rng.integers(0, 256, (12, 3), dtype=np.uint8)
    frames = [colours[rng.integers(0, 12, (40, 60))] for _ in range(6)]  # 60 px wide: no scaling
    frames = [np.repeat(np.repeat(f, 10, 0), 10, 1) for f in frames]  # 400x600, as CartPole
    pillow_gif(frames, tmp_path / "before.gif")
    write_gif(frames, tmp_path / "after.gif")
    decoded = []
    for name in ("before", "after"):
        with Image.open(tmp_path / f"{name}.gif") as gif:
            assert gif.n_frames == 6 and gif.size == (320, 213)
            rgb = []
            for k in range(gif.n_frames):
                gif.seek(k)
                rgb.append(np.asarray(gif.convert("RGB")))
            decoded.append(rgb)
    for before, after in zip(*decoded, strict=True):
        np.testing.assert_array_equal(before, after)

