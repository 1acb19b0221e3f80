"""A synthetic camera: a textured scene with a moving object, deterministic per seed.

Stands in for a real camera driver in ``make run``, tests and benchmarks, so nothing needs a
device or a download. Frames change smoothly (the object moves along a Lissajous path, the
background drifts) and carry sensor noise, like a real robot's view.
"""

from __future__ import annotations

import numpy as np

RATE_HZ = 30.0  # frames a second a synthetic camera publishes unless told another (a common camera's rate)


class SyntheticCamera:
    def __init__(self, height: int = 480, width: int = 640, seed: int = 0) -> None:
        if height < 8 or width < 8:
            raise ValueError(f"synthetic camera needs at least 8x8 pixels, got {height}x{width}")
        self.height, self.width = height, width
        self.rng = np.random.default_rng(seed)
        yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
        self._yy, self._xx = yy, xx
        texture = np.sin(xx / 13.0)[..., None] * np.array([40, 25, 10], np.float32) \
            + np.cos(yy / 17.0)[..., None] * np.array([10, 30, 45], np.float32)
        self._background = (110.0 + texture).astype(np.float32)
        self.index = 0

    def frame(self) -> np.ndarray:
        """The next HxWx3 uint8 RGB frame."""
        t = self.index / 30.0
        self.index += 1
        shift = int(8 * np.sin(0.3 * t))
        image = np.roll(self._background, shift, axis=1).copy()
        cy = self.height * (0.5 + 0.3 * np.sin(1.1 * t))
        cx = self.width * (0.5 + 0.35 * np.cos(0.7 * t))
        radius = 0.08 * min(self.height, self.width)
        mask = (self._yy - cy) ** 2 + (self._xx - cx) ** 2 < radius ** 2
        image[mask] = (220.0, 60.0, 40.0)
        image += self.rng.normal(0.0, 4.0, size=(self.height, self.width, 1)).astype(np.float32)
        return np.clip(image, 0, 255).astype(np.uint8)
