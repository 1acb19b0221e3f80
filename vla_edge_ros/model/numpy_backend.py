"""The reference backend: the whole decoder in NumPy fp32, runnable anywhere.

Weight matrices are held in the checkpoint's ``weights`` format (``numerics/weight_formats.py``): fp32, the
reference, goes to BLAS; bf16, int8 and int4 go through the compiled kernels of ``cpu_kernels``, which read
the narrow weights and accumulate in fp32. q/k/v and gate/up are fused into one matrix each so a layer costs
four products. Keys and values live in a pool of pages (``model/pages.py``): the dense layout gives each KV
head one run of rows, the per-head layout the rows of its block table (only what each head holds).

Between the four products a layer makes a handful of compiled calls: its attention (RoPE, storing the new
keys and values, masked GQA attention) is one (``cpu_kernels.attention``), reading each head's pool rows
in place; each RMSNorm (the residual add before it included) and the SiLU gate are one
(``cpu_kernels.elementwise``). At a small model's size the same steps as some 40 NumPy calls cost more in
dispatch than in arithmetic: the shipped models/sim's frame cycle (``bench/bench_model.py``, one core)
went from 1.71-1.80 ms to 1.24-1.27, a decode step from 0.8 to 0.35 ms. Which rows each layer reads,
and the position of each entry, are found once a forward (dense: one set for every layer).

The NumPy steps stay as methods of their own (``rotation``, ``project``, ``attention_inputs``): they are the
kernel's twin, and a measurement taken beside the forward repeats them instead of riding along inside it
(the memory benchmark's attention probe, ``tools/memory_bench/attention.py``; ``project``'s queries and the
stored keys are the kernel's bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cpu_kernels import linear
from ..cpu_kernels.attention import HIDDEN, attention_layer
from ..cpu_kernels.elementwise import add_rms_norm, rms_norm, silu_gate
from ..cpu_kernels.rope import rotate_rows
from ..numerics import ops
from ..numerics.finite import require_finite
from ..numerics.weight_formats import PackedMatrix, dequantize, pack, take_rows
from .arena import KVArena
from .backend import Backend, ForwardResult
from .checkpoint import MLP_HEAD, Checkpoint


@dataclass
class _Layer:
    """One decoder layer's weights: matrices [out, in] as HF stores them, norms and biases fp32."""

    input_norm: np.ndarray
    qkv: PackedMatrix  # [q_dim + 2 kv_dim, H]
    qkv_bias: np.ndarray
    o: PackedMatrix  # [H, q_dim]
    post_norm: np.ndarray
    gate_up: PackedMatrix  # [2 I, H]
    down: PackedMatrix  # [H, I]


