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
``vision_layout.py``, so another implementation of the tower (the CUDA kernels) shares it;
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
from .vision_layout import VisionLayout, vision_layout


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
