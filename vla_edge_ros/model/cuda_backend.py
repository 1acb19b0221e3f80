"""The GPU backend: the same decoder as ``numpy_backend``, as a sequence of Numba-CUDA kernels.

Weight matrices are held in ``checkpoint.weights`` (int4 keeps the token tables in int8): ``auto`` keeps the
checkpoint's precision (fp16, or bf16 kept as its uint16 bits), the others pack them (``cuda_weights``: bf16,
int8, int4, the numpy backend's values); the kernels widen or dequantize them as they read. Activations, accumulation and the KV arena are
fp32. Keys and values live in one pool of pages on the device (``model/pages.py``); the attention kernel
reads each KV head's entries through its block table, uploaded with the lengths and entry slots every
forward. No cuBLAS, no torch. Activation buffers are allocated once for the largest forward seen and reused,
so a decode step allocates nothing. Under ``NUMBA_ENABLE_CUDASIM=1`` the same code runs on the CPU (slowly),
which is how the tests prove it without a GPU. A VL checkpoint's M-RoPE (``rope_positions``) rotates with
``rope_axes``; its cached keys move with the same 1-D ``rope_cache_shift`` as text
(``Backend.rotate_keys``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import cuda

from .. import kernels
from ..numerics import ops
from ..numerics.finite import NonFiniteError
from .arena import KVArena
from .backend import Backend, ForwardResult
from .checkpoint import MLP_HEAD, Checkpoint
from .cuda_weights import device_matrix, device_vector


@dataclass
class _Layer:
    input_norm: object
    q_weight: object
    q_bias: object
    k_weight: object
    k_bias: object
    v_weight: object
    v_bias: object
    o_weight: object
    post_norm: object
    gate_up_weight: object  # gate and up fused: [2 I, H]
    down_weight: object


def _matrix(checkpoint: Checkpoint, *names: str) -> kernels.DeviceWeight:
    """Upload weight matrices in their format (``Checkpoint.format_of``; ``auto`` keeps the stored precision, fp16
    too), fused along the output dim when several."""
    fmt = "auto" if checkpoint.weights == "auto" else checkpoint.format_of(*names)
    return device_matrix(*(checkpoint.tensors[name] for name in names), fmt=fmt, group=checkpoint.weights_group)


def _vector(checkpoint: Checkpoint, name: str):
    """Norm weights and biases go up as fp32: exact and tiny."""
    return device_vector(checkpoint.tensors[name])


def _layer(checkpoint: Checkpoint, p: str) -> _Layer:
    attn = p + "self_attn."
    return _Layer(
        input_norm=_vector(checkpoint, p + "input_layernorm.weight"),
        q_weight=_matrix(checkpoint, attn + "q_proj.weight"), q_bias=_vector(checkpoint, attn + "q_proj.bias"),
        k_weight=_matrix(checkpoint, attn + "k_proj.weight"), k_bias=_vector(checkpoint, attn + "k_proj.bias"),
        v_weight=_matrix(checkpoint, attn + "v_proj.weight"), v_bias=_vector(checkpoint, attn + "v_proj.bias"),
        o_weight=_matrix(checkpoint, attn + "o_proj.weight"),
        post_norm=_vector(checkpoint, p + "post_attention_layernorm.weight"),
        gate_up_weight=_matrix(checkpoint, p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
        down_weight=_matrix(checkpoint, p + "mlp.down_proj.weight"),
    )


class _MlpHead:
    """The mlp action head on the device: fc1 and fc2 as stored (``Checkpoint.held_bytes``), biases fp32, and its
    two activation rows, allocated once."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        fc1, b1, fc2, b2 = MLP_HEAD
        self.fc1, self.fc2 = device_matrix(checkpoint.tensors[fc1]), device_matrix(checkpoint.tensors[fc2])
        self.b1, self.b2 = _vector(checkpoint, b1), _vector(checkpoint, b2)
        self.inner = cuda.device_array((1, checkpoint.tensors[fc1].shape[0]), np.float32)
        self.out = cuda.device_array((1, checkpoint.tensors[fc2].shape[0]), np.float32)


class _Workspace:
    """Activation buffers for up to ``tokens`` new tokens; views of the first T rows are used."""

    def __init__(self, backend: "CudaBackend", tokens: int) -> None:
        c = backend.config
        f32 = np.float32
        self.tokens = tokens
        self.x = cuda.device_array((tokens, c.hidden_size), f32)
        self.h = cuda.device_array((tokens, c.hidden_size), f32)
        self.tmp = cuda.device_array((tokens, c.hidden_size), f32)
        self.q = cuda.device_array((tokens, c.q_dim), f32)
        self.k = cuda.device_array((tokens, c.kv_dim), f32)
        self.v = cuda.device_array((tokens, c.kv_dim), f32)
        self.attn = cuda.device_array((tokens, c.q_dim), f32)
        self.gate_up = cuda.device_array((tokens, 2 * c.intermediate_size), f32)
        self.act = cuda.device_array((tokens, c.intermediate_size), f32)


