"""out[T, N] = x[T, K] @ w[N, K].T + bias: every projection of the decoder, lm_head included.

Two kernels, because decode and prefill are different problems:
- T == 1 (decode) is a matrix-vector product bound by streaming the weights once: a block owns a
  few output rows, its threads stride along K so every weight load is coalesced (16-bit weights
  four per 8-byte load when K allows), each x element is reused for all of the block's rows, and
  the partial sums meet in a shared-memory tree.
- T > 1 (prefill) is a tiled GEMM: a block computes a BM x BN output tile from BK-deep slices of x
  and w staged in shared memory, and each of its 16 x 16 threads keeps a (BM/16) x (BN/16)
  register tile, so a weight tile fetched from global memory is reused by BM tokens.
Weights stay in their storage kind and are widened to fp32 as they are loaded; accumulation is fp32.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32

from vla_edge_ros.kernels._launch import CudaFunction, DeviceArray, Stream, cdiv, check_array, dims
from vla_edge_ros.kernels._loads import PACKED_LANES, PACKED_WORD, can_pack, lane_reader, widen
from vla_edge_ros.kernels._reduce import tree_sum_rows
from vla_edge_ros.kernels.dtypes import WeightKind, weight_kind_of

_GEMV_THREADS = 128
_GEMV_ROWS = 4

_GEMM_SIDE = 16  # the GEMM block is _GEMM_SIDE x _GEMM_SIDE threads
_GEMM_THREADS = _GEMM_SIDE * _GEMM_SIDE
_GEMM_BK = 32
_TARGET_BLOCKS = 128  # enough blocks to cover the SMs of a large GPU before widening tiles


@functools.cache
def _gemv_kernel(kind: WeightKind, packed: bool) -> CudaFunction:
    read_lane = lane_reader(kind, packed)
    lanes = PACKED_LANES if packed else 1

    @cuda.jit
    def gemv(x, w_words, bias, out):
        partial = cuda.shared.array((_GEMV_ROWS, _GEMV_THREADS), float32)
        acc = cuda.local.array(_GEMV_ROWS, float32)
        xs = cuda.local.array(lanes, float32)
        n_out, words = w_words.shape
        tid = cuda.threadIdx.x
        n0 = cuda.blockIdx.x * _GEMV_ROWS
        for r in range(_GEMV_ROWS):
            acc[r] = float32(0)
        for kw in range(tid, words, _GEMV_THREADS):
            for e in range(lanes):
                xs[e] = x[0, kw * lanes + e]
            for r in range(_GEMV_ROWS):
                # Rows past the end re-read the last row; their sums are never stored.
                word = w_words[min(n0 + r, n_out - 1), kw]
                for e in range(lanes):
                    acc[r] += xs[e] * read_lane(word, e)
        for r in range(_GEMV_ROWS):
            partial[r, tid] = acc[r]
        tree_sum_rows(partial, tid)
        n = n0 + tid
        if tid < _GEMV_ROWS and n < n_out:
            value = partial[tid, 0]
            if bias is not None:
                value += bias[n]
            out[0, n] = value

    return gemv


@functools.cache
def _gemm_kernel(kind: WeightKind, bm: int, bn: int) -> CudaFunction:
    widen_weight = widen(kind)
    tm = bm // _GEMM_SIDE
    tn = bn // _GEMM_SIDE
    load_rows = _GEMM_THREADS // _GEMM_BK  # tile rows filled per pass of the block
    xs_shape = (_GEMM_BK, bm + 1)  # shared shapes must be compile-time constants
    ws_shape = (_GEMM_BK, bn + 1)

    @cuda.jit
    def gemm(x, w, bias, out):
        # Tiles are stored k-major with one pad column so both the transposing stores and the
        # compute-loop reads are free of shared-memory bank conflicts.
        xs = cuda.shared.array(xs_shape, float32)
        ws = cuda.shared.array(ws_shape, float32)
        acc = cuda.local.array((tm, tn), float32)
        xa = cuda.local.array(tm, float32)
        wb = cuda.local.array(tn, float32)
        tokens, depth = x.shape
        n_out = w.shape[0]
        tid = cuda.threadIdx.x
        ty = tid // _GEMM_SIDE
        tx = tid - ty * _GEMM_SIDE
        m0 = cuda.blockIdx.y * bm
        n0 = cuda.blockIdx.x * bn
        lk = tid % _GEMM_BK
        lr = tid // _GEMM_BK
        for i in range(tm):
            for j in range(tn):
                acc[i, j] = float32(0)
        for k0 in range(0, depth, _GEMM_BK):
            k = k0 + lk
            for r in range(lr, bm, load_rows):
                m = m0 + r
                xs[lk, r] = x[m, k] if m < tokens and k < depth else float32(0)
            for r in range(lr, bn, load_rows):
                n = n0 + r
                ws[lk, r] = widen_weight(w[n, k]) if n < n_out and k < depth else float32(0)
            cuda.syncthreads()
            for kk in range(_GEMM_BK):
                for i in range(tm):
                    xa[i] = xs[kk, ty + i * _GEMM_SIDE]
                for j in range(tn):
                    wb[j] = ws[kk, tx + j * _GEMM_SIDE]
                for i in range(tm):
                    for j in range(tn):
                        acc[i, j] += xa[i] * wb[j]
            cuda.syncthreads()
        for i in range(tm):
            m = m0 + ty + i * _GEMM_SIDE
            for j in range(tn):
                n = n0 + tx + j * _GEMM_SIDE
                if m < tokens and n < n_out:
                    value = acc[i, j]
                    if bias is not None:
                        value += bias[n]
                    out[m, n] = value

    return gemm


def _gemm_tiles(tokens: int, n_out: int) -> tuple[int, int]:
    """Pick (BM, BN): BM just covers short prefills; BN widens once the grid fills the GPU."""
    bm = 16 if tokens <= 16 else 32 if tokens <= 32 else 64
    wide_blocks = cdiv(n_out, 64) * cdiv(tokens, bm)
    return bm, 64 if wide_blocks >= _TARGET_BLOCKS else 32


def linear(
    x: DeviceArray,
    w: DeviceArray,
    bias: DeviceArray | None,
    out: DeviceArray,
    stream: Stream = 0,
) -> None:
    """out = x @ w.T (+ bias). w[N, K] is fp32, fp16 or bf16 bits; x, bias and out are fp32."""
    tokens, depth = dims(x, "x", 2)
    n_out = dims(w, "w", 2)[0]
    kind = weight_kind_of(w)
    check_array(x, "x", (tokens, depth), (np.float32,))
    check_array(w, "w", (n_out, depth), (kind.storage_dtype,))
    if bias is not None:
        check_array(bias, "bias", (n_out,), (np.float32,))
    check_array(out, "out", (tokens, n_out), (np.float32,))
    if tokens == 0 or n_out == 0:
        return
    if tokens == 1:
        packed = can_pack(kind, depth) and w.is_c_contiguous()
        words = w.view(PACKED_WORD) if packed else w
        kernel = _gemv_kernel(kind, packed)
        kernel[cdiv(n_out, _GEMV_ROWS), _GEMV_THREADS, stream](x, words, bias, out)
        return
    bm, bn = _gemm_tiles(tokens, n_out)
    grid = (cdiv(n_out, bn), cdiv(tokens, bm))
    _gemm_kernel(kind, bm, bn)[grid, _GEMM_THREADS, stream](x, w, bias, out)
