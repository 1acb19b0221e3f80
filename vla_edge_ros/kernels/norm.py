"""Row norms, all in fp32: RMSNorm as in Qwen2/HF (x * rsqrt(mean(x^2) + eps) * weight), and LayerNorm
with weight and bias (the Qwen2-VL vision tower's blocks and patch merger)."""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32

from vla_edge_ros.kernels._launch import CudaFunction, DeviceArray, Stream, check_array, dims
from vla_edge_ros.kernels._reduce import tree_sum_rows

_MAX_THREADS = 128
_MIN_THREADS = 32  # a warp
_VALUES_PER_THREAD = 8


def _row_threads(hidden: int) -> int:
    """Threads per row: a power of two giving each thread about 8 values, from one warp up to 128."""
    wanted = max(1, hidden // _VALUES_PER_THREAD)
    return min(_MAX_THREADS, max(_MIN_THREADS, 1 << (wanted - 1).bit_length()))


@functools.cache
def _rmsnorm_kernel(threads: int) -> CudaFunction:
    @cuda.jit
    def rmsnorm(x, weight, eps, out):
        # One block per row: the row's sum of squares is a block reduction, then each thread scales
        # the elements it summed (the row stays in L1/L2 between the two passes).
        buf = cuda.shared.array((1, threads), float32)
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        hidden = x.shape[1]
        acc = float32(0)
        for h in range(tid, hidden, threads):
            v = x[row, h]
            acc += v * v
        buf[0, tid] = acc
        tree_sum_rows(buf, tid)
        inv_rms = float32(1) / math.sqrt(buf[0, 0] / float32(hidden) + eps)
        for h in range(tid, hidden, threads):
            out[row, h] = x[row, h] * inv_rms * weight[h]

    return rmsnorm


def rmsnorm(
    x: DeviceArray, weight: DeviceArray, eps: float, out: DeviceArray, stream: Stream = 0
) -> None:
    """Normalise each row of x[T, H] into out (out may be x); weight is an fp32 vector [H]."""
    tokens, hidden = dims(x, "x", 2)
    check_array(x, "x", (tokens, hidden), (np.float32,))
    check_array(weight, "weight", (hidden,), (np.float32,))
    check_array(out, "out", (tokens, hidden), (np.float32,))
    if tokens == 0:
        return
    threads = _row_threads(hidden)
    _rmsnorm_kernel(threads)[tokens, threads, stream](x, weight, np.float32(eps), out)


@functools.cache
def _layernorm_kernel(threads: int) -> CudaFunction:
    @cuda.jit
    def layernorm(x, weight, bias, eps, out):
        # One block per row, two passes over it: the mean, then the variance about the mean (not
        # E[x^2] - mean^2, which cancels badly when the mean is large next to the spread).
        mean_buf = cuda.shared.array((1, threads), float32)
        var_buf = cuda.shared.array((1, threads), float32)
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        hidden = x.shape[1]
        acc = float32(0)
        for h in range(tid, hidden, threads):
            acc += x[row, h]
        mean_buf[0, tid] = acc
        tree_sum_rows(mean_buf, tid)
        mean = mean_buf[0, 0] / float32(hidden)
        acc = float32(0)
        for h in range(tid, hidden, threads):
            centred = x[row, h] - mean
            acc += centred * centred
        var_buf[0, tid] = acc
        tree_sum_rows(var_buf, tid)
        inv_std = float32(1) / math.sqrt(var_buf[0, 0] / float32(hidden) + eps)
        for h in range(tid, hidden, threads):
            out[row, h] = (x[row, h] - mean) * inv_std * weight[h] + bias[h]

    return layernorm


def layernorm(
    x: DeviceArray,
    weight: DeviceArray,
    bias: DeviceArray,
    eps: float,
    out: DeviceArray,
    stream: Stream = 0,
) -> None:
    """(x - mean) / sqrt(var + eps) * weight + bias per row of x[T, H] into out (out may be x); the
    variance is the biased one, as torch's LayerNorm; weight and bias are fp32 vectors [H]."""
    tokens, hidden = dims(x, "x", 2)
    check_array(x, "x", (tokens, hidden), (np.float32,))
    check_array(weight, "weight", (hidden,), (np.float32,))
    check_array(bias, "bias", (hidden,), (np.float32,))
    check_array(out, "out", (tokens, hidden), (np.float32,))
    if tokens == 0:
        return
    threads = _row_threads(hidden)
    _layernorm_kernel(threads)[tokens, threads, stream](x, weight, bias, np.float32(eps), out)