class CudaBackend(Backend):
    name = "cuda"

    def __init__(self, checkpoint: Checkpoint, arena: KVArena) -> None:
        super().__init__(checkpoint, arena)
        c = self.config
        if c.head_dim > kernels.MAX_HEAD_DIM:
            raise ValueError(f"the cuda backend supports head_dim <= {kernels.MAX_HEAD_DIM}, this model has {c.head_dim}")
        self.embed = _matrix(checkpoint, "model.embed_tokens.weight")
        self.lm_head = self.embed if c.tie_word_embeddings else _matrix(checkpoint, "lm_head.weight")
        self.final_norm = _vector(checkpoint, "model.norm.weight")
        self.layers = [_layer(checkpoint, f"model.layers.{i}.") for i in range(c.num_hidden_layers)]
        shape = (arena.pages.num_pages, arena.page_tokens, c.head_dim)
        self.k_pool = cuda.to_device(np.zeros(shape, np.float32))
        self.v_pool = cuda.to_device(np.zeros(shape, np.float32))
        self.k_rows = self.k_pool.reshape(shape[0] * shape[1], c.head_dim)  # the same memory, row by row
        self.v_rows = self.v_pool.reshape(shape[0] * shape[1], c.head_dim)
        self._iota = cuda.to_device(np.arange(1, dtype=np.int32))
        self.inv_freq = cuda.to_device(ops.rope_inv_freq(c.head_dim, c.rope_theta))
        # M-RoPE: which of the temporal, height and width ids each rotated pair reads (VL models only)
        self.mrope_axis = cuda.to_device(kernels.pair_axes(self.mrope_section)) if self.mrope_section else None
        self.scale = float(1.0 / np.sqrt(c.head_dim))
        self.scratch = kernels.AttentionScratch()
        self.workspace: _Workspace | None = None
        self.head: _MlpHead | None = _MlpHead(checkpoint) if c.action.head == "mlp" else None

    def _buffers(self, tokens: int) -> _Workspace:
        if self.workspace is None or self.workspace.tokens < tokens:
            self.workspace = _Workspace(self, tokens)
        return self.workspace

    def forward(self, positions: np.ndarray, slots: np.ndarray, *, token_ids: np.ndarray | None = None,
                embeddings: np.ndarray | None = None, collect_layers: bool = False,
                rope_positions: np.ndarray | None = None) -> ForwardResult:
        token_ids, embeddings = self._inputs(token_ids, embeddings)
        c = self.config
        positions = np.ascontiguousarray(positions, dtype=np.int32)
        slots = np.ascontiguousarray(slots, dtype=np.int32)
        tokens = positions.size
        rope_ids = self._rope_ids(rope_positions, tokens)
        ws = self._buffers(tokens)
        x, h, tmp = ws.x[:tokens], ws.h[:tokens], ws.tmp[:tokens]
        q, k, v = ws.q[:tokens], ws.k[:tokens], ws.v[:tokens]
        attn, gate_up, act = ws.attn[:tokens], ws.gate_up[:tokens], ws.act[:tokens]
        q_heads = q.reshape(tokens, c.num_attention_heads, c.head_dim)
        k_heads = k.reshape(tokens, c.num_key_value_heads, c.head_dim)
        attn_heads = attn.reshape(tokens, c.num_attention_heads, c.head_dim)

        if token_ids is not None:
            kernels.embedding_gather(self.embed, cuda.to_device(token_ids), x)
        else:
            x.copy_to_device(np.ascontiguousarray(embeddings))
        positions_dev = cuda.to_device(positions)
        rope_ids_dev = None if rope_ids is None else cuda.to_device(np.ascontiguousarray(rope_ids))
        self.arena.commit(slots, positions, rope_ids)
        table = self.arena.pages
        new_rows = cuda.to_device(np.ascontiguousarray(table.rows(slots).transpose(0, 2, 1), dtype=np.int32))
        block_table, lengths = cuda.to_device(table.block_table), cuda.to_device(table.lengths)
        entry_slot, slot_pos = cuda.to_device(table.entry_slot), cuda.to_device(self.arena.positions)
        new_kv = tokens * c.num_key_value_heads
        k_new, v_new = k.reshape(new_kv, c.head_dim), v.reshape(new_kv, c.head_dim)
        layer_hidden = [x.copy_to_host()] if collect_layers else None
        for index, layer in enumerate(self.layers):
            kernels.rmsnorm(x, layer.input_norm, c.rms_norm_eps, h)
            kernels.linear(h, layer.q_weight, layer.q_bias, q)
            kernels.linear(h, layer.k_weight, layer.k_bias, k)
            kernels.linear(h, layer.v_weight, layer.v_bias, v)
            self._rotate(q_heads, positions_dev, rope_ids_dev)
            self._rotate(k_heads, positions_dev, rope_ids_dev)
            kernels.copy_rows(k_new, v_new, self._indices(new_kv), self.k_rows, self.v_rows,
                              new_rows[index].reshape(new_kv))
            kernels.attention(q_heads, self.k_pool, self.v_pool, block_table[index], lengths[index], entry_slot,
                              slot_pos, positions_dev, self.scale, attn_heads, scratch=self.scratch)
            kernels.linear(attn, layer.o_weight, None, tmp)
            kernels.add_inplace(x, tmp)
            kernels.rmsnorm(x, layer.post_norm, c.rms_norm_eps, h)
            kernels.linear(h, layer.gate_up_weight, None, gate_up)
            kernels.swiglu(gate_up, act)
            kernels.linear(act, layer.down_weight, None, tmp)
            kernels.add_inplace(x, tmp)
            if layer_hidden is not None:
                layer_hidden.append(x.copy_to_host())
        kernels.rmsnorm(x, self.final_norm, c.rms_norm_eps, h)
        return ForwardResult(h.copy_to_host(), layer_hidden)

    def _rotate(self, heads, positions, rope_ids) -> None:
        """RoPE by ``positions``, or M-RoPE by the [3, T] ``rope_ids`` banded by ``mrope_section``."""
        if rope_ids is None:
            kernels.rope(heads, positions, self.inv_freq)
        else:
            kernels.rope_axes(heads, rope_ids, self.mrope_axis, self.inv_freq)

    def _logits_device(self, hidden: np.ndarray, rows: slice):
        hidden = cuda.to_device(np.ascontiguousarray(np.atleast_2d(hidden), dtype=np.float32))
        weight = self.lm_head[rows]
        out = cuda.device_array((hidden.shape[0], weight.shape[0]), np.float32)
        kernels.linear(hidden, weight, None, out)
        return out

    def logits(self, hidden: np.ndarray, rows: slice = slice(None)) -> np.ndarray:
        return self._logits_device(hidden, rows).copy_to_host()

    def greedy(self, hidden: np.ndarray, rows: slice = slice(None)) -> int:
        index = kernels.argmax_rows(self._logits_device(hidden, rows)[0])
        if index == kernels.NO_TOKEN:
            raise NonFiniteError("the action logits: not finite (NaN or Inf)")
        return index

    def action_mlp(self, hidden: np.ndarray) -> np.ndarray:
        """Two ``linear`` launches and a ``gelu`` between them: the kernels the decoder and the VL towers run."""
        if self.head is None:
            raise self._no_mlp_head()
        head = self.head
        kernels.linear(cuda.to_device(np.ascontiguousarray(hidden, dtype=np.float32).reshape(1, -1)), head.fc1,
                       head.b1, head.inner)
        kernels.gelu(head.inner, head.inner)
        kernels.linear(head.inner, head.fc2, head.b2, head.out)
        return head.out.copy_to_host()[0]

    def _indices(self, count: int):
        """Device 0..count-1 (int32): the rows of a packed source or destination."""
        if self._iota.size < count:
            self._iota = cuda.to_device(np.arange(count, dtype=np.int32))
        return self._iota[:count]

    def rotate_keys(self, slots: np.ndarray, shifts: np.ndarray) -> None:
        rows = self.arena.pages.rows(slots)  # [layers, kv_heads, n]
        held = rows >= 0
        shifts = np.broadcast_to(np.asarray(shifts, dtype=np.int32), rows.shape)[held]
        if shifts.size:
            kernels.rope_cache_shift(self.k_rows.reshape(1, *self.k_rows.shape),
                                     cuda.to_device(rows[held].astype(np.int32)),
                                     cuda.to_device(np.ascontiguousarray(shifts)), self.inv_freq)

    def read_rows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        count, dim = len(rows), self.config.head_dim
        keys, values = cuda.device_array((count, dim), np.float32), cuda.device_array((count, dim), np.float32)
        if count:
            kernels.copy_rows(self.k_rows, self.v_rows, cuda.to_device(np.asarray(rows, dtype=np.int32)), keys, values,
                              self._indices(count))
        return keys.copy_to_host(), values.copy_to_host()

    def write_rows(self, rows: np.ndarray, keys: np.ndarray, values: np.ndarray) -> None:
        if len(rows):
            kernels.copy_rows(cuda.to_device(np.ascontiguousarray(keys, dtype=np.float32)),
                              cuda.to_device(np.ascontiguousarray(values, dtype=np.float32)), self._indices(len(rows)),
                              self.k_rows, self.v_rows, cuda.to_device(np.asarray(rows, dtype=np.int32)))

    def move_rows(self, sources: np.ndarray, destinations: np.ndarray) -> None:
        kernels.copy_rows(self.k_rows, self.v_rows, cuda.to_device(np.asarray(sources, dtype=np.int32)),
                          self.k_rows, self.v_rows, cuda.to_device(np.asarray(destinations, dtype=np.int32)))

    def state_bytes(self) -> tuple[int, int]:
        arrays = [self.embed, self.final_norm] + ([] if self.lm_head is self.embed else [self.lm_head])
        arrays += [a for layer in self.layers for a in vars(layer).values()]
        arrays += [] if self.head is None else [self.head.fc1, self.head.b1, self.head.fc2, self.head.b2]
        return sum(a.nbytes for a in arrays), self.k_pool.nbytes + self.v_pool.nbytes
