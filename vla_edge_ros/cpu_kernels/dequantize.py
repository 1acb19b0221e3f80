"""Rows of a packed matrix widened to fp32 into a caller's buffer: the prefill path's half of the work.

Prefill multiplies many tokens by each weight, so it is compute-bound and belongs to BLAS's sgemm; these
kernels only turn a block of rows into fp32 (exactly ``weight_formats.dequantize``'s values), block by
block, so no fp32 copy of the whole matrix is ever held.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._intrinsics import bf16_to_float32, high_nibble, low_nibble

_FLAGS = dict(cache=True, nogil=True)


@njit(**_FLAGS)
def rows_bfloat16(w, first, block):
    """block[i] = fp32 of bf16 row ``first + i``."""
    for i in range(block.shape[0]):
        row = w[first + i]
        for k in range(block.shape[1]):
            block[i, k] = bf16_to_float32(row[k])


@njit(**_FLAGS)
def rows_int8(q, scales, first, block):
    for i in range(block.shape[0]):
        row = q[first + i]
        scale = scales[first + i]
        for k in range(block.shape[1]):
            block[i, k] = np.float32(row[k]) * scale


@njit(**_FLAGS, inline="always")
def _int4_groups(row, row_scales, groups, half, out):
    """The whole groups of a row; inlined with ``half`` a constant, so LLVM unrolls each group."""
    for g in range(groups):
        scale = row_scales[g]
        for j in range(half):
            byte = row[half * g + j]
            out[2 * half * g + j] = low_nibble(byte) * scale
            out[2 * half * g + half + j] = high_nibble(byte) * scale


@njit(**_FLAGS)
def rows_int4(packed, scales, group, first, block):
    width = block.shape[1]
    half = group // 2
    groups = width // group
    for i in range(block.shape[0]):
        row = packed[first + i]
        row_scales = scales[first + i]
        out = block[i]
        if group == 64:
            _int4_groups(row, row_scales, groups, 32, out)
        elif group == 128:
            _int4_groups(row, row_scales, groups, 64, out)
        else:
            _int4_groups(row, row_scales, groups, 16, out)
        for k in range(groups * group, width):  # a last group shorter than ``group``
            j = k - groups * group
            byte = row[groups * half + j % half]
            out[k] = (high_nibble(byte) if j >= half else low_nibble(byte)) * row_scales[groups]
