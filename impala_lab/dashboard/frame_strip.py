"""The frame strip: the last observations of one worker's env (`Impala.latest_frames()`) as a
PNG (encoded only when new frames arrived), under a caption; non-images get only a caption.
"""

from __future__ import annotations

from html import escape
from typing import Any

from impala_lab.dashboard.format import fmt_count
from impala_lab.dashboard.live_plots import png_bytes
from impala_lab.envs.frames import Frames, image_kind, not_image_reason, strip_rgb


def caption_html(frames: Frames | None, reason: str = "") -> str:
    """The line above the strip: where the frames come from, or why there are none."""
    style = 'style="font-size:13px;color:#555"'
    if reason:
        return f'<span {style}>{escape(reason, quote=False)}</span>'
    if frames is None:
        return (f'<span {style}>frames appear when the first batch of the lowest-numbered '
                'worker arrives</span>')
    k = len(frames.obs)
    return (f'<span {style}><b>frames</b>: worker {frames.worker_index}, env '
            f'{frames.column}, its last {k} step{"s" if k != 1 else ""} (newest at '
            f'{fmt_count(int(frames.env_steps[-1]))} env steps); red gap: a new episode</span>')


class FrameStripView:
    """What the panel shows for a run with ``observation_space`` (None: no panel); ``reason``:
    why there is no strip; ``encodes``: PNGs encoded so far."""

    def __init__(self, observation_space: Any) -> None:
        self.visible = observation_space is not None
        self.reason = not_image_reason(observation_space) if self.visible else ""
        self.has_strip = self.visible and image_kind(observation_space) is not None
        self.encodes = 0
        self._version: int | None = None

    def update(self, frames: Frames | None) -> tuple[bytes | None, str]:
        """(PNG bytes if they changed since the last call else None, the caption)."""
        if not self.visible:
            return None, ""
        if frames is None or not self.has_strip:
            return None, caption_html(None, self.reason)
        if frames.version == self._version:
            return None, caption_html(frames)
        png = png_bytes(strip_rgb(frames))
        self._version = frames.version
        self.encodes += 1
        return png, caption_html(frames)
