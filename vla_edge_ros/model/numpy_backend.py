"""The reference backend: the whole decoder in NumPy fp32, runnable anywhere.

Weights are widened to fp32 once at load; q/k/v and gate/up are fused into one matrix each so a
layer costs four BLAS calls. Attention scans only the valid part of the arena.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..numerics import ops
from .arena import KVArena
from .backend import Backend, ForwardResult
from .checkpoint import Checkpoint


@dataclass
class _Layer:
    """One decoder layer's weights, stored [in, out] so prefill matmuls run at full BLAS speed."""

    input_norm: np.ndarray
    qkv_t: np.ndarray  # [H, q_dim + 2 kv_dim]
    qkv_bias: np.ndarray
    o_t: np.ndarray  # [q_dim, H]
    post_norm: np.ndarray
    gate_up_t: np.ndarray  # [H, 2 I]
    down_t: np.ndarray  # [I, H]


def _transposed(*weights: np.ndarray) -> np.ndarray:
    """[out, in] HF weights, concatenated along out, as one contiguous [in, out] matrix."""
    return np.ascontiguousarray(np.concatenate(weights).T)


class NumpyBackend(Backend):
    name = "numpy"

    def __init__(self, checkpoint: Checkpoint, arena: KVArena) -> None:
        super().__init__(checkpoint, arena)
        c = self.config
        f32 = checkpoint.float32
        self.embed = f32("model.embed_tokens.weight")
        self.lm_head = self.embed if c.tie_word_embeddings else f32("lm_head.weight")
        self.final_norm = f32("model.norm.weight")
        self.layers = []
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            attn = p + "self_attn."
            self.layers.append(_Layer(
                input_norm=f32(p + "input_layernorm.weight"),
                qkv_t=_transposed(*(f32(attn + f"{n}_proj.weight") for n in "qkv")),
                qkv_bias=np.concatenate([f32(attn + f"{n}_proj.bias") for n in "qkv"]),
                o_t=_transposed(f32(attn + "o_proj.weight")),
                post_norm=f32(p + "post_attention_layernorm.weight"),
                gate_up_t=_transposed(f32(p + "mlp.gate_proj.weight"), f32(p + "mlp.up_proj.weight")),
                down_t=_transposed(f32(p + "mlp.down_proj.weight")),
            ))
        shape = (c.num_hidden_layers, c.num_key_value_heads, arena.capacity, c.head_dim)
        self.k_cache = np.zeros(shape, dtype=np.float32)
        self.v_cache = np.zeros(shape, dtype=np.float32)
        self.inv_freq = ops.rope_inv_freq(c.head_dim, c.rope_theta)
        self.scale = 1.0 / np.sqrt(c.head_dim)

    def forward(self, positions: np.ndarray, slots: np.ndarray, *, token_ids: np.ndarray | None = None,
                embeddings: np.ndarray | None = None, collect_layers: bool = False,
                collect_attention: bool = False) -> ForwardResult:
        token_ids, embeddings = self._inputs(token_ids, embeddings)
        c = self.config
        positions = np.asarray(positions, dtype=np.int32)
        slots = np.asarray(slots, dtype=np.int32)
        x = self.embed[token_ids] if token_ids is not None else embeddings.copy()
        tokens = x.shape[0]
        cos, sin = ops.rope_cos_sin(positions, self.inv_freq)
        self.arena.commit(slots, positions)
        span = self.arena.span()
        visible = self.arena.visible(positions, span)
        per_head = self.arena.head_valid is not None
        bias = None if per_head else ops.attention_bias(visible)
        q_end, k_end = c.q_dim, c.q_dim + c.kv_dim
        layer_hidden = [x.copy()] if collect_layers else None
        attention = np.zeros((len(self.layers), c.num_attention_heads, self.arena.capacity), np.float32) \
            if collect_attention else None
        for index, layer in enumerate(self.layers):
            if per_head:  # each KV head reads the slots it still keeps
                bias = ops.attention_bias(self.arena.visible_per_head(index, visible, span))
            h = ops.rms_norm(x, layer.input_norm, c.rms_norm_eps)
            qkv = h @ layer.qkv_t + layer.qkv_bias
            q = ops.apply_rope(qkv[:, :q_end].reshape(tokens, c.num_attention_heads, c.head_dim), cos, sin)
            k = ops.apply_rope(qkv[:, q_end:k_end].reshape(tokens, c.num_key_value_heads, c.head_dim), cos, sin)
            self.k_cache[index][:, slots] = k.transpose(1, 0, 2)
            self.v_cache[index][:, slots] = qkv[:, k_end:].reshape(tokens, c.num_key_value_heads, c.head_dim).transpose(1, 0, 2)
            attn = ops.gqa_attention(q, self.k_cache[index][:, span], self.v_cache[index][:, span], bias, self.scale)
            if attention is not None:
                attention[index, :, span] = ops.attention_weights(q[-1], self.k_cache[index][:, span], bias[..., -1, :],
                                                                  self.scale)
            x += attn @ layer.o_t
            h = ops.rms_norm(x, layer.post_norm, c.rms_norm_eps)
            gate_up = h @ layer.gate_up_t
            x += (ops.silu(gate_up[:, :c.intermediate_size]) * gate_up[:, c.intermediate_size:]) @ layer.down_t
            if layer_hidden is not None:
                layer_hidden.append(x.copy())
        return ForwardResult(ops.rms_norm(x, self.final_norm, c.rms_norm_eps), layer_hidden, attention)

    def logits(self, hidden: np.ndarray, rows: slice = slice(None)) -> np.ndarray:
        return hidden @ self.lm_head[rows].T

    def greedy(self, hidden: np.ndarray, rows: slice = slice(None)) -> int:
        return int(np.argmax(self.lm_head[rows] @ hidden))

    def rotate_keys(self, slots: np.ndarray, shifts: np.ndarray) -> None:
        cos, sin = ops.rope_cos_sin(np.asarray(shifts, dtype=np.int32), self.inv_freq)
        for layer_cache in self.k_cache:
            layer_cache[:, slots] = ops.apply_rope(layer_cache[:, slots].transpose(1, 0, 2), cos, sin).transpose(1, 0, 2)

    def read_kv(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.k_cache[:, :, slots].copy(), self.v_cache[:, :, slots].copy()

    def write_kv(self, slots: np.ndarray, keys: np.ndarray, values: np.ndarray) -> None:
        self.k_cache[:, :, slots] = keys
        self.v_cache[:, :, slots] = values

    def state_bytes(self) -> tuple[int, int]:
        arrays = [self.embed, self.final_norm] + ([] if self.lm_head is self.embed else [self.lm_head])
        arrays += [a for layer in self.layers for a in vars(layer).values()]
        return sum(a.nbytes for a in arrays), self.k_cache.nbytes + self.v_cache.nbytes
