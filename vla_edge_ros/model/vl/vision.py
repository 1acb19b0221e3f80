"""The Qwen2-VL / Qwen2.5-VL vision tower in NumPy (fp32 math): patches -> decoder-width image tokens.

Input is what HF's ``Qwen2VLImageProcessor`` emits: ``pixel_values`` [N, C*T*P*P] (each row one patch,
channels x frames x rows x cols) and ``image_grid_thw`` [(t, h, w), ...] in patches. The processor
already orders each frame's patches merge-window by merge-window (row of 2x2 blocks, column of block,
row in block, column in block), so every run of ``spatial_merge_size ** 2`` rows is one decoder token.

The forward pass:

1. patch embedding: a Conv3d whose stride is its kernel, i.e. one GEMM with the flattened kernel;
2. ``depth`` pre-norm blocks; attention is non-causal, rotated by 2-D rotary embeddings (a patch's row
   turns the first quarter of each half of a head, its column the second) and confined to one frame
   (qwen2_vl, and qwen2_5_vl's ``fullatt_block_indexes``) or to one window of
   ``window_units`` x ``window_units`` merged tokens (qwen2_5_vl's other blocks). For windows, the
   sequence is reordered once, whole merged tokens at a time, so that each window is a contiguous run;
   frames stay contiguous under that order, so full-attention blocks run on it too;
3. the merger: norm, each token's ``merge_unit`` patches side by side, Linear -> exact GELU -> Linear;
   then the window order is undone.

qwen2_vl uses LayerNorm and a QuickGELU MLP; qwen2_5_vl RMSNorm and a SwiGLU MLP with biases.

The index arithmetic (positions, segment bounds, window order) depends on the grid alone and lives in
``VisionLayout`` (``vision_layout``), so another implementation of the tower (the CUDA kernels) shares it;
``VisionTower``'s stages (``embed``, ``rotary``, ``block``, ``merge``) are each a reference for one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...cpu_kernels import linear
from ...numerics import ops
from ...numerics.weight_formats import PackedMatrix, pack
from ..checkpoint import Checkpoint, CheckpointError
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


@dataclass
class _Block:
    """One ViT block: matrices [out, in] in the checkpoint's weight format; ``*_bias`` of the norms is None for
    RMSNorm (qwen2_5_vl)."""

    norm1: np.ndarray
    norm1_bias: np.ndarray | None
    qkv: PackedMatrix  # [3E, E]
    qkv_bias: np.ndarray
    proj: PackedMatrix  # [E, E]
    proj_bias: np.ndarray
    norm2: np.ndarray
    norm2_bias: np.ndarray | None
    up: PackedMatrix  # qwen2_vl: fc1 [M, E]; qwen2_5_vl: gate and up stacked [2M, E]
    up_bias: np.ndarray
    down: PackedMatrix  # [E, M]
    down_bias: np.ndarray


class VisionTower:
    """A checkpoint's ViT: matrices held in its ``weights`` format, the rest fp32; ``encode`` maps patches to
    decoder-width tokens."""

    def __init__(self, config: VisionTowerConfig, checkpoint: Checkpoint) -> None:
        """The tower ``config`` describes, over the ``visual.*`` tensors of ``checkpoint``."""
        self.config = c = config
        self.layer_norm = c.family == "qwen2_vl"
        f32, matrix = checkpoint.float32, checkpoint.matrix

        def optional(name: str) -> np.ndarray | None:
            return f32(name) if name in checkpoint.tensors else None

        self.patch = pack(f32("visual.patch_embed.proj.weight").reshape(c.embed_dim, c.patch_dim), "float32")
        self.blocks = []
        for index in range(c.depth):
            p = f"visual.blocks.{index}."
            if self.layer_norm:
                up, up_bias, down = matrix(p + "mlp.fc1.weight"), f32(p + "mlp.fc1.bias"), "mlp.fc2."
            else:
                up = matrix(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")
                up_bias = np.concatenate((f32(p + "mlp.gate_proj.bias"), f32(p + "mlp.up_proj.bias")))
                down = "mlp.down_proj."
            self.blocks.append(_Block(
                norm1=f32(p + "norm1.weight"), norm1_bias=optional(p + "norm1.bias"),
                qkv=matrix(p + "attn.qkv.weight"), qkv_bias=f32(p + "attn.qkv.bias"),
                proj=matrix(p + "attn.proj.weight"), proj_bias=f32(p + "attn.proj.bias"),
                norm2=f32(p + "norm2.weight"), norm2_bias=optional(p + "norm2.bias"),
                up=up, up_bias=up_bias, down=matrix(p + down + "weight"), down_bias=f32(p + down + "bias"),
            ))
        self.merger_norm = f32("visual.merger.ln_q.weight")
        self.merger_norm_bias = optional("visual.merger.ln_q.bias")
        self.merger_fc1, self.merger_fc1_bias = matrix("visual.merger.mlp.0.weight"), f32("visual.merger.mlp.0.bias")
        self.merger_fc2, self.merger_fc2_bias = matrix("visual.merger.mlp.2.weight"), f32("visual.merger.mlp.2.bias")
        self.inv_freq = ops.rope_inv_freq(c.head_dim // 2, c.rope_theta)
        self.scale = 1.0 / np.sqrt(c.head_dim)

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> "VisionTower":
        vl = checkpoint.config.vl
        if vl is None:
            raise CheckpointError(f"{checkpoint.path}: not a Qwen2-VL / Qwen2.5-VL checkpoint (no vision tower)")
        return cls(vl.vision, checkpoint)

    def _norm(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
        if self.layer_norm:
            return ops.layer_norm(x, weight, bias, self.config.eps)
        return ops.rms_norm(x, weight, self.config.eps)

    def _mlp(self, x: np.ndarray, block: _Block) -> np.ndarray:
        up = linear(x, block.up, block.up_bias)
        if self.layer_norm:
            hidden = ops.quick_gelu(up)
        else:
            gate, up = np.split(up, 2, axis=-1)
            hidden = ops.silu(gate) * up
        return linear(hidden, block.down, block.down_bias)

    def rotary(self, layout: VisionLayout) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin [N, head_dim / 2] of the sequence's 2-D rotary angles."""
        return ops.rope_cos_sin_2d(layout.positions[:, 0], layout.positions[:, 1], self.inv_freq)

    def embed(self, patches: np.ndarray, layout: VisionLayout) -> np.ndarray:
        """[N, embed_dim]: the patch embedding (Conv3d with stride = kernel, as one GEMM) in sequence order."""
        return linear(np.ascontiguousarray(layout.sequence(patches, self.config), dtype=np.float32), self.patch)

    def block(self, index: int, x: np.ndarray, cos: np.ndarray, sin: np.ndarray, bounds: np.ndarray) -> np.ndarray:
        """Block ``index`` applied to x [N, embed_dim] (updated in place and returned)."""
        c, block = self.config, self.blocks[index]
        h = self._norm(x, block.norm1, block.norm1_bias)
        qkv = linear(h, block.qkv, block.qkv_bias).reshape(x.shape[0], 3, c.num_heads, c.head_dim)
        q = ops.apply_rope(qkv[:, 0], cos, sin)
        k = ops.apply_rope(qkv[:, 1], cos, sin)
        x += linear(ops.segment_attention(q, k, qkv[:, 2], bounds, self.scale), block.proj, block.proj_bias)
        x += self._mlp(self._norm(x, block.norm2, block.norm2_bias), block)
        return x

    def merge(self, x: np.ndarray) -> np.ndarray:
        """[N / merge^2, out_hidden_size]: the merger (norm, merge_unit patches side by side, Linear -> GELU ->
        Linear), in sequence order."""
        c = self.config
        merged = self._norm(x, self.merger_norm, self.merger_norm_bias).reshape(-1, c.merged_dim)
        return linear(ops.gelu(linear(merged, self.merger_fc1, self.merger_fc1_bias)), self.merger_fc2, self.merger_fc2_bias)

    def encode(self, patches: np.ndarray, grid_thw: np.ndarray) -> np.ndarray:
        """[N / merge^2, decoder hidden] fp32 tokens of the images ``grid_thw`` whose patches are ``patches``
        [N, C*T*P*P] (HF's pixel_values and image_grid_thw); images follow each other in both."""
        layout = vision_layout(self.config, grid_thw)
        x = self.embed(patches, layout)
        cos, sin = self.rotary(layout)
        for index in range(self.config.depth):
            x = self.block(index, x, cos, sin, layout.bounds(self.config, index))
        return layout.restore(self.merge(x))
