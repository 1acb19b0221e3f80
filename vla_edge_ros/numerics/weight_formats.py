"""Weight matrices in fewer bytes: bf16, int8 and int4 layouts, how to pack them, and their NumPy twins.

Decoding one token reads every weight once, so its time is the weights' bytes over the memory bandwidth.
A matrix ``w`` [out, in] (HF's layout: one row per output feature) is kept in one of four formats:

- ``float32``: 4 bytes a weight, the reference.
- ``bfloat16``: 2 bytes, the uint16 bit pattern (NumPy has no bf16); exact for a bf16 checkpoint.
- ``int8``: 1 byte, symmetric per output channel: ``w[n, k] ~ scales[n] * q[n, k]``, q in [-127, 127],
  ``scales[n] = max_k |w[n, k]| / 127``. One scale a row lets a kernel sum a whole row in int-times-float
  and scale once at the end.
- ``int4``: half a byte, symmetric per group of ``group`` inputs (32-128; Q4_0 / GPTQ / AWQ's grouping):
  ``w[n, k] ~ scales[n, k // group] * q[n, k]``, q in [-8, 7]. ``data`` [out, groups * group / 2] holds
  each group in ``group / 2`` bytes: byte j of a group carries input j in its low nibble and input
  j + group / 2 in its high one, each as ``q + 8`` (ggml's Q4_0 order, so a kernel reads two contiguous
  runs of x against one run of bytes). A last group shorter than ``group`` is padded with zeros.
  Each group's scale is the one of a few candidates that leaves the least squared error (the absolute
  maximum over 7, 7.25, ... 10), as llama.cpp's quantizers search; a kernel never sees the search.

Every scale is fp32 and counts in ``nbytes``: int8 costs 1 + 4 / in bytes a weight, int4 at group 64
0.5625. ``dequantize`` is the twin every compiled or CUDA kernel over these layouts is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .bf16 import bf16_bits, bf16_bits_to_float32

FORMATS = ("float32", "bfloat16", "int8", "int4")
"""What a matrix can be held in; ``reasoning.weights`` adds ``auto`` (keep the checkpoint's dtype)."""
INT4_GROUPS = (32, 64, 128)
DEFAULT_INT4_GROUP = 64
_INT4_CANDIDATES = np.arange(7.0, 10.01, 0.25, dtype=np.float32)  # scale candidates: amax / c


@dataclass(frozen=True)
class PackedMatrix:
    """A weight matrix [out, in] in one of ``FORMATS`` (see the module docstring for each layout)."""

    format: str
    shape: tuple[int, int]  # [out, in], as the matrix is used, whatever the stored layout
    data: np.ndarray  # float32 / uint16 [out, in]; int8 [out, in]; uint8 [out, groups * group / 2]
    scales: np.ndarray | None = None  # int8 [out]; int4 [out, groups]; None otherwise
    group: int = 0  # int4's inputs per scale

    @property
    def nbytes(self) -> int:
        """The bytes a kernel reads to use the whole matrix once: data and scales."""
        return self.data.nbytes + (0 if self.scales is None else self.scales.nbytes)

    @property
    def groups(self) -> int:
        return 0 if not self.group else -(-self.shape[1] // self.group)


def matrix_bytes(rows: int, cols: int, fmt: str, group: int = DEFAULT_INT4_GROUP) -> int:
    """The bytes a [rows, cols] matrix takes in format ``fmt``: ``PackedMatrix.nbytes`` before it is packed,
    so a memory plan counts what a backend will hold."""
    if fmt == "int4":
        groups = -(-cols // group)
        return rows * groups * (group // 2) + rows * groups * 4
    per_weight = {"float32": 4, "bfloat16": 2, "int8": 1}
    if fmt not in per_weight:
        raise ValueError(f"weight format must be one of {FORMATS}, got {fmt!r}")
    return rows * cols * per_weight[fmt] + (rows * 4 if fmt == "int8" else 0)


def pack(weights: np.ndarray, fmt: str, group: int = DEFAULT_INT4_GROUP) -> PackedMatrix:
    """``weights`` [out, in] (fp32) in format ``fmt``; ``group`` is int4's group size."""
    w = np.ascontiguousarray(weights, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"a weight matrix is 2-D [out, in], got shape {list(w.shape)}")
    shape = (int(w.shape[0]), int(w.shape[1]))
    if fmt == "float32":
        return PackedMatrix(fmt, shape, w)
    if fmt == "bfloat16":
        return PackedMatrix(fmt, shape, bf16_bits(w))
    if fmt == "int8":
        scales = np.abs(w).max(axis=1, initial=0.0) / np.float32(127.0)
        safe = np.where(scales > 0, scales, np.float32(1.0))
        q = np.clip(np.rint(w / safe[:, None]), -127, 127).astype(np.int8)
        return PackedMatrix(fmt, shape, q, scales.astype(np.float32))
    if fmt == "int4":
        return _pack_int4(w, shape, group)
    raise ValueError(f"weight format must be one of {FORMATS}, got {fmt!r}")


def pack_bf16_bits(bits: np.ndarray) -> PackedMatrix:
    """A bf16 matrix [out, in] given as its uint16 bits (a bf16 checkpoint's tensor, unchanged)."""
    bits = np.ascontiguousarray(bits, dtype=np.uint16)
    return PackedMatrix("bfloat16", (int(bits.shape[0]), int(bits.shape[1])), bits)


def _pack_int4(w: np.ndarray, shape: tuple[int, int], group: int) -> PackedMatrix:
    if group not in INT4_GROUPS:
        raise ValueError(f"int4 group must be one of {INT4_GROUPS}, got {group}")
    rows, cols = shape
    groups = -(-cols // group)
    padded = np.zeros((rows, groups * group), dtype=np.float32)
    padded[:, :cols] = w
    blocks = padded.reshape(rows, groups, group)
    amax = np.abs(blocks).max(axis=2)  # [rows, groups]
    best_scale = np.zeros_like(amax)
    best_error = np.full_like(amax, np.inf)
    for divisor in _INT4_CANDIDATES:
        scale = amax / divisor
        safe = np.where(scale > 0, scale, np.float32(1.0))
        q = np.clip(np.rint(blocks / safe[..., None]), -8, 7)
        error = np.square(q * scale[..., None] - blocks).sum(axis=2)
        better = error < best_error
        best_scale = np.where(better, scale, best_scale)
        best_error = np.where(better, error, best_error)
    safe = np.where(best_scale > 0, best_scale, np.float32(1.0))
    nibbles = (np.clip(np.rint(blocks / safe[..., None]), -8, 7) + 8).astype(np.uint8)  # [rows, groups, group]
    half = group // 2
    data = (nibbles[..., :half] | (nibbles[..., half:] << np.uint8(4))).reshape(rows, groups * half)
    return PackedMatrix("int4", shape, np.ascontiguousarray(data), best_scale.astype(np.float32), group)


def dequantize(matrix: PackedMatrix) -> np.ndarray:
    """The fp32 matrix [out, in] that ``matrix`` stands for: what every kernel's product must equal."""
    rows, cols = matrix.shape
    if matrix.format == "float32":
        return matrix.data
    if matrix.format == "bfloat16":
        return bf16_bits_to_float32(matrix.data)
    if matrix.format == "int8":
        return matrix.data.astype(np.float32) * matrix.scales[:, None]
    if matrix.format == "int4":
        half = matrix.group // 2
        data = matrix.data.reshape(rows, matrix.groups, half)
        nibbles = np.concatenate((data & np.uint8(0x0F), data >> np.uint8(4)), axis=2).astype(np.float32) - 8.0
        return (nibbles * matrix.scales[..., None]).reshape(rows, -1)[:, :cols]
    raise ValueError(f"unknown weight format {matrix.format!r}")


def reference_linear(x: np.ndarray, matrix: PackedMatrix, bias: np.ndarray | None = None) -> np.ndarray:
    """x [T, in] @ w.T (+ bias) in fp32 through ``dequantize``: the NumPy twin of the compiled kernels."""
    out = np.asarray(x, dtype=np.float32) @ dequantize(matrix).T
    return out if bias is None else out + bias


def take_rows(matrix: PackedMatrix, rows: slice | np.ndarray) -> PackedMatrix:
    """Rows ``rows`` of ``matrix`` (a slice is a view: nothing is copied), in its format: a vocabulary range of
    lm_head, or the embedding rows of some tokens (``dequantize(take_rows(...))``)."""
    data = matrix.data[rows]
    scales = None if matrix.scales is None else matrix.scales[rows]
    return PackedMatrix(matrix.format, (int(data.shape[0]), matrix.shape[1]), data, scales, matrix.group)


def concat_rows(*matrices: PackedMatrix) -> PackedMatrix:
    """Matrices of one format and input width stacked along ``out`` (q/k/v, gate/up fused into one product).

    Every layout scales per row, so the stack of packed rows is the packed stack."""
    first = matrices[0]
    if any(m.format != first.format or m.shape[1] != first.shape[1] or m.group != first.group for m in matrices):
        raise ValueError("only matrices of one format, input width and group stack")
    scales = None if first.scales is None else np.concatenate([m.scales for m in matrices])
    rows = sum(m.shape[0] for m in matrices)
    return PackedMatrix(first.format, (rows, first.shape[1]), np.concatenate([m.data for m in matrices]),
                        scales, first.group)
