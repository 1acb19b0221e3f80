"""x @ w.T (+ bias) for a ``PackedMatrix``: compiled matrix-vector kernels to decode, BLAS over blocks to prefill."""

from __future__ import annotations

import threading

import numpy as np

from vla_edge_ros.numerics.weight_formats import PackedMatrix

from . import dequantize, matvec
from ._intrinsics import AVX512BW
from .threads import launch

DECODE_TOKENS = 8
"""Up to this many tokens a product goes through ``matvec`` (fp32 too); past it, ``_prefill`` (package docstring)."""
_BLOCK_BYTES = 1 << 22  # fp32 rows widened a BLAS call: 1 MiB blocks were 4-15% slower at T = 70
_NO_BIAS = np.zeros(0, dtype=np.float32)
_MATVEC_INT8 = matvec.matvec_int8 if AVX512BW else matvec.matvec_int8_portable
_scratch = threading.local()


def linear(x: np.ndarray, matrix: PackedMatrix, bias: np.ndarray | None = None,
           out: np.ndarray | None = None) -> np.ndarray:
    """out [T, out] = x [T, in] @ w.T (+ bias [out]) in fp32: ``reference_linear`` up to fp32 rounding.

    ``out``, when given, must be a C-contiguous fp32 [T, out] array; it is filled and returned."""
    rows, width = matrix.shape
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != width:
        raise ValueError(f"x must be [T, {width}] for a [{rows}, {width}] matrix, got shape {list(x.shape)}")
    tokens = x.shape[0]
    if out is None:
        out = np.empty((tokens, rows), dtype=np.float32)
    elif out.shape != (tokens, rows) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float32 [{tokens}, {rows}] array, got "
                         f"{out.dtype} {list(out.shape)}")
    if bias is not None:
        bias = np.ascontiguousarray(bias, dtype=np.float32)
        if bias.shape != (rows,):
            raise ValueError(f"bias must be [{rows}], got shape {list(bias.shape)}")
    odd_bfloat16 = matrix.format == "bfloat16" and width % 2  # its kernel reads weight pairs; no model has one
    if tokens > DECODE_TOKENS or (tokens and odd_bfloat16):
        _prefill(x, matrix, out)
        if bias is not None:
            out += bias
    elif tokens:
        _decode(x, matrix, _NO_BIAS if bias is None else bias, out)
    return out


def _decode(x: np.ndarray, matrix: PackedMatrix, bias: np.ndarray, out: np.ndarray) -> None:
    with launch():
        if matrix.format == "float32":
            matvec.matvec_float32(x, matrix.data, bias, out)
        elif matrix.format == "bfloat16":
            matvec.matvec_bfloat16(x, matrix.data, bias, out)
        elif matrix.format == "int8":
            _MATVEC_INT8(x, matrix.data, matrix.scales, bias, out)
        elif matrix.format == "int4" and matrix.group == 32:
            matvec.matvec_int4_group32(x, matrix.data, matrix.scales, bias, out)
        elif matrix.format == "int4" and AVX512BW:
            matvec.matvec_int4_avx512(x, matrix.data, matrix.scales, matrix.group, bias, out)
        elif matrix.format == "int4":
            matvec.matvec_int4(x, matrix.data, matrix.scales, matrix.group, bias, out)
        else:
            raise ValueError(f"unknown weight format {matrix.format!r}")


def _prefill(x: np.ndarray, matrix: PackedMatrix, out: np.ndarray) -> None:
    """BLAS on fp32 blocks of rows, each widened into this thread's reusable buffer just before use.

    Each block is multiplied as ``w @ x.T`` and the small [rows, T] result transposed into ``out``: OpenBLAS
    runs that 1.5x faster than ``x @ w.T`` for 16 tokens (768 x 128 bf16: 54 against 83 us, the 1.5B
    shape's gate/up 26 against 38 ms) and as fast for 70, one thread."""
    if matrix.format == "float32":
        np.copyto(out, np.matmul(matrix.data, x.T).T)
        return
    rows, width = matrix.shape
    step = min(rows, max(1, _BLOCK_BYTES // (4 * width)))
    buffer = _buffer(step * width)
    for first in range(0, rows, step):
        count = min(step, rows - first)
        block = buffer[:count * width].reshape(count, width)
        if matrix.format == "bfloat16":
            dequantize.rows_bfloat16(matrix.data, first, block)
        elif matrix.format == "int8":
            dequantize.rows_int8(matrix.data, matrix.scales, first, block)
        elif matrix.format == "int4":
            dequantize.rows_int4(matrix.data, matrix.scales, matrix.group, first, block)
        else:
            raise ValueError(f"unknown weight format {matrix.format!r}")
        np.copyto(out[:, first:first + count], np.matmul(block, x.T).T)


def _buffer(size: int) -> np.ndarray:
    """This thread's fp32 scratch of at least ``size`` elements, kept between calls (no page faults a call)."""
    buffer = getattr(_scratch, "buffer", None)
    if buffer is None or buffer.shape[0] < size:
        buffer = _scratch.buffer = np.empty(size, dtype=np.float32)
    return buffer
