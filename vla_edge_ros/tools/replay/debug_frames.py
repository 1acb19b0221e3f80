"""``vla-edge replay --debug-frames DIR``: the live node's debug image of every cycle, as files.

The pictures are ``runtime/debug_image.draw_debug_image``'s, the function the reasoning node publishes on
``vla/debug_image``, from the same hand-off (the driver's ``DebugFeed``) and the same copies. Replay draws
each one right after its cycle, on its one thread; on the virtual clock that costs no time, so every
decision is what it is without them. Under ``--realtime`` the drawing would take the reasoner's wall time,
which live it never does, so the command line refuses the two together.

- PNG (the default): ``<policy>/frame_<index>.png``, one per cycle, named by the frame's index in the camera
  topic (the ``frame`` of the decisions file and the predictions CSV). Dropped frames had no cycle, so the
  numbers have gaps; ``ffmpeg -framerate 30 -pattern_type glob -i 'fifo/frame_*.png' fifo.mp4`` makes a video.
- MP4 (``--debug-video``): ``<policy>.mp4`` through OpenCV's VideoWriter with the ``mp4v`` codec (MPEG-4
  part 2: VLC, ffplay and mpv play it; browsers do not), at the camera's rate, one video frame per camera
  frame from the first cycle's to the last's, a dropped frame showing the picture before it, so the video
  runs in step with the bag. OpenCV's pip wheels carry the encoder; a build without FFmpeg cannot open the
  writer, which is reported as an error naming the PNG way instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

VIDEO_CODEC = "mp4v"


@dataclass(frozen=True)
class DebugTarget:
    """Where one bag's debug images go, and how."""

    directory: Path
    video: bool  # one MP4 per policy instead of a PNG per cycle
    fps: float  # the camera's rate (the video's frame rate)


class DebugFrames:
    """Writes one policy's debug images as ``target`` says; ``add`` each cycle's in order, then ``close``."""

    def __init__(self, target: DebugTarget, policy: str) -> None:
        self.target = target
        self.policy = policy
        self.written = 0  # pictures written (PNG files, or video frames)
        self._video: cv2.VideoWriter | None = None
        self._last: tuple[int, np.ndarray] | None = None  # the previous picture and its frame index
        target.directory.mkdir(parents=True, exist_ok=True)
        if not target.video:
            (target.directory / policy).mkdir(exist_ok=True)

    @property
    def path(self) -> Path:
        """The MP4 file, or the directory of PNG files."""
        return self.target.directory / (f"{self.policy}.mp4" if self.target.video else self.policy)

    def add(self, index: int, image: np.ndarray) -> None:
        """The picture of the cycle on camera frame ``index`` (RGB)."""
        bgr = np.ascontiguousarray(image[:, :, ::-1])
        if not self.target.video:
            path = self.path / f"frame_{index:06d}.png"
            if not cv2.imwrite(str(path), bgr):
                raise OSError(f"could not write {path}")
            self.written += 1
            return
        if self._video is None:
            self._video = self._open(image.shape)
        if self._last is not None:
            last_index, last = self._last
            for _ in range(index - last_index - 1):  # frames without a cycle show the picture before them
                self._video.write(last)
                self.written += 1
        self._video.write(bgr)
        self.written += 1
        self._last = (index, bgr)

    def close(self) -> None:
        if self._video is not None:
            self._video.release()
            self._video = None

    def _open(self, shape: tuple[int, ...]) -> cv2.VideoWriter:
        video = cv2.VideoWriter(str(self.path), cv2.VideoWriter_fourcc(*VIDEO_CODEC), max(self.target.fps, 1.0),
                                (shape[1], shape[0]))
        if not video.isOpened():
            raise OSError(f"could not open {self.path} for writing: this OpenCV has no {VIDEO_CODEC} encoder "
                          "(a build without FFmpeg); write PNG frames instead (leave out --debug-video)")
        return video
