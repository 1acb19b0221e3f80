"""Element-wise kernels between the matmuls: SwiGLU activation and the residual add."""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from vla_edge_ros.kernels._launch import DeviceArray, Stream, cdiv, check_array, dims

_THREADS = 256


@cuda.jit
def _swiglu_kernel(gate_up, out):
    inter = out.shape[1]
    idx = cuda.grid(1)
    if idx < out.size:
        t = idx // inter
        i = idx - t * inter
        gate = gate_up[t, i]
        out[t, i] = gate / (float32(1) + math.exp(-gate)) * gate_up[t, inter + i]


@cuda.jit
def _add_kernel(x, y):
    cols = x.shape[1]
    idx = cuda.grid(1)
    if idx < x.size:
        t = idx // cols
        c = idx - t * cols
        x[t, c] += y[t, c]


def swiglu(gate_up: DeviceArray, out: DeviceArray, stream: Stream = 0) -> None:
    """out = silu(gate) * up, with gate = gate_up[:, :I] and up = gate_up[:, I:] (fused gate/up)."""
    tokens, inter = dims(out, "out", 2)
    check_array(gate_up, "gate_up", (tokens, 2 * inter), (np.float32,))
    check_array(out, "out", (tokens, inter), (np.float32,))
    if out.size:
        _swiglu_kernel[cdiv(out.size, _THREADS), _THREADS, stream](gate_up, out)


def add_inplace(x: DeviceArray, y: DeviceArray, stream: Stream = 0) -> None:
    """Residual connection: x += y."""
    check_array(x, "x", (None, None), (np.float32,))
    check_array(y, "y", tuple(x.shape), (np.float32,))
    if x.size:
        _add_kernel[cdiv(x.size, _THREADS), _THREADS, stream](x, y)
