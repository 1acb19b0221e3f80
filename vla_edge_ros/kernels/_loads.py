"""Device functions that turn stored weights into fp32, specialised per WeightKind.

Kernels that read weights are built by factories that close over these functions, so each weight
kind gets its own compiled kernel with the conversion inlined instead of a branch per element.

bf16 -> fp32 is a bit reinterpretation: the fp32 pattern is the uint16 pattern shifted left by 16.
It is written as a store into a one-element local array viewed as another dtype: on a GPU, LLVM
folds that into register moves (no local memory; see test_kernels_ptx), and in the CUDA simulator
the same lines run as NumPy, so one code path serves both (libdevice's int_as_float has no
simulator implementation). fp16 uses the same view trick to split a packed word into halves.

int8 and int4 values come out of a word through the same reinterpretation: a small unsigned value v
OR-ed into the fp32 pattern of 2^23 is the float 2^23 + v, so subtracting 2^23 + offset yields
v - offset exactly (int8 is read as offset binary, its sign bit flipped, offset 128; a Q4_0 nibble is
q + 8, offset 8). That is one logic op and one add instead of an int-to-float conversion, which
runs at a quarter of the FMA rate: at int4's 0.56 bytes a weight an H100's bandwidth delivers about
6e12 weights a second, so the conversions, not the bytes, would bound decode. Scales are applied
by the kernels (per row at the end, or per group), not here.

Packed reads serve the bandwidth-bound decode GEMV: 16-bit weights are fetched four at a time as
one uint64 word, int8 eight (or four, as a uint32, where rows allow only that), which cuts load
instructions and index arithmetic per weight by as much.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32, uint64

from vla_edge_ros.kernels._launch import CudaFunction
from vla_edge_ros.kernels.dtypes import WeightKind

INT4_WORD = np.dtype(np.uint64)
"""What the int4 GEMV reads a row as: 8 bytes, 16 nibbles (every group's bytes are a whole number of words)."""
INT4_LANES = 16

_TWO_23 = 0x4B000000  # the fp32 bit pattern of 2^23: its low 23 bits hold an integer exactly
_PACKED_LANES = {WeightKind.FP16: (4,), WeightKind.BF16: (4,), WeightKind.INT8: (8, 4)}  # widest first


@cuda.jit(device=True)
def _widen_fp32(value):
    return value


@cuda.jit(device=True)
def _widen_fp16(value):
    return float32(value)


@cuda.jit(device=True)
def _widen_int8(value):
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
def _int8_from_byte(byte):
    """The int8 whose two's-complement byte is `byte` (uint32 < 256), as fp32."""
    return _bits_to_float32(byte ^ uint32(_TWO_23 | 0x80)) - float32(8388736.0)  # 2^23 + 128


@cuda.jit(device=True)
def int4_from_nibble(nibble):
    """The int4 q stored as the nibble q + 8 (uint32 < 16), as fp32."""
    return _bits_to_float32(nibble | uint32(_TWO_23)) - float32(8388616.0)  # 2^23 + 8


@cuda.jit(device=True)
def _lane_bf16x4(word, lane):
    high_half = (word >> uint64(16 * lane)) & uint64(0xFFFF)
    return _bits_to_float32(uint32(high_half) << uint32(16))


@cuda.jit(device=True)
def _lane_fp16x4(word, lane):
    halves = cuda.local.array(1, np.uint64)
    halves[0] = word
    return float32(halves.view(np.float16)[lane])


@cuda.jit(device=True)
def _lane_int8(word, lane):
    """Byte `lane` of a uint64 or uint32 word of int8s."""
    return _int8_from_byte(uint32((word >> uint64(8 * lane)) & uint64(0xFF)))


@cuda.jit(device=True)
def int4_lane(word, lane):
    """Weight `lane` of a uint64 word of 8 int4 byte pairs: lanes 0-7 are the bytes' low nibbles (8
    consecutive inputs), lanes 8-15 their high nibbles (the 8 inputs half a group further on)."""
    shift = 8 * (lane % 8) + 4 * (lane // 8)
    return int4_from_nibble(uint32((word >> uint64(shift)) & uint64(0xF)))


_WIDEN = {
    WeightKind.FP32: _widen_fp32,
    WeightKind.FP16: _widen_fp16,
    WeightKind.BF16: _widen_bf16,
    WeightKind.INT8: _widen_int8,
}
_PACKED_LANE = {WeightKind.FP16: _lane_fp16x4, WeightKind.BF16: _lane_bf16x4, WeightKind.INT8: _lane_int8}


def widen(kind: WeightKind) -> CudaFunction:
    """The device function `stored element -> float32` for weights of `kind` (int8: before its scale)."""
    return _WIDEN[kind]


def packed_lanes(kind: WeightKind, row_length: int) -> int:
    """How many weights of `kind` the GEMV reads per word from rows of `row_length`: 1 = unpacked."""
    return next((lanes for lanes in _PACKED_LANES.get(kind, ()) if row_length % lanes == 0), 1)


def packed_word(kind: WeightKind, lanes: int) -> np.dtype:
    """The unsigned word dtype that holds `lanes` stored weights of `kind`."""
    return np.dtype(f"u{lanes * kind.storage_dtype.itemsize}")


@functools.cache
def lane_reader(kind: WeightKind, lanes: int) -> CudaFunction:
    """Device function `(word, lane) -> float32` over the words a weight row is read as, `lanes` a word.

    Unpacked (`lanes` 1), a word is one stored element and `lane` is always 0.
    """
    if lanes > 1:
        return _PACKED_LANE[kind]
    widen_element = _WIDEN[kind]

    @cuda.jit(device=True)
    def read_element(word, lane):
        return widen_element(word)

    return read_element


@functools.cache
def element_reader(kind: WeightKind, group: int) -> CudaFunction:
    """Device function `(data, scales, n, k) -> float32`: weight [n, k] of a matrix of `kind`, scaled.

    What the GEMM's tile loads and the embedding gather use: one weight at a time, any row length.
    Float kinds ignore `scales` (None); int4 reads the byte that holds input k of its group (`group` inputs).
    """
    if kind is WeightKind.INT4:
        half = group // 2

        @cuda.jit(device=True)
        def read_int4(data, scales, n, k):
            g = k // group
            j = k - g * group
            high = j >= half
            byte = uint32(data[n, g * half + (j - half if high else j)])
            nibble = byte >> uint32(4) if high else byte & uint32(0xF)
            return int4_from_nibble(nibble) * scales[n, g]

        return read_int4
    widen_element = _WIDEN[kind]
    if kind is WeightKind.INT8:

        @cuda.jit(device=True)
        def read_int8(data, scales, n, k):
            return widen_element(data[n, k]) * scales[n]

        return read_int8

    @cuda.jit(device=True)
    def read_float(data, scales, n, k):
        return widen_element(data[n, k])

    return read_float
