"""``python -m bench.ending``: the two costs of a run's ending that changed, before and after.

    python -m bench.ending              # 10 alternating pairs of each
    python -m bench.ending --pairs 20

gif   `impala_lab.cli.play.write_gif` against Pillow's own way (an adaptive palette for each
      frame, what `write_gif` did before it shared one palette), alternating, on the same 300
      CartPole frames rendered once (seed 0, alternating actions).
exit  a fresh process that imports TensorFlow and runs one traced function, timed from its
      last line to its end, with and without `gc.freeze()` on that line (what
      `impala_lab.speed.freeze_before_exit` does as the ``impala-lab`` command returns).

Each is reported as the medians of both sides and the median paired difference (before minus
after: what the change saves) with a bootstrap 95% interval; figures go to
``docs/results/ending.json`` and ``.md``. Run it alone on the machine (the bench lock).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.seed_summary import median_difference

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "docs" / "results"
BOOTSTRAP = 5000
EXIT_SCRIPT = """
import sys, time
import tensorflow as tf
tf.function(lambda x: x * 2)(tf.ones(3))
{last}
sys.stdout.write(repr(time.time()))
sys.stdout.flush()
"""


def pillow_gif(frames: list[np.ndarray], path: Path, fps: float = 15.0) -> None:
    """The GIF as Pillow writes RGB frames by itself: a palette of its own for each frame."""
    from PIL import Image

    images = [Image.fromarray(f).resize((320, round(f.shape[0] * 320 / f.shape[1])),
                                        Image.Resampling.NEAREST) for f in frames]
    images[0].save(path, save_all=True, append_images=images[1:], loop=0,
                   duration=round(1000 / fps), optimize=False)


def cartpole_frames(n: int = 300) -> list[np.ndarray]:
    import gymnasium as gym

    env = gym.make("CartPole-v1", render_mode="rgb_array")
    env.reset(seed=0)
    frames = []
    for step in range(n):
        frames.append(env.render())
        _, _, terminated, truncated, _ = env.step(step % 2)
        if terminated or truncated:
            env.reset()
    env.close()
    return frames


def gif_pairs(pairs: int) -> list[tuple[float, float]]:
    """(Pillow's way, write_gif) seconds per pair, the order alternating."""
    from impala_lab.cli.play import write_gif

    frames = cartpole_frames()
    out: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ending-") as tmp:
        for i in range(pairs):
            seconds = {}
            for name in (("before", "after") if i % 2 == 0 else ("after", "before")):
                write = pillow_gif if name == "before" else write_gif
                t0 = time.perf_counter()
                write(frames, Path(tmp) / f"{name}.gif")
                seconds[name] = time.perf_counter() - t0
            out.append((seconds["before"], seconds["after"]))
    return out


def exit_seconds(freeze: bool) -> float:
    """Seconds from the script's last line to the end of its process."""
    last = "import gc; gc.freeze()" if freeze else "pass"
    proc = subprocess.run([sys.executable, "-c", EXIT_SCRIPT.format(last=last)],
                          capture_output=True, text=True, check=True)
    return time.time() - float(proc.stdout)


def exit_pairs(pairs: int) -> list[tuple[float, float]]:
    """(without the freeze, with it) seconds per pair, the order alternating."""
    out = []
    for i in range(pairs):
        order = (False, True) if i % 2 == 0 else (True, False)
        seconds = {freeze: exit_seconds(freeze) for freeze in order}
        out.append((seconds[False], seconds[True]))
    return out


def summarize(pairs: list[tuple[float, float]], rng: np.random.Generator) -> dict[str, Any]:
    before, after = (np.array(side, np.float64) for side in zip(*pairs, strict=True))
    saves, interval = median_difference(before - after, rng, BOOTSTRAP)
    return {"n": len(before), "before": float(np.median(before)),
            "after": float(np.median(after)), "saves": saves, "interval": interval}


def markdown(summaries: dict[str, dict[str, Any]]) -> str:
    rows = ["| cost (seconds) | n | before | after | saves [95%] |",
            "| --- | ---: | ---: | ---: | --- |"]
    for name, s in summaries.items():
        lo, hi = s["interval"]
        rows.append(f"| {name} | {s['n']} | {s['before']:.3f} | {s['after']:.3f} | "
                    f"{s['saves']:+.3f} [{lo:+.3f}, {hi:+.3f}] |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ending",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=10, help="pairs of each measure")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for the results")
    args = parser.parse_args(argv)
    if args.pairs < 2:
        parser.error(f"--pairs={args.pairs}: it must be >= 2 for an interval")
    rng = np.random.default_rng(0)
    raw = {"gif (300 CartPole frames)": gif_pairs(args.pairs),
           "exit after TensorFlow": exit_pairs(args.pairs)}
    summaries = {name: summarize(pairs, rng) for name, pairs in raw.items()}
    table = markdown(summaries)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ending.json").write_text(json.dumps(
        {"pairs": raw, "summary": summaries}, indent=1))
    (args.out / "ending.md").write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
