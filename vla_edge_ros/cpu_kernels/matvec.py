"""out[T, N] = x[T, K] @ w[N, K].T (+ bias) for a few tokens: one pass over the weight bytes, widened in registers.

Decoding is bound by reading the weights, so each kernel reads every weight byte once, turns it into fp32
in a register and multiply-adds it into fp32 sums; a row serves all T tokens while it sits in L1. Rows are
split over threads by ``prange``. ``bias`` is an empty array when there is none, so each kernel compiles once.
bf16 reads a row as weight pairs (``_split_pairs``). From ``_SHARED_WIDTH`` inputs x no longer stays in L1
beside the streamed rows, so bf16 and int8 sum several rows a pass over x; on narrow rows that was 2.6x
slower (each short run of a row restarts the hardware's stream), so those keep one row a pass.
int8 (and int4 in groups of 64 or 128, a group at a time) is the exception to fp32 sums: each token is
rounded to int16 once a call and each row summed exactly in integers, int16 times int8 (``vpdpwssd``: 2
instructions per 32 weights against 3 per 16 for widening to fp32 and a fused multiply-add); the rounding
moves a product by at most 2 ** -16 of the token's largest |x| times
the row's absolute sum (rms 3e-5 of the outputs on normal tokens, 4e-4 with spikes of 3000 among 8960
inputs; the weights' own rounding: int8 8e-3 to 9e-3, int4 9e-2 to 1e-1).
(Software prefetch of the next row's lines was tried and measured 10-35% slower; the hardware streams.)
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._intrinsics import (INT8_CHUNK, INT8_CHUNK_ROWS, INT8_ROWS, INT8_STEP, INT8_STEP_ROWS, bf16_high, bf16_low,
                          dot_int16_int4_g64_avx512, dot_int16_int4_g128_avx512, dot_int16_int8_avx512,
                          dot_rows_int16_int8_avx512, high_nibble, low_nibble, madd_int16_int8)

_FLAGS = dict(fastmath={"reassoc", "contract"}, cache=True, nogil=True)  # sums reorder; no "nnan": NaN shows
_ROWS_A_CHUNK = 64  # rows sharing one scratch buffer
_SHARED_WIDTH = 4096  # from here (bf16's x: 16 KiB of fp32, half of L1) rows share x passes: bf16 8, int8 16
_INT16_LEVELS = np.float32(32767.0)  # a token's largest |x| becomes this
_INT16_TINY = np.float32(1e-30)  # below this largest |x|, 32767 / it may overflow: such a token stays fp32
_INT8_BLOCK = 512  # products an int32 sum takes in ``_dot_int16_int8``: 512 * 32767 * 128 < 2 ** 31
_FINITE_BITS = np.uint32(0x7F800000)  # |x|'s bits at or past this: inf or NaN


@njit(**_FLAGS)
def _dot_float32(x, row):
    acc = np.float32(0.0)
    for k in range(x.shape[0]):
        acc += x[k] * row[k]
    return acc


@njit(**_FLAGS)
def _split_pairs(x):
    """x [T, K] as its even and its odd inputs, [T, K // 2] each: the fp32 partners of bf16 words' halves."""
    tokens, width = x.shape
    x_even = np.empty((tokens, width // 2), dtype=np.float32)
    x_odd = np.empty((tokens, width // 2), dtype=np.float32)
    for t in range(tokens):
        for j in range(width // 2):
            x_even[t, j] = x[t, 2 * j]
            x_odd[t, j] = x[t, 2 * j + 1]
    return x_even, x_odd


@njit(**_FLAGS)
def _dot_bfloat16(x_even, x_odd, words):
    acc = np.float32(0.0)
    for j in range(words.shape[0]):
        acc += x_even[j] * bf16_low(words[j]) + x_odd[j] * bf16_high(words[j])
    return acc


@njit(**_FLAGS)
def _dot_bfloat16_8(x_even, x_odd, w0, w1, w2, w3, w4, w5, w6, w7):
    """Eight rows' word sums in one pass, each x load serving all eight (``_SHARED_WIDTH``)."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0.0)
    for j in range(w0.shape[0]):
        even, odd = x_even[j], x_odd[j]
        s0 += even * bf16_low(w0[j]) + odd * bf16_high(w0[j])
        s1 += even * bf16_low(w1[j]) + odd * bf16_high(w1[j])
        s2 += even * bf16_low(w2[j]) + odd * bf16_high(w2[j])
        s3 += even * bf16_low(w3[j]) + odd * bf16_high(w3[j])
        s4 += even * bf16_low(w4[j]) + odd * bf16_high(w4[j])
        s5 += even * bf16_low(w5[j]) + odd * bf16_high(w5[j])
        s6 += even * bf16_low(w6[j]) + odd * bf16_high(w6[j])
        s7 += even * bf16_low(w7[j]) + odd * bf16_high(w7[j])
    return s0, s1, s2, s3, s4, s5, s6, s7


@njit(**_FLAGS)
def _dot_int8(x, row):
    acc = np.float32(0.0)
    for k in range(x.shape[0]):
        acc += x[k] * np.float32(row[k])
    return acc


@njit(**_FLAGS)
def _dot_int16_int8(xq, row):
    """sum(xq * row) exactly: int32 sums of ``_INT8_BLOCK`` products (LLVM: ``vpmaddwd``), added in int64."""
    total = np.int64(0)
    for start in range(0, row.shape[0], _INT8_BLOCK):
        x_block = xq[start:start + _INT8_BLOCK]  # slices: indices LLVM knows are >= 0, so no gathers
        row_block = row[start:start + _INT8_BLOCK]
        part = np.int32(0)
        for k in range(row_block.shape[0]):
            part = madd_int16_int8(part, x_block[k], row_block[k])
        total += part
    return total


@njit(**_FLAGS)
def _dot_int16_int8_wide(xq, q, n):
    """Row n's ``_dot_int16_int8`` through ``dot_int16_int8_avx512`` (AVX-512BW) but for the last inputs
    short of a step."""
    width = q.shape[1]
    main = width - width % INT8_STEP
    total = np.int64(0)
    for start in range(0, main, INT8_CHUNK):
        total += dot_int16_int8_avx512(xq, q, n, start, min(start + INT8_CHUNK, main))
    return total + _dot_int16_int8(xq[main:], q[n][main:])


@njit(**_FLAGS)
def _int8_rows(x, xq, step, q, scales, n, out):
    """Rows n to n + ``INT8_ROWS`` - 1 of one token into ``out`` (that token's outputs), x loaded once for all."""
    if not step:
        for i in range(n, n + INT8_ROWS):
            out[i] = _dot_int8(x, q[i]) * scales[i]
        return
    width = q.shape[1]
    main = width - width % INT8_STEP_ROWS
    totals = np.zeros(INT8_ROWS, dtype=np.int64)
    for start in range(0, main, INT8_CHUNK_ROWS):
        sums = dot_rows_int16_int8_avx512(xq, q, n, start, min(start + INT8_CHUNK_ROWS, main))
        for i in range(INT8_ROWS):
            totals[i] += sums[i]
    for i in range(INT8_ROWS):
        total = totals[i] + _dot_int16_int8(xq[main:], q[n + i][main:])
        out[n + i] = np.float32(total) * (step * scales[n + i])


@njit(**_FLAGS)
def _quantize_tokens(x, padded):
    """Each token as int16 [T, padded >= K] (zeros past K) and its step [T] (x ~ step * xq): the step is its
    largest |x| / 32767, so rounding moves an input by at most step / 2, 2 ** -16 of that largest |x|. A
    token whose largest |x| is not finite, zero or tiny gets step 0: the kernels then take it through fp32
    products (NaN and inf show)."""
    tokens, width = x.shape
    xq = np.zeros((tokens, padded), dtype=np.int16)
    steps = np.zeros(tokens, dtype=np.float32)
    bits = x.view(np.uint32)
    top = np.zeros(1, dtype=np.uint32)  # a token's largest |x|, as bits and (the view) as fp32
    largest = top.view(np.float32)
    for t in range(tokens):
        top[0] = 0
        for k in range(width):  # |x|'s bits order as |x| does, NaN above inf: an integer max, vectorized
            top[0] = max(top[0], bits[t, k] & np.uint32(0x7FFFFFFF))
        if top[0] >= _FINITE_BITS or not largest[0] >= _INT16_TINY:
            continue
        inverse = _INT16_LEVELS / largest[0]  # |x| * 32767 / largest, in either order, rounds to <= 32767
        for k in range(width):
            xq[t, k] = np.int16(np.rint(x[t, k] * inverse))
        steps[t] = largest[0] / _INT16_LEVELS
    return xq, steps


@njit(**_FLAGS, inline="always")
def _dot_int4_groups(x, row, row_scales, groups, half):
    """The whole groups of a row; inlined with ``half`` a constant, so LLVM unrolls the group (2x faster)."""
    acc = np.float32(0.0)
    for g in range(groups):
        first = 2 * half * g
        part = np.float32(0.0)
        for j in range(half):
            byte = row[half * g + j]
            part += x[first + j] * low_nibble(byte) + x[first + half + j] * high_nibble(byte)
        acc += part * row_scales[g]
    return acc


@njit(**_FLAGS)
def _dot_int4(x, row, row_scales, group):
    """Groups of 64 or 128: byte j of a group holds input j in its low nibble, input j + group / 2 in its high."""
    width = x.shape[0]
    groups = width // group
    if group == 64:
        acc = _dot_int4_groups(x, row, row_scales, groups, 32)
    else:
        acc = _dot_int4_groups(x, row, row_scales, groups, 64)
    start = groups * group
    if start < width:  # a last group shorter than ``group``: its zero padding is never read
        half = group // 2
        part = np.float32(0.0)
        for k in range(start, width):
            j = k - start
            byte = row[groups * half + j % half]
            part += x[k] * (high_nibble(byte) if j >= half else low_nibble(byte))
        acc += part * row_scales[groups]
    return acc


@njit(**_FLAGS)
def _add_bias(bias, out):
    """After the products, not inside their loop: a bias branch there cost int8 30% (1 thread)."""
    if bias.shape[0]:
        for t in range(out.shape[0]):
            out[t] += bias


@njit(**_FLAGS)
def _dot_int4_spread(x_low, x_high, row, spread_scales):
    """A row against x in byte order, each byte's scale beside it: one long loop, whatever the group."""
    acc = np.float32(0.0)
    for b in range(row.shape[0]):
        byte = row[b]
        acc += (x_low[b] * low_nibble(byte) + x_high[b] * high_nibble(byte)) * spread_scales[b]
    return acc


@njit(**_FLAGS, parallel=True)
def matvec_float32(x, w, bias, out):
    for n in prange(w.shape[0]):
        for t in range(x.shape[0]):
            out[t, n] = _dot_float32(x[t], w[n])
    _add_bias(bias, out)


@njit(**_FLAGS, parallel=True)
def matvec_bfloat16(x, w, bias, out):
    """An even width only: rows read as weight pairs (uint32 words) against x split in even and odd inputs
    (``_split_pairs``); from ``_SHARED_WIDTH`` inputs, eight rows at a time, the rest one by one."""
    x_even, x_odd = _split_pairs(x)
    words = w.view(np.uint32)
    rows = w.shape[0]
    eights = rows // 8 if w.shape[1] >= _SHARED_WIDTH else 0
    for e in prange(eights):
        n = 8 * e
        for t in range(x.shape[0]):
            sums = _dot_bfloat16_8(x_even[t], x_odd[t], words[n], words[n + 1], words[n + 2], words[n + 3],
                                   words[n + 4], words[n + 5], words[n + 6], words[n + 7])
            for i in range(8):
                out[t, n + i] = sums[i]
    for n in prange(8 * eights, rows):
        for t in range(x.shape[0]):
            out[t, n] = _dot_bfloat16(x_even[t], x_odd[t], words[n])
    _add_bias(bias, out)


@njit(**_FLAGS, parallel=True)
def matvec_int8(x, q, scales, bias, out):
    """Each token rounded to int16 once (``_quantize_tokens``), each row summed exactly in integers by
    ``vpdpwssd`` and scaled once: needs ``AVX512BW`` (``matvec_int8_portable`` gives the same bits)."""
    xq, steps = _quantize_tokens(x, x.shape[1])
    rows = q.shape[0]
    groups = rows // INT8_ROWS if q.shape[1] >= _SHARED_WIDTH else 0
    for g in prange(groups):
        for t in range(x.shape[0]):
            _int8_rows(x[t], xq[t], steps[t], q, scales, INT8_ROWS * g, out[t])
    for n in prange(INT8_ROWS * groups, rows):
        for t in range(x.shape[0]):
            if steps[t]:
                out[t, n] = np.float32(_dot_int16_int8_wide(xq[t], q, n)) * (steps[t] * scales[n])
            else:
                out[t, n] = _dot_int8(x[t], q[n]) * scales[n]
    _add_bias(bias, out)


@njit(**_FLAGS, parallel=True)
def matvec_int8_portable(x, q, scales, bias, out):
    """``matvec_int8`` on any CPU: the same integer sums, as LLVM vectorizes them for the host."""
    xq, steps = _quantize_tokens(x, x.shape[1])
    for n in prange(q.shape[0]):
        for t in range(x.shape[0]):
            if steps[t]:
                out[t, n] = np.float32(_dot_int16_int8(xq[t], q[n])) * (steps[t] * scales[n])
            else:
                out[t, n] = _dot_int8(x[t], q[n]) * scales[n]
    _add_bias(bias, out)


@njit(**_FLAGS, parallel=True)
def matvec_int4(x, packed, scales, group, bias, out):
    for n in prange(packed.shape[0]):
        for t in range(x.shape[0]):
            out[t, n] = _dot_int4(x[t], packed[n], scales[n], group)
    _add_bias(bias, out)


@njit(**_FLAGS, parallel=True)
def matvec_int4_avx512(x, packed, scales, group, bias, out):
    """int4 in groups of 64 or 128 as int8 is: each token rounded to int16 once (padded with zeros to whole
    groups), each group's nibbles summed exactly in integers (``vpdpwssd``), times its scale in fp32.
    Needs ``AVX512BW``; ``matvec_int4`` is the portable kernel."""
    xq, steps = _quantize_tokens(x, scales.shape[1] * group)
    for n in prange(packed.shape[0]):
        for t in range(x.shape[0]):
            if not steps[t]:
                out[t, n] = _dot_int4(x[t], packed[n], scales[n], group)
            elif group == 64:
                out[t, n] = dot_int16_int4_g64_avx512(xq[t], packed, scales, n) * steps[t]
            else:
                out[t, n] = dot_int16_int4_g128_avx512(xq[t], packed, scales, n) * steps[t]
    _add_bias(bias, out)


@njit(**_FLAGS, parallel=True)
def matvec_int4_group32(x, packed, scales, bias, out):
    """int4 in groups of 32: a 16-byte group loop is one vector, and LLVM then vectorizes across groups with
    byte inserts (1.7 G weights/s in L2); x in byte order (zeros past its end) and each row's scales spread
    to one a byte keep a single long loop (9.7 G weights/s; 64 and 128 are faster the other way)."""
    tokens, width = x.shape
    row_bytes = packed.shape[1]
    x_low = np.zeros((tokens, row_bytes), dtype=np.float32)
    x_high = np.zeros((tokens, row_bytes), dtype=np.float32)
    for t in range(tokens):
        for b in range(row_bytes):
            first = 32 * (b // 16) + b % 16
            if first < width:
                x_low[t, b] = x[t, first]
            if first + 16 < width:
                x_high[t, b] = x[t, first + 16]
    chunks = -(-packed.shape[0] // _ROWS_A_CHUNK)
    for c in prange(chunks):
        spread = np.empty(row_bytes, dtype=np.float32)
        for n in range(c * _ROWS_A_CHUNK, min(packed.shape[0], (c + 1) * _ROWS_A_CHUNK)):
            for g in range(scales.shape[1]):
                spread[16 * g:16 * g + 16] = scales[n, g]
            for t in range(tokens):
                out[t, n] = _dot_int4_spread(x_low[t], x_high[t], packed[n], spread)
    _add_bias(bias, out)
