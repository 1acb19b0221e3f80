"""Frame encoder: an HxWx3 uint8 camera image -> ``tokens_per_frame`` embeddings for the decoder.

resize -> normalise -> cut into patch x patch tiles -> average the tiles of each cell of a
sqrt(tokens_per_frame)^2 grid -> linear projection to the hidden size -> + learned per-token
position embedding. Averaging before projecting equals projecting then averaging (the projection
is linear), and costs tokens_per_frame projections instead of one per patch.
A tile is flattened in (row, column, channel) order.
"""

from __future__ import annotations

import cv2
import numpy as np

from .checkpoint import Checkpoint
from .config import VisionConfig


class FrameError(ValueError):
    """An image the encoder cannot use (wrong shape, dtype or size)."""


def check_frame(image: np.ndarray) -> None:
    """FrameError unless ``image`` is a non-empty HxWx3 uint8 array: what every frame encoder takes."""
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        shape = getattr(image, "shape", None)
        dtype = getattr(image, "dtype", type(image).__name__)
        raise FrameError(f"frame must be an HxWx3 uint8 array, got shape {shape} dtype {dtype}")
    if image.shape[0] == 0 or image.shape[1] == 0:
        raise FrameError(f"frame is empty: shape {image.shape}")


def resize_frame(image: np.ndarray, size: int) -> np.ndarray:
    """The frame at the encoder's SxS (area interpolation); training resizes its demonstrations with it too."""
    if image.shape[:2] == (size, size):
        return image
    return cv2.resize(image, (size, size), interpolation=cv2.INTER_AREA)


class FrameEncoder:
    def __init__(self, vision: VisionConfig, patch_weight: np.ndarray, patch_bias: np.ndarray, pos_embed: np.ndarray) -> None:
        self.vision = vision
        self.patch_weight = patch_weight
        self.patch_bias = patch_bias
        self.pos_embed = pos_embed
        self.mean = np.asarray(vision.mean, dtype=np.float32) * 255.0
        self.inv_std = 1.0 / (np.asarray(vision.std, dtype=np.float32) * 255.0)

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> "FrameEncoder":
        f32 = checkpoint.float32
        return cls(checkpoint.config.vision, f32("vision.patch_proj.weight"), f32("vision.patch_proj.bias"),
                   f32("vision.pos_embed"))

    def preprocess(self, image: np.ndarray) -> np.ndarray:
        """Validate, resize and normalise to [S, S, 3] fp32."""
        check_frame(image)
        return (resize_frame(image, self.vision.image_size).astype(np.float32) - self.mean) * self.inv_std

    def encode(self, image: np.ndarray) -> np.ndarray:
        """[tokens_per_frame, hidden] fp32 embeddings of one frame."""
        v = self.vision
        pixels = self.preprocess(image)
        grid, patch = v.pool_grid, v.patch_size
        per_cell = v.image_size // patch // grid
        cells = pixels.reshape(grid, per_cell, patch, grid, per_cell, patch, 3).mean(axis=(1, 4))
        cells = cells.transpose(0, 2, 1, 3, 4).reshape(v.tokens_per_frame, v.patch_dim)
        return cells @ self.patch_weight.T + self.patch_bias + self.pos_embed
