"""Non-causal attention within variable-length segments of one packed sequence: the vision tower's.

The ViT packs every image (Qwen2-VL), or every window of every image (Qwen2.5-VL), into one
[T, heads, D] sequence; ``cu_seqlens`` [S + 1] holds the segment bounds (0, ..., T) and a token
attends to every token of its own segment and to no other, in both directions.

A block owns one head and a tile of consecutive tokens. Each row finds its segment by a binary search
of ``cu_seqlens``; the block walks the keys from the first row's segment start to the last row's
segment end in chunks staged in shared memory, scoring only the keys inside each row's own segment,
with the same online softmax as the decoder's paged attention (``_softmax``). A tile that straddles
segment bounds (windows of 64 tokens, images of any size) wastes at most one tile of keys per side.
Bounds outside [0, T] are clamped, so a malformed ``cu_seqlens`` cannot read out of bounds.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, int32

from vla_edge_ros.kernels._launch import CudaFunction, DeviceArray, Stream, cdiv, check, check_array, dims
from vla_edge_ros.kernels._softmax import NEG_INF, online_softmax
from vla_edge_ros.kernels.gqa_attention import MAX_HEAD_DIM

_THREADS = 128
_CHUNK = 32  # keys staged in shared memory at a time
_TILE_ROWS = 16


@cuda.jit(device=True)
def _segment_bounds(cu_seqlens, t, tokens):
    """[start, end) of the segment holding token t (the last s with cu_seqlens[s] <= t), clamped to
    [0, T]; the empty range [t, t) when no segment holds t."""
    lo = 0
    hi = cu_seqlens.shape[0] - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if cu_seqlens[mid] <= t:
            lo = mid
        else:
            hi = mid
    start = max(0, min(cu_seqlens[lo], tokens))
    end = max(0, min(cu_seqlens[lo + 1], tokens))
    if start <= t and t < end:
        return start, end
    return t, t


@functools.cache
def _segment_kernel(head_dim: int) -> CudaFunction:
    """The kernel for one head_dim: shared arrays need compile-time sizes."""
    kv_shape = (_CHUNK, head_dim + 1)
    update_rows, accumulate_rows = online_softmax(_TILE_ROWS, _CHUNK, head_dim, _THREADS)

    @cuda.jit(device=True)
    def stage_chunk(src, kv_s, h, c0, k_end, tid):
        for p in range(tid, _CHUNK * head_dim, _THREADS):
            j = p // head_dim
            d = p - j * head_dim
            kv_s[j, d] = src[c0 + j, h, d] if c0 + j < k_end else float32(0)

    @cuda.jit
    def attend(q, k, v, cu_seqlens, scale, out):
        q_s = cuda.shared.array((_TILE_ROWS, head_dim), float32)
        o_s = cuda.shared.array((_TILE_ROWS, head_dim), float32)
        # K, then V, of the current chunk; the pad column keeps the score loop conflict-free.
        kv_s = cuda.shared.array(kv_shape, float32)
        p_s = cuda.shared.array((_TILE_ROWS, _CHUNK), float32)  # scores, then probabilities
        stat_s = cuda.shared.array((3, _TILE_ROWS), float32)  # running max, running sum, rescale
        bounds_s = cuda.shared.array((2, _TILE_ROWS), int32)  # each row's segment [start, end)

        tid = cuda.threadIdx.x
        tokens = q.shape[0]
        h = cuda.blockIdx.y
        t0 = cuda.blockIdx.x * _TILE_ROWS
        last = min(_TILE_ROWS, tokens - t0) - 1  # the tile's last real row

        for p in range(tid, _TILE_ROWS * head_dim, _THREADS):
            r = p // head_dim
            d = p - r * head_dim
            q_s[r, d] = q[t0 + r, h, d] if r <= last else float32(0)
            o_s[r, d] = float32(0)
        if tid < _TILE_ROWS:
            start = int32(0)
            end = int32(0)
            if tid <= last:
                start, end = _segment_bounds(cu_seqlens, t0 + tid, tokens)
            bounds_s[0, tid] = start
            bounds_s[1, tid] = end
            stat_s[0, tid] = NEG_INF
            stat_s[1, tid] = float32(0)
        cuda.syncthreads()

        # Rows are in token order, so their segments are too: the tile's keys span first start .. last end.
        k_begin = bounds_s[0, 0]
        k_end = bounds_s[1, last]
        for c0 in range(k_begin, k_end, _CHUNK):
            stage_chunk(k, kv_s, h, c0, k_end, tid)
            cuda.syncthreads()
            for p in range(tid, _TILE_ROWS * _CHUNK, _THREADS):
                r = p // _CHUNK
                j = p - r * _CHUNK
                key = c0 + j
                score = NEG_INF
                if r <= last and key >= bounds_s[0, r] and key < bounds_s[1, r]:
                    dot = float32(0)
                    for d in range(head_dim):
                        dot += q_s[r, d] * kv_s[j, d]
                    score = dot * scale
                p_s[r, j] = score
            cuda.syncthreads()
            update_rows(p_s, stat_s, tid)
            stage_chunk(v, kv_s, h, c0, k_end, tid)
            cuda.syncthreads()
            accumulate_rows(o_s, p_s, kv_s, stat_s, tid)
            cuda.syncthreads()

        for p in range(tid, _TILE_ROWS * head_dim, _THREADS):
            r = p // head_dim
            d = p - r * head_dim
            if r <= last:
                total = stat_s[1, r]
                out[t0 + r, h, d] = o_s[r, d] / total if total > float32(0) else float32(0)

    return attend


def segment_attention(
    q: DeviceArray,
    k: DeviceArray,
    v: DeviceArray,
    cu_seqlens: DeviceArray,
    scale: float,
    out: DeviceArray,
    stream: Stream = 0,
) -> None:
    """out[T, H, D] = softmax(scale * q k^T) v per head, each token over the tokens of its own segment.

    q, k, v [T, H, D] fp32 (rotated already); cu_seqlens [S + 1] int32, non-decreasing from 0 to T.
    A token outside every segment (bounds that do not cover [0, T)) gets zeros.
    """
    tokens, heads, head_dim = dims(q, "q", 3)
    (bounds,) = dims(cu_seqlens, "cu_seqlens", 1)
    for name, array in (("q", q), ("k", k), ("v", v), ("out", out)):
        check_array(array, name, (tokens, heads, head_dim), (np.float32,))
    check_array(cu_seqlens, "cu_seqlens", (bounds,), (np.int32,))
    check(bounds >= 2, f"cu_seqlens needs at least one segment (2 bounds), got {bounds}")
    check(head_dim <= MAX_HEAD_DIM, f"head_dim {head_dim} exceeds {MAX_HEAD_DIM}")
    if tokens == 0 or heads == 0:
        return
    grid = (cdiv(tokens, _TILE_ROWS), heads)
    _segment_kernel(head_dim)[grid, _THREADS, stream](q, k, v, cu_seqlens, np.float32(scale), out)