class NumpyBackend(Backend):
    name = "numpy"

    def __init__(self, checkpoint: Checkpoint, arena: KVArena) -> None:
        super().__init__(checkpoint, arena)
        c = self.config
        f32, matrix = checkpoint.float32, checkpoint.matrix
        self.embed = matrix("model.embed_tokens.weight")
        self.lm_head = self.embed if c.tie_word_embeddings else matrix("lm_head.weight")
        self.final_norm = f32("model.norm.weight")
        self.layers = []
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            attn = p + "self_attn."
            self.layers.append(_Layer(
                input_norm=f32(p + "input_layernorm.weight"),
                qkv=matrix(*(attn + f"{n}_proj.weight" for n in "qkv")),
                qkv_bias=np.concatenate([f32(attn + f"{n}_proj.bias") for n in "qkv"]),
                o=matrix(attn + "o_proj.weight"),
                post_norm=f32(p + "post_attention_layernorm.weight"),
                gate_up=matrix(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                down=matrix(p + "mlp.down_proj.weight"),
            ))
        self.k_rows = np.zeros((arena.pages.num_pages * arena.page_tokens, c.head_dim), dtype=np.float32)
        self.v_rows = np.zeros_like(self.k_rows)
        self.inv_freq = ops.rope_inv_freq(c.head_dim, c.rope_theta)
        self.scale = 1.0 / np.sqrt(c.head_dim)
        # the mlp action head, fp32 as every small tensor here: fc1, b1, fc2, b2 (``checkpoint.MLP_HEAD``)
        self.head: tuple[PackedMatrix, np.ndarray, PackedMatrix, np.ndarray] | None = None
        if c.action.head == "mlp":
            fc1, b1, fc2, b2 = (f32(name) for name in MLP_HEAD)
            self.head = (pack(fc1, "float32"), b1, pack(fc2, "float32"), b2)

    def forward(self, positions: np.ndarray, slots: np.ndarray, *, token_ids: np.ndarray | None = None,
                embeddings: np.ndarray | None = None, collect_layers: bool = False,
                rope_positions: np.ndarray | None = None) -> ForwardResult:
        token_ids, embeddings = self._inputs(token_ids, embeddings)
        c = self.config
        positions = np.asarray(positions, dtype=np.int32)
        slots = np.asarray(slots, dtype=np.int32)
        x = self.embeddings(token_ids) if token_ids is not None else embeddings.copy()
        rope_ids = self._rope_ids(rope_positions, positions.size)
        cos, sin = self.rotation(positions, rope_ids)
        self.arena.commit(slots, positions, rope_ids)
        new_rows = self.arena.pages.rows(slots)  # [layers, kv_heads, T]
        reads = self._reads()
        scale, eps = np.float32(self.scale), np.float32(c.rms_norm_eps)
        attended = np.empty((positions.size, c.q_dim), dtype=np.float32)
        normed = np.empty_like(x)
        gated = np.empty((positions.size, c.intermediate_size), dtype=np.float32)
        layer_hidden = [x.copy()] if collect_layers else None
        for index, layer in enumerate(self.layers):
            attention_layer(self._qkv(index, x), cos, sin, c.num_attention_heads, self.k_rows, self.v_rows,
                            new_rows[index], *reads[index], positions, scale, attended)
            add_rms_norm(x, linear(attended, layer.o), layer.post_norm, eps, normed)
            silu_gate(linear(normed, layer.gate_up), gated)
            x += linear(gated, layer.down)
            if layer_hidden is not None:
                layer_hidden.append(x.copy())
        rms_norm(x, self.final_norm, eps, normed)
        return ForwardResult(normed, layer_hidden)

    def embeddings(self, token_ids: np.ndarray) -> np.ndarray:
        """The input vectors [T, H] of tokens ``token_ids``: their rows of the embedding table, in fp32."""
        return dequantize(take_rows(self.embed, np.asarray(token_ids)))

    def rotation(self, positions: np.ndarray, rope_ids: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """RoPE cos and sin of new tokens: by their M-RoPE ids (as ``_rope_ids`` returns them) if any, else by
        position."""
        if rope_ids is None:
            return ops.rope_cos_sin(positions, self.inv_freq)
        return ops.mrope_cos_sin(rope_ids, self.inv_freq, self.mrope_section)

    def project(self, layer: int, x: np.ndarray, cos: np.ndarray, sin: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Layer ``layer``'s rotated queries [T, q_heads, D] and keys and its values [T, kv_heads, D] of its
        input ``x`` [T, H]."""
        c = self.config
        tokens, q_end, k_end = x.shape[0], c.q_dim, c.q_dim + c.kv_dim
        qkv = self._qkv(layer, x)
        q = ops.apply_rope(qkv[:, :q_end].reshape(tokens, c.num_attention_heads, c.head_dim), cos, sin)
        k = ops.apply_rope(qkv[:, q_end:k_end].reshape(tokens, c.num_key_value_heads, c.head_dim), cos, sin)
        return q, k, qkv[:, k_end:].reshape(tokens, c.num_key_value_heads, c.head_dim)

    def _qkv(self, layer: int, x: np.ndarray) -> np.ndarray:
        """Layer ``layer``'s fused projections [T, q_dim + 2 kv_dim] of its input x [T, H], before RoPE."""
        weights, normed = self.layers[layer], np.empty_like(x)
        rms_norm(x, weights.input_norm, np.float32(self.config.rms_norm_eps), normed)
        return linear(normed, weights.qkv, weights.qkv_bias)

    def _reads(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per layer, the pool rows [kv_heads, n] its heads read (-1: none) and each entry's position
        (``HIDDEN``: none): ``attention_layer``'s view of ``attention_inputs``. In the dense layout every
        head of every layer holds the same slots, so the positions are found once; the per-head layout's
        differ by head and layer."""
        table = self.arena.pages
        layers, kv_heads = table.heads
        if table.per_head:
            return [self._entry_positions(table.layer_rows(layer)) for layer in range(layers)]
        run, n = table.width * table.page_tokens, int(table.lengths.max())
        heads = np.arange(layers * kv_heads, dtype=np.int64).reshape(layers, kv_heads, 1)
        rows = heads * run + np.arange(n)  # [layers, kv_heads, n]: head h's entry e is row e of its run
        _, positions = self._entry_positions(rows[0])
        return [(rows[layer], positions) for layer in range(layers)]

    def _entry_positions(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``rows`` [kv_heads, n] (-1: none) and the position of the token each holds (``HIDDEN``: none)."""
        slots = np.where(rows >= 0, self.arena.pages.entry_slot.reshape(-1)[np.maximum(rows, 0)], -1)
        return rows, np.where(slots >= 0, self.arena.positions[slots], HIDDEN).astype(np.int32)

    def attention_inputs(self, layer: int, positions: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """What layer ``layer``'s attention reads for queries at ``positions`` [T]: the keys and values
        [kv_heads, n, D] its heads hold, the slot of each entry [kv_heads, n] (-1: none), and the additive
        mask [kv_heads, T, n] that lets a query read the entries at or before its position."""
        keys, values, entry_slots = self._layer_kv(layer)
        taken = entry_slots >= 0
        entry_positions = np.where(taken, self.arena.positions[entry_slots], 0)
        visible = taken[:, None, :] & (entry_positions[:, None, :] <= positions[None, :, None])  # [kv_heads, T, n]
        return keys, values, entry_slots, ops.attention_bias(visible)

    def _layer_kv(self, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Keys and values [kv_heads, n, D] of one layer's entries, read through the block tables, and the slot
        each entry holds [kv_heads, n] (-1: none)."""
        table = self.arena.pages
        if not table.per_head:  # head h's entries are one run of rows: a view, no copy
            kv_heads, n = table.heads[1], int(table.lengths[layer].max())
            run = table.width * table.page_tokens
            first = layer * kv_heads * run
            shape = (kv_heads, run, -1)
            return (self.k_rows[first:first + kv_heads * run].reshape(shape)[:, :n],
                    self.v_rows[first:first + kv_heads * run].reshape(shape)[:, :n],
                    table.entry_slot.reshape(-1)[first:first + kv_heads * run].reshape(kv_heads, run)[:, :n])
        rows = table.layer_rows(layer)
        inside = np.maximum(rows, 0)
        return self.k_rows[inside], self.v_rows[inside], np.where(rows >= 0, table.entry_slot.reshape(-1)[inside], -1)

    def logits(self, hidden: np.ndarray, rows: slice = slice(None)) -> np.ndarray:
        return linear(np.ascontiguousarray(hidden, dtype=np.float32), take_rows(self.lm_head, rows))

    def greedy(self, hidden: np.ndarray, rows: slice = slice(None)) -> int:
        logits = self.logits(hidden[None, :], rows)[0]
        return int(np.argmax(require_finite(logits, "the action logits")))

    def action_mlp(self, hidden: np.ndarray) -> np.ndarray:
        """The compiled fp32 matrix-vector kernels (``cpu_kernels``), GELU between them (``ops.gelu``)."""
        if self.head is None:
            raise self._no_mlp_head()
        fc1, b1, fc2, b2 = self.head
        inner = linear(np.ascontiguousarray(hidden, dtype=np.float32).reshape(1, -1), fc1, b1)
        return linear(ops.gelu(inner).astype(np.float32), fc2, b2)[0]

    def rotate_keys(self, slots: np.ndarray, shifts: np.ndarray) -> None:
        rows = self.arena.pages.rows(slots)  # [layers, kv_heads, n]
        shifts = np.broadcast_to(np.asarray(shifts, dtype=np.int32), rows.shape[-1:])
        cos, sin = ops.rope_cos_sin(shifts, self.inv_freq)  # a token's rotation, whichever heads hold it
        rotate_rows(self.k_rows, rows.reshape(-1, rows.shape[-1]), cos, sin)

    def read_rows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.k_rows[rows], self.v_rows[rows]

    def write_rows(self, rows: np.ndarray, keys: np.ndarray, values: np.ndarray) -> None:
        self.k_rows[rows] = keys
        self.v_rows[rows] = values

    def move_rows(self, sources: np.ndarray, destinations: np.ndarray) -> None:
        self.k_rows[destinations] = self.k_rows[sources]
        self.v_rows[destinations] = self.v_rows[sources]

    def state_bytes(self) -> tuple[int, int]:
        held = [self.embed, self.final_norm] + ([] if self.lm_head is self.embed else [self.lm_head])
        held += [a for layer in self.layers for a in vars(layer).values()] + list(self.head or ())
        return sum(a.nbytes for a in held), self.k_rows.nbytes + self.v_rows.nbytes
