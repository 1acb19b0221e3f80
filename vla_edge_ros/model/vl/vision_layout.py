"""The index arithmetic of a Qwen2-VL / Qwen2.5-VL vision tower's input: it depends on the patch grid alone.

Patch positions, frame and window bounds and the window order (``VisionLayout``, ``vision_layout``) are
shared by the tower's implementations (NumPy ``vision.py``, CUDA ``cuda_vision.py``), and the token counts by
the prompt and M-RoPE code, which need no tower (and load no compiled kernels) at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import VisionTowerConfig


class VisionInputError(ValueError):
    """Patches or a grid that the tower cannot encode (wrong shape, grid not a multiple of the merge)."""


def check_grid(grid_thw: np.ndarray, merge: int) -> np.ndarray:
    """``grid_thw`` as an int64 [images, 3] array, refused unless every t, h, w is positive and h, w are
    multiples of ``merge`` (a decoder token takes merge x merge patches)."""
    grid = np.asarray(grid_thw)
    if grid.ndim != 2 or grid.shape[1] != 3 or grid.shape[0] == 0 or not np.issubdtype(grid.dtype, np.integer):
        raise VisionInputError(f"grid_thw must be a non-empty [images, 3] integer array, got shape {grid.shape} "
                               f"dtype {grid.dtype}")
    grid = grid.astype(np.int64)
    if (grid <= 0).any() or (grid[:, 1:] % merge).any():
        raise VisionInputError(f"grid_thw {grid.tolist()}: t, h, w must be positive and h, w multiples of the "
                               f"spatial merge size {merge}")
    return grid


def merged_token_counts(grid_thw: np.ndarray, merge: int) -> np.ndarray:
    """Decoder tokens per image: t * h * w / merge^2."""
    grid = check_grid(grid_thw, merge)
    return grid.prod(axis=1) // (merge * merge)


def vision_positions(grid_thw: np.ndarray, merge: int) -> np.ndarray:
    """(row, col) [N, 2] of every patch in the processor's merge-window order, each frame from (0, 0)."""
    out = []
    for t, h, w in check_grid(grid_thw, merge).tolist():
        # index order (block row, block col, row in block, col in block)
        block_row, block_col, in_row, in_col = np.meshgrid(
            np.arange(h // merge), np.arange(w // merge), np.arange(merge), np.arange(merge), indexing="ij")
        frame = np.stack(((block_row * merge + in_row).ravel(), (block_col * merge + in_col).ravel()), axis=1)
        out.append(np.tile(frame, (t, 1)))
    return np.concatenate(out)


def frame_bounds(grid_thw: np.ndarray, merge: int) -> np.ndarray:
    """Segment bounds (HF's cu_seqlens) of full attention: one segment per frame of each image."""
    grid = check_grid(grid_thw, merge)
    return np.concatenate(([0], np.cumsum(np.repeat(grid[:, 1] * grid[:, 2], grid[:, 0]))))


def window_order(grid_thw: np.ndarray, merge: int, window_units: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, bounds) of window attention.

    ``order`` [N / merge^2] lists the merged tokens window by window (windows row-major over each frame,
    frames and images in turn; tokens row-major within a window; the last row and column of windows may
    be partial); ``bounds`` are the windows' segment bounds in patches of the reordered sequence.
    """
    orders, sizes, offset = [], [], 0
    for t, h, w in check_grid(grid_thw, merge).tolist():
        rows, cols = h // merge, w // merge
        across = -(-cols // window_units)  # windows per row of windows
        down = -(-rows // window_units)
        frame, row, col = (a.ravel() for a in np.meshgrid(np.arange(t), np.arange(rows), np.arange(cols), indexing="ij"))
        window = (frame * down + row // window_units) * across + col // window_units
        orders.append(offset + np.lexsort((col, row, window)))
        sizes.append(np.bincount(window, minlength=t * down * across))
        offset += t * rows * cols
    patches_per_window = np.concatenate(sizes) * merge * merge
    return np.concatenate(orders), np.concatenate(([0], np.cumsum(patches_per_window)))


@dataclass(frozen=True)
class VisionLayout:
    """Where each patch sits in the tower's sequence, from ``grid_thw`` alone (host-side index arithmetic
    that any implementation of the tower shares).

    The sequence is the processor's patch order, or for a windowed tower (qwen2_5_vl) that order regrouped
    window by window, whole merged tokens at a time (``rows``: patch permutation, ``order``: the merged-token
    permutation it comes from).
    """

    grid: np.ndarray  # [images, 3] int64
    positions: np.ndarray  # [N, 2] (row, col) of each patch of the sequence
    frames: np.ndarray  # segment bounds of full attention (one per frame)
    windows: np.ndarray  # segment bounds of window attention (``frames`` for a tower without windows)
    rows: np.ndarray | None  # patch i of the sequence is input patch rows[i]; None: unpermuted
    order: np.ndarray | None  # merged token j of the sequence is output token order[j]; None: unpermuted

    @property
    def patches(self) -> int:
        return int(self.positions.shape[0])

    def bounds(self, config: VisionTowerConfig, block: int) -> np.ndarray:
        """The attention segments of ``block``."""
        return self.windows if config.windowed(block) else self.frames

    def sequence(self, patches: np.ndarray, config: VisionTowerConfig) -> np.ndarray:
        """``patches`` [N, patch_dim] (the processor's order) checked against the grid, as fp32 in sequence order."""
        patches = np.asarray(patches)
        if patches.ndim != 2 or patches.shape != (self.patches, config.patch_dim) or \
                not np.issubdtype(patches.dtype, np.floating):
            raise VisionInputError(f"patches must be a float [{self.patches}, {config.patch_dim}] array for grid_thw "
                                   f"{self.grid.tolist()}, got shape {patches.shape} dtype {patches.dtype}")
        return (patches if self.rows is None else patches[self.rows]).astype(np.float32)

    def restore(self, tokens: np.ndarray) -> np.ndarray:
        """Merged tokens of the sequence back in the images' order."""
        if self.order is None:
            return tokens
        out = np.empty_like(tokens)
        out[self.order] = tokens
        return out


def vision_layout(config: VisionTowerConfig, grid_thw: np.ndarray) -> VisionLayout:
    """The ``VisionLayout`` of images ``grid_thw`` in tower ``config`` (refuses a bad grid)."""
    merge = config.spatial_merge_size
    grid = check_grid(grid_thw, merge)
    positions, frames = vision_positions(grid, merge), frame_bounds(grid, merge)
    if not config.window_units:
        return VisionLayout(grid, positions, frames, frames, None, None)
    order, windows = window_order(grid, merge, config.window_units)
    rows = (order[:, None] * config.merge_unit + np.arange(config.merge_unit)).ravel()
    return VisionLayout(grid, positions[rows], frames, windows, rows, order)
