"""Element-wise kernels between the matmuls: SwiGLU, the vision tower's GELUs, and the residual add.

The GELUs follow torch: exact GELU is x/2 * (1 + erf(x / sqrt 2)) (nn.GELU(), the patch merger),
QuickGELU is x * sigmoid(1.702 x) (Qwen2-VL's ViT MLP); both in fp32 with fp32 constants.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from vla_edge_ros.kernels._launch import CudaFunction, DeviceArray, Stream, cdiv, check_array, dims

_THREADS = 256
_SQRT_HALF = np.float32(np.sqrt(0.5))
_QUICK_GELU_SLOPE = np.float32(1.702)


@cuda.jit(device=True)
def _gelu(value):
    return float32(0.5) * value * (float32(1) + math.erf(value * _SQRT_HALF))


@cuda.jit(device=True)
def _quick_gelu(value):
    return value / (float32(1) + math.exp(-_QUICK_GELU_SLOPE * value))


def _activation_kernel(activation: CudaFunction) -> CudaFunction:
    @cuda.jit
    def apply(x, out):
        cols = x.shape[1]
        idx = cuda.grid(1)
        if idx < x.size:
            t = idx // cols
            c = idx - t * cols
            out[t, c] = activation(x[t, c])

    return apply


_GELU_KERNEL = _activation_kernel(_gelu)
_QUICK_GELU_KERNEL = _activation_kernel(_quick_gelu)


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


def _activate(kernel: CudaFunction, x: DeviceArray, out: DeviceArray, stream: Stream) -> None:
    check_array(x, "x", (None, None), (np.float32,))
    check_array(out, "out", tuple(x.shape), (np.float32,))
    if x.size:
        kernel[cdiv(x.size, _THREADS), _THREADS, stream](x, out)


def gelu(x: DeviceArray, out: DeviceArray, stream: Stream = 0) -> None:
    """out = GELU(x), the exact (erf) form; out may be x."""
    _activate(_GELU_KERNEL, x, out, stream)


def quick_gelu(x: DeviceArray, out: DeviceArray, stream: Stream = 0) -> None:
    """out = x * sigmoid(1.702 x); out may be x."""
    _activate(_QUICK_GELU_KERNEL, x, out, stream)
