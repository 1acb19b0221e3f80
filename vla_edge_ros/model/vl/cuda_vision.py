"""The Qwen2-VL / Qwen2.5-VL vision tower on the GPU: ``vision.VisionTower``'s forward pass as kernels.

The host only lays the batch out (``vision.VisionLayout``: rotary positions, attention segments, the
window order) and uploads it with the patches; every step then runs on the device:

1. patch embedding: ``linear`` with the Conv3d kernel read as an [embed, patch_dim] matrix;
2. each block: ``layernorm`` (qwen2_vl) or ``rmsnorm`` (qwen2_5_vl); q, k, v as three ``linear`` over row
   slices of the fused qkv weight; 2-D rotary by ``rope_axes`` (row ids turn the first D/4 pairs, column
   ids the last D/4, both with the D/4 axial frequencies); ``segment_attention`` within frames or windows;
   the output projection and the residual add; then the MLP: fc1, ``quick_gelu``, fc2 (qwen2_vl) or the
   fused gate/up, ``swiglu``, down, with biases (qwen2_5_vl);
3. the merger: the norm, each token's merge_unit patches side by side (a reshape: they are consecutive
   rows), Linear, exact ``gelu``, Linear; with windows, ``embedding_gather`` puts the tokens back into
   image order.

Matrices are held in ``checkpoint.weights`` (``cuda_weights``; the Conv3d patch kernel, not a 2-D matrix
in the checkpoint, keeps its storage precision as the numpy tower keeps it fp32); activations are fp32. Buffers
are kept for the largest batch seen, so frames of a fixed size allocate nothing after the first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import cuda

from ... import kernels
from ...numerics import ops
from ..checkpoint import Checkpoint, CheckpointError
from ..cuda_weights import device_matrix, device_vector
from .config import VisionTowerConfig
from .vision_layout import vision_layout


@dataclass
class _Block:
    """One ViT block on the device; norm biases are None for RMSNorm (qwen2_5_vl)."""

    norm1: object
    norm1_bias: object | None
    qkv: tuple[object, object, object]  # q, k, v weights: row slices of the fused [3E, E] matrix
    qkv_bias: tuple[object, object, object]
    proj: object
    proj_bias: object
    norm2: object
    norm2_bias: object | None
    up: object  # qwen2_vl: fc1 [M, E]; qwen2_5_vl: gate and up fused [2M, E]
    up_bias: object
    down: object
    down_bias: object


class _Workspace:
    """fp32 activation buffers for up to ``patches`` patches; views of the first rows are used."""

    def __init__(self, config: VisionTowerConfig, patches: int) -> None:
        c, f32 = config, np.float32
        swiglu = c.family == "qwen2_5_vl"
        self.patches = patches
        self.x, self.h, self.tmp = (cuda.device_array((patches, c.embed_dim), f32) for _ in range(3))
        self.q, self.k, self.v, self.attn = (cuda.device_array((patches, c.embed_dim), f32) for _ in range(4))
        self.up = cuda.device_array((patches, 2 * c.mlp_dim if swiglu else c.mlp_dim), f32)  # QuickGELU in place
        self.act = cuda.device_array((patches, c.mlp_dim), f32) if swiglu else None
        tokens = patches // c.merge_unit
        self.merged = cuda.device_array((tokens, c.merged_dim), f32)
        self.tokens = cuda.device_array((tokens, c.out_hidden_size), f32)
        self.out = cuda.device_array((tokens, c.out_hidden_size), f32)


class CudaVisionTower:
    """A checkpoint's ViT on the device; ``encode`` maps patches to decoder-width tokens like ``VisionTower``."""

    def __init__(self, config: VisionTowerConfig, checkpoint: Checkpoint) -> None:
        """Upload the ``visual.*`` tensors of ``checkpoint`` (named as ``checkpoint.vl_shapes`` names them)."""
        self.config = c = config
        if c.head_dim > kernels.MAX_HEAD_DIM:
            raise ValueError(
                f"the cuda vision tower supports head_dim <= {kernels.MAX_HEAD_DIM}, this one has {c.head_dim}")
        t = checkpoint.tensors
        self._fmt = {"fmt": checkpoint.weights, "group": checkpoint.weights_group}
        self.layer_norm = c.family == "qwen2_vl"
        self.patch_embed = device_matrix(t["visual.patch_embed.proj.weight"], shape=(c.embed_dim, c.patch_dim))
        self.blocks = [self._block(t, f"visual.blocks.{index}.") for index in range(c.depth)]
        self.merger_norm = device_vector(t["visual.merger.ln_q.weight"])
        self.merger_norm_bias = device_vector(t["visual.merger.ln_q.bias"]) if self.layer_norm else None
        self.merger_fc1, self.merger_fc1_bias = device_matrix(t["visual.merger.mlp.0.weight"], **self._fmt), \
            device_vector(t["visual.merger.mlp.0.bias"])
        self.merger_fc2, self.merger_fc2_bias = device_matrix(t["visual.merger.mlp.2.weight"], **self._fmt), \
            device_vector(t["visual.merger.mlp.2.bias"])
        quarter = c.head_dim // 4  # each of row and column turns D/4 pairs with the same D/4 frequencies
        axial = ops.rope_inv_freq(c.head_dim // 2, c.rope_theta)
        self.inv_freq = cuda.to_device(np.concatenate((axial, axial)))
        self.pair_axis = cuda.to_device(kernels.pair_axes((quarter, quarter)))
        self.scale = float(1.0 / np.sqrt(c.head_dim))
        self.workspace: _Workspace | None = None

    def _block(self, t: dict, p: str) -> _Block:
        c = self.config
        e = c.embed_dim
        qkv_weight = device_matrix(t[p + "attn.qkv.weight"], **self._fmt)
        qkv_bias = device_vector(t[p + "attn.qkv.bias"])
        if self.layer_norm:
            up, up_bias = device_matrix(t[p + "mlp.fc1.weight"], **self._fmt), device_vector(t[p + "mlp.fc1.bias"])
            down = "mlp.fc2."
        else:
            up = device_matrix(t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"], **self._fmt)
            up_bias = device_vector(t[p + "mlp.gate_proj.bias"], t[p + "mlp.up_proj.bias"])
            down = "mlp.down_proj."
        norm_bias = (lambda name: device_vector(t[p + name + ".bias"])) if self.layer_norm else (lambda name: None)
        thirds = [slice(i * e, (i + 1) * e) for i in range(3)]
        return _Block(
            norm1=device_vector(t[p + "norm1.weight"]), norm1_bias=norm_bias("norm1"),
            qkv=tuple(qkv_weight[s] for s in thirds), qkv_bias=tuple(qkv_bias[s] for s in thirds),
            proj=device_matrix(t[p + "attn.proj.weight"], **self._fmt),
            proj_bias=device_vector(t[p + "attn.proj.bias"]),
            norm2=device_vector(t[p + "norm2.weight"]), norm2_bias=norm_bias("norm2"),
            up=up, up_bias=up_bias,
            down=device_matrix(t[p + down + "weight"], **self._fmt), down_bias=device_vector(t[p + down + "bias"]),
        )

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> "CudaVisionTower":
        vl = checkpoint.config.vl
        if vl is None:
            raise CheckpointError(f"{checkpoint.path}: not a Qwen2-VL / Qwen2.5-VL checkpoint (no vision tower)")
        return cls(vl.vision, checkpoint)

    def _buffers(self, patches: int) -> _Workspace:
        if self.workspace is None or self.workspace.patches < patches:
            self.workspace = _Workspace(self.config, patches)
        return self.workspace

    def _norm(self, x, weight, bias, out) -> None:
        if self.layer_norm:
            kernels.layernorm(x, weight, bias, self.config.eps, out)
        else:
            kernels.rmsnorm(x, weight, self.config.eps, out)

    def _mlp(self, h, block: _Block, ws: _Workspace, total: int, out) -> None:
        up = ws.up[:total]
        kernels.linear(h, block.up, block.up_bias, up)
        if self.layer_norm:
            kernels.quick_gelu(up, up)
            hidden = up
        else:
            hidden = ws.act[:total]
            kernels.swiglu(up, hidden)
        kernels.linear(hidden, block.down, block.down_bias, out)

    def encode(self, patches: np.ndarray, grid_thw: np.ndarray) -> np.ndarray:
        """[N / merge^2, decoder hidden] fp32 tokens of the images ``grid_thw`` whose patches are ``patches``
        [N, C*T*P*P] (HF's pixel_values and image_grid_thw); images follow each other in both."""
        c = self.config
        layout = vision_layout(c, grid_thw)
        sequence = layout.sequence(patches, c)
        total = layout.patches
        ws = self._buffers(total)
        x, h, tmp = ws.x[:total], ws.h[:total], ws.tmp[:total]
        q, k, v, attn = ws.q[:total], ws.k[:total], ws.v[:total], ws.attn[:total]
        heads = (total, c.num_heads, c.head_dim)
        q_heads, k_heads, v_heads, attn_heads = (a.reshape(*heads) for a in (q, k, v, attn))
        ids = cuda.to_device(np.ascontiguousarray(layout.positions.T, dtype=np.int32))  # [2, N]: rows, cols
        frames = cuda.to_device(layout.frames.astype(np.int32))
        windows = cuda.to_device(layout.windows.astype(np.int32))

        kernels.linear(cuda.to_device(sequence), self.patch_embed, None, x)
        for index, block in enumerate(self.blocks):
            self._norm(x, block.norm1, block.norm1_bias, h)
            for weight, bias, out in zip(block.qkv, block.qkv_bias, (q, k, v)):
                kernels.linear(h, weight, bias, out)
            kernels.rope_axes(q_heads, ids, self.pair_axis, self.inv_freq)
            kernels.rope_axes(k_heads, ids, self.pair_axis, self.inv_freq)
            bounds = windows if c.windowed(index) else frames
            kernels.segment_attention(q_heads, k_heads, v_heads, bounds, self.scale, attn_heads)
            kernels.linear(attn, block.proj, block.proj_bias, tmp)
            kernels.add_inplace(x, tmp)
            self._norm(x, block.norm2, block.norm2_bias, h)
            self._mlp(h, block, ws, total, tmp)
            kernels.add_inplace(x, tmp)

        count = total // c.merge_unit
        self._norm(x, self.merger_norm, self.merger_norm_bias, h)
        merged, tokens = ws.merged[:count], ws.tokens[:count]
        kernels.linear(h.reshape(count, c.merged_dim), self.merger_fc1, self.merger_fc1_bias, merged)
        kernels.gelu(merged, merged)
        kernels.linear(merged, self.merger_fc2, self.merger_fc2_bias, tokens)
        if layout.order is None:
            return tokens.copy_to_host()
        out = ws.out[:count]
        source = np.empty(count, np.int32)
        source[layout.order] = np.arange(count, dtype=np.int32)  # output token j is sequence token source[j]
        kernels.embedding_gather(tokens, cuda.to_device(source), out)
        return out.copy_to_host()

    def state_bytes(self) -> int:
        """Bytes of weights this tower holds on the device."""
        arrays = [self.patch_embed, self.merger_norm, self.merger_norm_bias, self.merger_fc1, self.merger_fc1_bias,
                  self.merger_fc2, self.merger_fc2_bias]
        for block in self.blocks:
            for value in vars(block).values():
                arrays += list(value) if isinstance(value, tuple) else [value]  # q, k, v: slices of one upload
        return sum(a.nbytes for a in arrays if a is not None)
