"""Device functions that widen stored weight elements to fp32, specialised per WeightKind.

Kernels that read weights are built by factories that close over these functions, so each weight
kind gets its own compiled kernel with the conversion inlined instead of a branch per element.

bf16 -> fp32 is a bit reinterpretation: the fp32 pattern is the uint16 pattern shifted left by 16.
It is written as a store into a one-element local array viewed as another dtype: on a GPU, LLVM
folds that into register moves (no local memory; see test_kernels_ptx), and in the CUDA simulator
the same lines run as NumPy, so one code path serves both (libdevice's int_as_float has no
simulator implementation). fp16 uses the same view trick to split a packed word into halves.

Packed reads serve the bandwidth-bound decode GEMV: 16-bit weights are fetched four at a time as
one uint64 word, which cuts load instructions and index arithmetic per weight by four.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32, uint64

from vla_edge_ros.kernels._launch import CudaFunction
from vla_edge_ros.kernels.dtypes import WeightKind

PACKED_LANES = 4
"""16-bit weights per uint64 word in packed reads."""

PACKED_WORD = np.dtype(np.uint64)


@cuda.jit(device=True)
def _widen_fp32(value):
    return value


@cuda.jit(device=True)
def _widen_fp16(value):
    return float32(value)


@cuda.jit(device=True)
def _bits_to_float32(bits):
    word = cuda.local.array(1, np.uint32)
    word[0] = bits
    return word.view(np.float32)[0]


@cuda.jit(device=True)
def _widen_bf16(bits):
    return _bits_to_float32(uint32(bits) << uint32(16))


@cuda.jit(device=True)
def _lane_bf16x4(word, lane):
    high_half = (word >> uint64(16 * lane)) & uint64(0xFFFF)
    return _bits_to_float32(uint32(high_half) << uint32(16))


@cuda.jit(device=True)
def _lane_fp16x4(word, lane):
    halves = cuda.local.array(1, np.uint64)
    halves[0] = word
    return float32(halves.view(np.float16)[lane])


_WIDEN = {
    WeightKind.FP32: _widen_fp32,
    WeightKind.FP16: _widen_fp16,
    WeightKind.BF16: _widen_bf16,
}
_PACKED_LANE = {WeightKind.FP16: _lane_fp16x4, WeightKind.BF16: _lane_bf16x4}


def widen(kind: WeightKind) -> CudaFunction:
    """The device function `stored element -> float32` for weights of `kind`."""
    return _WIDEN[kind]


def can_pack(kind: WeightKind, row_length: int) -> bool:
    """Whether rows of `row_length` weights of `kind` can be read as whole uint64 words."""
    return kind in _PACKED_LANE and row_length % PACKED_LANES == 0


@functools.cache
def lane_reader(kind: WeightKind, packed: bool) -> CudaFunction:
    """Device function `(word, lane) -> float32` over the words a (packed) weight row is read as.

    Unpacked, a word is one stored element and `lane` is always 0.
    """
    if packed:
        return _PACKED_LANE[kind]
    widen_element = _WIDEN[kind]

    @cuda.jit(device=True)
    def read_element(word, lane):
        return widen_element(word)

    return read_element
