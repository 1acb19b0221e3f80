"""out[T, N] = x[T, K] @ w[N, K].T + bias: every projection of the decoder, lm_head included.

Two kernels, because decode and prefill are different problems:
- T == 1 (decode) is a matrix-vector product bound by streaming the weights once: a block owns a
  few output rows, its threads stride along K so every weight load is coalesced (16-bit weights
  four, int8 eight per 8-byte load when K allows), each x element is reused for all of the
  block's rows, and the partial sums meet in a shared-memory tree.
- T > 1 (prefill) is a tiled GEMM: a block computes a BM x BN output tile from BK-deep slices of x
  and w staged in shared memory, and each of its 16 x 16 threads keeps a (BM/16) x (BN/16)
  register tile, so a weight tile fetched from global memory is reused by BM tokens.
Weights stay in their storage kind and are widened to fp32 as they are loaded; accumulation is fp32.
int8 (a scale per row) and int4 (a scale per group of 32-128 inputs) are dequantized in registers:
the GEMV sums a row's int8 products and scales once at the end; for int4 it reads 8-byte words of
nibble pairs (16 weights of one group: 8 consecutive inputs in the low nibbles, the 8 half a group
on in the high ones), so each thread gathers two runs of x, and scales each word's partial sum by
its group's scale. The GEMM dequantizes each weight into its shared tile, where BM tokens reuse it.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32

from vla_edge_ros.kernels._launch import CudaFunction, DeviceArray, Stream, cdiv, check, check_array, dims
from vla_edge_ros.kernels._loads import (
    INT4_LANES,
    INT4_WORD,
    element_reader,
    int4_lane,
    lane_reader,
    packed_lanes,
    packed_word,
)
from vla_edge_ros.kernels._reduce import tree_sum_rows
from vla_edge_ros.kernels.dtypes import DeviceWeight, WeightKind, as_device_weight

_GEMV_THREADS = 128
_GEMV_ROWS = 4

_GEMM_SIDE = 16  # the GEMM block is _GEMM_SIDE x _GEMM_SIDE threads
_GEMM_THREADS = _GEMM_SIDE * _GEMM_SIDE
_GEMM_BK = 32
_TARGET_BLOCKS = 128  # enough blocks to cover the SMs of a large GPU before widening tiles


@cuda.jit(device=True)
def _store_rows(partial, tid, n0, row_scales, bias, out):
    """Sum the block's per-thread partial rows and store them: out[0, n0 + r] (times its row scale, plus bias)."""
    tree_sum_rows(partial, tid)
    n = n0 + tid
    if tid < _GEMV_ROWS and n < out.shape[1]:
        value = partial[tid, 0]
        if row_scales is not None:
            value *= row_scales[n]
        if bias is not None:
            value += bias[n]
        out[0, n] = value


@functools.cache
def _gemv_kernel(kind: WeightKind, lanes: int) -> CudaFunction:
    """Float kinds and int8 (whose `row_scales` multiply each finished row; None for the float kinds)."""
    read_lane = lane_reader(kind, lanes)

    @cuda.jit
    def gemv(x, w_words, row_scales, bias, out):
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
        _store_rows(partial, tid, n0, row_scales, bias, out)

    return gemv


@functools.cache
def _gemv_int4_kernel(group: int) -> CudaFunction:
    """int4 in groups of `group` inputs: `scales` [N, groups] multiply each word's partial sum."""
    half = group // 2
    run = INT4_LANES // 2  # consecutive inputs per nibble half of a word
    group_words = half // INT4_WORD.itemsize

    @cuda.jit
    def gemv(x, w_words, scales, bias, out):
        partial = cuda.shared.array((_GEMV_ROWS, _GEMV_THREADS), float32)
        acc = cuda.local.array(_GEMV_ROWS, float32)
        xs = cuda.local.array(INT4_LANES, float32)
        n_out, words = w_words.shape
        depth = x.shape[1]
        tid = cuda.threadIdx.x
        n0 = cuda.blockIdx.x * _GEMV_ROWS
        for r in range(_GEMV_ROWS):
            acc[r] = float32(0)
        for kw in range(tid, words, _GEMV_THREADS):
            g = kw // group_words
            k = g * group + (kw - g * group_words) * run
            for e in range(run):  # the last group's padding (zero weights) must not read past x
                xs[e] = x[0, k + e] if k + e < depth else float32(0)
                xs[run + e] = x[0, k + half + e] if k + half + e < depth else float32(0)
            for r in range(_GEMV_ROWS):
                n = min(n0 + r, n_out - 1)  # rows past the end re-read the last row, never stored
                word = w_words[n, kw]
                dot = float32(0)
                for e in range(INT4_LANES):
                    dot += xs[e] * int4_lane(word, e)
                acc[r] += scales[n, g] * dot
        for r in range(_GEMV_ROWS):
            partial[r, tid] = acc[r]
        _store_rows(partial, tid, n0, None, bias, out)

    return gemv


@functools.cache
def _gemm_kernel(kind: WeightKind, group: int, bm: int, bn: int) -> CudaFunction:
    read_weight = element_reader(kind, group)
    tm = bm // _GEMM_SIDE
    tn = bn // _GEMM_SIDE
    load_rows = _GEMM_THREADS // _GEMM_BK  # tile rows filled per pass of the block
    xs_shape = (_GEMM_BK, bm + 1)  # shared shapes must be compile-time constants
    ws_shape = (_GEMM_BK, bn + 1)

    @cuda.jit
    def gemm(x, w, scales, bias, out):
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
                ws[lk, r] = read_weight(w, scales, n, k) if n < n_out and k < depth else float32(0)
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
    w: DeviceWeight | DeviceArray,
    bias: DeviceArray | None,
    out: DeviceArray,
    stream: Stream = 0,
) -> None:
    """out = x @ w.T (+ bias). w[N, K]: a DeviceWeight of any kind, or a bare fp32, fp16 or bf16-bits
    array; x, bias and out are fp32."""
    weight = as_device_weight(w)
    n_out, depth = weight.shape
    tokens = dims(x, "x", 2)[0]
    check_array(x, "x", (tokens, depth), (np.float32,))
    if bias is not None:
        check_array(bias, "bias", (n_out,), (np.float32,))
    check_array(out, "out", (tokens, n_out), (np.float32,))
    if tokens == 0 or n_out == 0:
        return
    if tokens == 1:
        kernel, words = _gemv(weight)
        kernel[cdiv(n_out, _GEMV_ROWS), _GEMV_THREADS, stream](x, words, weight.scales, bias, out)
        return
    bm, bn = _gemm_tiles(tokens, n_out)
    grid = (cdiv(n_out, bn), cdiv(tokens, bm))
    kernel = _gemm_kernel(weight.kind, weight.group, bm, bn)
    kernel[grid, _GEMM_THREADS, stream](x, weight.data, weight.scales, bias, out)


def _gemv(weight: DeviceWeight) -> tuple[CudaFunction, DeviceArray]:
    """The GEMV for `weight` and the words it reads the rows as (as wide as the row length allows)."""
    data = weight.data
    if weight.kind is WeightKind.INT4:
        check(data.is_c_contiguous(), "an int4 weight's rows must be contiguous (whole 8-byte words)")
        return _gemv_int4_kernel(weight.group), data.view(INT4_WORD)
    lanes = packed_lanes(weight.kind, weight.shape[1]) if data.is_c_contiguous() else 1
    return _gemv_kernel(weight.kind, lanes), data if lanes == 1 else data.view(packed_word(weight.kind, lanes))
