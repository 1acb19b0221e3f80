"""Grouped-query attention over one layer's paged KV, read through each KV head's block table.

The keys and values of every (layer, KV head) live in pages of one pool, k_pool / v_pool
[pages, P, D]. KV head hk reads its entries e < lengths[hk]; entry e sits on page
block_table[hk, e // P], row e % P, and holds the token of arena slot entry_slot[page, row]
(-1: no token, a hole of the dense layout). The entry is visible to query t iff it holds a token
and slot_pos[token] <= q_pos[t]. New tokens are written before attention, so this single rule is
causal inside a prefill; a head that evicted a token (``dms``) simply no longer lists it, so what a
head reads costs what it holds, not what it has seen.

One kernel serves prefill and decode. A block owns one KV head and a tile of query rows, where a
row is a (token, query head of that KV head's group) pair: the K/V chunks it stages in shared
memory are read from global memory once and used by every head of the group. It walks its range
of entries in chunks of _CHUNK with an online (running max / running sum) softmax in fp32, so the
arena size is not bounded by shared memory. Each chunk first looks up, once per entry, the page
row and the token's position, then stages K and V rows from those pages.
- Prefill (T > 1): many row tiles; the entries are split only when the grid would be too small.
- Decode (T == 1): a single row tile (the group's heads), so the entries are split across many
  blocks (flash-decoding); each block leaves an unnormalised partial (o, max, sum) and a combine
  kernel merges them with the same rescaling rule. A block whose range starts past its head's
  length leaves an empty partial.
Invisible scores are -inf and never enter exp(); a row that sees no entry at all outputs zeros.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, int32

from vla_edge_ros.kernels._launch import CudaFunction, DeviceArray, Stream, cdiv, check, check_array, dims
from vla_edge_ros.kernels._softmax import NEG_INF as _NEG_INF
from vla_edge_ros.kernels._softmax import online_softmax

MAX_HEAD_DIM = 128
"""Largest head_dim whose tiles fit the 48 KiB of static shared memory a block may use."""

_THREADS = 128
_CHUNK = 32  # entries staged in shared memory at a time
_DECODE_ROWS = 8  # row tile when every row fits in one small tile (decode)
_PREFILL_ROWS = 16
_TARGET_BLOCKS = 256  # split the entries until the grid has about this many blocks ...
_MIN_SPLIT_ENTRIES = 2 * _CHUNK  # ... but give each block at least this many entries


@cuda.jit(device=True)
def _query_of_row(row, group, hk):
    """(token, query head) of a row of KV head hk's group: rows run over tokens, then heads."""
    token = row // group
    return token, hk * group + (row - token * group)


