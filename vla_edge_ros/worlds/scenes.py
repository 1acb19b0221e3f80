"""Cue scenes: a brief cue on a table, then a long stretch of near-identical views, then a question.

The memory benchmark needs episodes where the one thing worth remembering is shown once and then
buried under frames that carry nothing new, so that what a KV policy keeps (or an aura memory
writes) decides whether the answer is still there when the query comes. Everything is numpy and
deterministic per seed (no ROS), so the same scenes can later be written into rosbag scenarios.

A scene is a textured table (smooth low-frequency shading plus fine grain, fixed per seed) with a
few fixed clutter objects. The cue is a coloured disc at one of a few places; class ``c`` is the
combination (colour ``c % 4``, place ``(c + c // 4) % 2``), so consecutive classes differ in both
colour and place and ``MAX_CLASSES`` = 8 combinations are all distinct. Distractor and query
frames are the bare scene with sensor noise and a small camera jitter: near-duplicates of each
other, unlike the cue frame around the cue.
"""

from __future__ import annotations

import numpy as np

CUE_COLOURS = np.array([(230, 40, 40), (40, 200, 60), (50, 80, 235), (240, 220, 40)], dtype=np.float32)
CUE_PLACES = ((0.3, 0.3), (0.7, 0.7))  # (row, column) as fractions of the frame
MAX_CLASSES = len(CUE_COLOURS) * len(CUE_PLACES)
CLUTTER_OBJECTS = 3
TEST, PROTOTYPE, OVERHEAD, COMPRESSION = 0, 1, 2, 3  # seed splits of the memory benchmark: scored and prototype
# episodes, the overhead stream, the dms compression stream (the cue-recall sample bag replays TEST)


def scene_seed(seed: int, split: int, index: int) -> int:
    """Independent scene seeds for each (run seed, split, episode index)."""
    return int(np.random.SeedSequence([seed, split, index]).generate_state(1)[0])


class CueScene:
    """One episode's table, clutter and camera noise; frames come from its own seeded stream."""

    def __init__(self, seed: int, *, classes: int = 4, height: int = 64, width: int = 64,
                 noise_sigma: float = 4.0, jitter_px: int = 2) -> None:
        if not 1 <= classes <= MAX_CLASSES:
            raise ValueError(f"a cue scene has 1..{MAX_CLASSES} cue classes, got {classes}")
        if height < 16 or width < 16:
            raise ValueError(f"a cue scene needs at least 16x16 pixels, got {height}x{width}")
        if noise_sigma < 0 or jitter_px < 0:
            raise ValueError(f"noise_sigma and jitter_px must be >= 0, got {noise_sigma} and {jitter_px}")
        self.classes, self.height, self.width = classes, height, width
        self.noise_sigma, self.jitter_px = noise_sigma, jitter_px
        self._rng = np.random.default_rng(seed)
        self._yy, self._xx = np.mgrid[0:height, 0:width].astype(np.float32)
        self._scene = self._table()
        self._add_clutter(self._scene)

    def _table(self) -> np.ndarray:
        """Smooth shading from a few low-frequency waves, plus a fixed fine grain."""
        rng, yy, xx = self._rng, self._yy / self.height, self._xx / self.width
        base = rng.uniform(90, 150, size=3).astype(np.float32)
        image = np.broadcast_to(base, (self.height, self.width, 3)).copy()
        for _ in range(3):
            fy, fx = rng.uniform(0.5, 2.0, size=2)
            phase = rng.uniform(0, 2 * np.pi)
            wave = np.sin(2 * np.pi * (fy * yy + fx * xx) + phase)
            image += wave[..., None] * rng.uniform(5, 20, size=3).astype(np.float32)
        image += rng.normal(0.0, 4.0, size=(self.height, self.width, 1)).astype(np.float32)
        return image

    def _add_clutter(self, image: np.ndarray) -> None:
        """Muted rectangles (within 60 grey levels of the table's mean) that are always there, so never news."""
        rng, table = self._rng, image.mean(axis=(0, 1))
        for _ in range(CLUTTER_OBJECTS):
            h = rng.integers(self.height // 10, self.height // 5 + 1)
            w = rng.integers(self.width // 10, self.width // 5 + 1)
            y, x = rng.integers(0, self.height - h), rng.integers(0, self.width - w)
            image[y:y + h, x:x + w] = table + rng.uniform(-60, 60, size=3).astype(np.float32)

    def _camera(self, image: np.ndarray, jitter: bool) -> np.ndarray:
        """What the sensor returns: the image shifted by a small jitter, plus Gaussian noise, as uint8."""
        if jitter and self.jitter_px:
            dy, dx = self._rng.integers(-self.jitter_px, self.jitter_px + 1, size=2)
            image = np.roll(image, (int(dy), int(dx)), axis=(0, 1))
        noisy = image + self._rng.normal(0.0, self.noise_sigma, size=image.shape).astype(np.float32)
        return np.clip(np.rint(noisy), 0, 255).astype(np.uint8)

    def cue_region(self, cls: int) -> tuple[float, float, float]:
        """(row, column, radius) in pixels of class ``cls``'s cue disc."""
        self._check_class(cls)
        row, col = CUE_PLACES[(cls + cls // len(CUE_COLOURS)) % len(CUE_PLACES)]
        return row * self.height, col * self.width, min(self.height, self.width) / 8

    def cue_frame(self, cls: int) -> np.ndarray:
        """The scene with class ``cls``'s cue on it (noise, no jitter)."""
        cy, cx, radius = self.cue_region(cls)
        image = self._scene.copy()
        image[(self._yy - cy) ** 2 + (self._xx - cx) ** 2 <= radius ** 2] = CUE_COLOURS[cls % len(CUE_COLOURS)]
        return self._camera(image, jitter=False)

    def distractor_frame(self) -> np.ndarray:
        """The scene without the cue: nothing new, only noise and jitter."""
        return self._camera(self._scene, jitter=True)

    def query_frame(self) -> np.ndarray:
        """The frame the question is asked on: the cue is long gone, so it looks like a distractor."""
        return self.distractor_frame()

    def episode(self, cls: int, distractors: int) -> list[np.ndarray]:
        """[cue, ``distractors`` distractor frames, query]."""
        if distractors < 0:
            raise ValueError(f"distractors must be >= 0, got {distractors}")
        return [self.cue_frame(cls), *(self.distractor_frame() for _ in range(distractors)), self.query_frame()]

    def _check_class(self, cls: int) -> None:
        if not 0 <= cls < self.classes:
            raise ValueError(f"cue class must be in [0, {self.classes - 1}], got {cls}")
