"""A VL checkpoint's vision tower on the engine's backend: NumPy's ``VisionTower`` or ``CudaVisionTower``."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..backends import on_cuda
from ..checkpoint import Checkpoint


class VisionEncoder(Protocol):
    """What both vision towers offer: image patches [N, patch_dim] and their grids [n, 3] -> decoder tokens."""

    def encode(self, patches: np.ndarray, grid_thw: np.ndarray) -> np.ndarray: ...


def make_vision_tower(name: str, checkpoint: Checkpoint) -> VisionEncoder:
    """The tower of ``checkpoint`` on backend ``name`` (``auto``, ``numpy`` or ``cuda``, as the decoder's)."""
    if on_cuda(name):
        from .cuda_vision import CudaVisionTower

        return CudaVisionTower.from_checkpoint(checkpoint)
    from .vision import VisionTower

    return VisionTower.from_checkpoint(checkpoint)