@functools.cache
def _attention_kernel(head_dim: int, tile_rows: int) -> CudaFunction:
    """The kernel for one (head_dim, tile_rows): shared arrays need compile-time sizes."""
    kv_shape = (_CHUNK, head_dim + 1)
    update_rows, accumulate_rows = online_softmax(tile_rows, _CHUNK, head_dim, _THREADS)

    @cuda.jit(device=True)
    def locate_chunk(block_table, entry_slot, slot_pos, hk, c0, e_end, page_s, row_s, pos_s, tid):
        # One thread per entry: its page and row, and its token's position (-1: no token to read).
        if tid < _CHUNK:
            e = c0 + tid
            page = 0
            row = 0
            pos = -1
            if e < e_end:
                page_tokens = entry_slot.shape[1]
                block = e // page_tokens
                page = block_table[hk, block]
                row = e - block * page_tokens
                slot = entry_slot[page, row]
                if slot >= 0:
                    pos = slot_pos[slot]
            page_s[tid] = page
            row_s[tid] = row
            pos_s[tid] = pos

    @cuda.jit(device=True)
    def stage_chunk(pool, kv_s, page_s, row_s, pos_s, tid):
        # Coalesced along head_dim; entries without a token are not read, so their bandwidth is not spent.
        for p in range(tid, _CHUNK * head_dim, _THREADS):
            j = p // head_dim
            d = p - j * head_dim
            kv_s[j, d] = pool[page_s[j], row_s[j], d] if pos_s[j] >= 0 else float32(0)

    @cuda.jit
    def attend(
        q, k_pool, v_pool, block_table, lengths, entry_slot, slot_pos, q_pos, scale, split_len, out, part_o, part_ml
    ):
        q_s = cuda.shared.array((tile_rows, head_dim), float32)
        o_s = cuda.shared.array((tile_rows, head_dim), float32)
        # K, then V, of the current chunk; the pad column keeps the score loop conflict-free.
        kv_s = cuda.shared.array(kv_shape, float32)
        p_s = cuda.shared.array((tile_rows, _CHUNK), float32)  # scores, then probabilities
        stat_s = cuda.shared.array((3, tile_rows), float32)  # running max, running sum, rescale
        qpos_s = cuda.shared.array(tile_rows, int32)
        page_s = cuda.shared.array(_CHUNK, int32)
        row_s = cuda.shared.array(_CHUNK, int32)
        pos_s = cuda.shared.array(_CHUNK, int32)

        tid = cuda.threadIdx.x
        q_heads = q.shape[1]
        kv_heads = block_table.shape[0]
        group = q_heads // kv_heads
        rows = q.shape[0] * group
        hk = cuda.blockIdx.y
        split = cuda.blockIdx.z
        r0 = cuda.blockIdx.x * tile_rows
        e_begin = split * split_len
        e_end = min(lengths[hk], e_begin + split_len)

        for p in range(tid, tile_rows * head_dim, _THREADS):
            r = p // head_dim
            d = p - r * head_dim
            value = float32(0)
            if r0 + r < rows:
                t, h = _query_of_row(r0 + r, group, hk)
                value = q[t, h, d]
            q_s[r, d] = value
            o_s[r, d] = float32(0)
        if tid < tile_rows:
            row = r0 + tid
            qpos_s[tid] = q_pos[row // group] if row < rows else int32(0)
            stat_s[0, tid] = _NEG_INF
            stat_s[1, tid] = float32(0)
        cuda.syncthreads()

        for c0 in range(e_begin, e_end, _CHUNK):
            locate_chunk(block_table, entry_slot, slot_pos, hk, c0, e_end, page_s, row_s, pos_s, tid)
            cuda.syncthreads()
            stage_chunk(k_pool, kv_s, page_s, row_s, pos_s, tid)
            cuda.syncthreads()

            for p in range(tid, tile_rows * _CHUNK, _THREADS):
                r = p // _CHUNK
                j = p - r * _CHUNK
                score = _NEG_INF
                if r0 + r < rows and pos_s[j] >= 0 and pos_s[j] <= qpos_s[r]:
                    dot = float32(0)
                    for d in range(head_dim):
                        dot += q_s[r, d] * kv_s[j, d]
                    score = dot * scale
                p_s[r, j] = score
            cuda.syncthreads()

            # One thread per row updates the running softmax while the others stage V.
            update_rows(p_s, stat_s, tid)
            stage_chunk(v_pool, kv_s, page_s, row_s, pos_s, tid)
            cuda.syncthreads()

            accumulate_rows(o_s, p_s, kv_s, stat_s, tid)
            cuda.syncthreads()

        for p in range(tid, tile_rows * head_dim, _THREADS):
            r = p // head_dim
            d = p - r * head_dim
            row = r0 + r
            if row < rows:
                total = stat_s[1, r]
                if part_o is None:
                    t, h = _query_of_row(row, group, hk)
                    out[t, h, d] = o_s[r, d] / total if total > float32(0) else float32(0)
                else:
                    part_o[split, hk, row, d] = o_s[r, d]
                    if d == 0:
                        part_ml[split, hk, row, 0] = stat_s[0, r]
                        part_ml[split, hk, row, 1] = total

    return attend


@cuda.jit
def _combine_kernel(part_o, part_ml, out):
    # One block per (row, KV head), one thread per head_dim element: merge the splits' partials
    # by rescaling each to the global running max.
    row = cuda.blockIdx.x
    hk = cuda.blockIdx.y
    d = cuda.threadIdx.x
    splits = part_o.shape[0]
    t, h = _query_of_row(row, out.shape[1] // part_o.shape[1], hk)
    m_all = _NEG_INF
    for s in range(splits):
        m_all = max(m_all, part_ml[s, hk, row, 0])
    acc = float32(0)
    total = float32(0)
    if m_all != _NEG_INF:
        for s in range(splits):
            m = part_ml[s, hk, row, 0]
            if m != _NEG_INF:
                weight = math.exp(m - m_all)
                acc += weight * part_o[s, hk, row, d]
                total += weight * part_ml[s, hk, row, 1]
    out[t, h, d] = acc / total if total > float32(0) else float32(0)


class AttentionScratch:
    """Reusable device buffers for split partials, so decode steps do not allocate each call."""

    def __init__(self) -> None:
        self._o: DeviceArray | None = None
        self._ml: DeviceArray | None = None

    def buffers(
        self, splits: int, kv_heads: int, rows: int, head_dim: int, stream: Stream = 0
    ) -> tuple[DeviceArray, DeviceArray]:
        """Partial outputs [splits, Hkv, rows, D] and (max, sum) [splits, Hkv, rows, 2]."""
        o_size = splits * kv_heads * rows * head_dim
        ml_size = splits * kv_heads * rows * 2
        if self._o is None or self._o.size < o_size:
            self._o = cuda.device_array(o_size, np.float32, stream=stream)
        if self._ml is None or self._ml.size < ml_size:
            self._ml = cuda.device_array(ml_size, np.float32, stream=stream)
        return (
            self._o[:o_size].reshape(splits, kv_heads, rows, head_dim),
            self._ml[:ml_size].reshape(splits, kv_heads, rows, 2),
        )


def _split_len(entries: int, other_blocks: int, num_splits: int | None) -> int:
    """Entries per block: as requested, or enough splits to fill the GPU without tiny splits."""
    if num_splits is not None:
        check(num_splits >= 1, f"num_splits must be >= 1, got {num_splits}")
        return cdiv(entries, min(num_splits, entries))
    wanted = max(1, _TARGET_BLOCKS // other_blocks)
    per_split = max(_MIN_SPLIT_ENTRIES, cdiv(entries, wanted))
    return cdiv(per_split, _CHUNK) * _CHUNK


def attention(
    q: DeviceArray,
    k_pool: DeviceArray,
    v_pool: DeviceArray,
    block_table: DeviceArray,
    lengths: DeviceArray,
    entry_slot: DeviceArray,
    slot_pos: DeviceArray,
    q_pos: DeviceArray,
    scale: float,
    out: DeviceArray,
    num_splits: int | None = None,
    scratch: AttentionScratch | None = None,
    stream: Stream = 0,
) -> None:
    """out[T, Hq, D] = softmax(scale * q k^T over each KV head's visible entries) v, query head h on KV head h // G.

    k_pool, v_pool [pages, P, D]; block_table [Hkv, B] and lengths [Hkv] of one layer; entry_slot
    [pages, P] (-1: no token); slot_pos [S]. num_splits overrides how many blocks share a KV head's
    B * P entries (None: chosen from the shape); scratch holds the split partials between calls
    (None: allocated for this call).
    """
    tokens, q_heads, head_dim = dims(q, "q", 3)
    pages, page_tokens, _ = dims(k_pool, "k_pool", 3)
    kv_heads, width = dims(block_table, "block_table", 2)
    (slots,) = dims(slot_pos, "slot_pos", 1)
    check_array(q, "q", (tokens, q_heads, head_dim), (np.float32,))
    check_array(k_pool, "k_pool", (pages, page_tokens, head_dim), (np.float32,))
    check_array(v_pool, "v_pool", (pages, page_tokens, head_dim), (np.float32,))
    check_array(block_table, "block_table", (kv_heads, width), (np.int32,))
    check_array(lengths, "lengths", (kv_heads,), (np.int32,))
    check_array(entry_slot, "entry_slot", (pages, page_tokens), (np.int32,))
    check_array(slot_pos, "slot_pos", (slots,), (np.int32,))
    check_array(q_pos, "q_pos", (tokens,), (np.int32,))
    check_array(out, "out", (tokens, q_heads, head_dim), (np.float32,))
    check(q_heads % kv_heads == 0, f"{q_heads} query heads do not group over {kv_heads} KV heads")
    check(head_dim <= MAX_HEAD_DIM, f"head_dim {head_dim} exceeds {MAX_HEAD_DIM}")
    check(width * page_tokens > 0, "the block tables have no entries")
    if tokens == 0:
        return
    rows = tokens * (q_heads // kv_heads)
    tile_rows = _DECODE_ROWS if rows <= _DECODE_ROWS else _PREFILL_ROWS
    row_tiles = cdiv(rows, tile_rows)
    entries = width * page_tokens
    split_len = _split_len(entries, row_tiles * kv_heads, num_splits)
    splits = cdiv(entries, split_len)
    kernel = _attention_kernel(head_dim, tile_rows)
    grid = (row_tiles, kv_heads, splits)
    args = (q, k_pool, v_pool, block_table, lengths, entry_slot, slot_pos, q_pos, np.float32(scale), split_len, out)
    if splits == 1:
        kernel[grid, _THREADS, stream](*args, None, None)
        return
    part_o, part_ml = (scratch or AttentionScratch()).buffers(
        splits, kv_heads, rows, head_dim, stream
    )
    kernel[grid, _THREADS, stream](*args, part_o, part_ml)
    _combine_kernel[(rows, kv_heads), head_dim, stream](part_o, part_ml, out)
