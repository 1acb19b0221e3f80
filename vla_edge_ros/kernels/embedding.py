"""Token embedding lookup: gather rows of the (possibly fp16/bf16) table into fp32 activations."""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from vla_edge_ros.kernels._launch import CudaFunction, DeviceArray, Stream, cdiv, check_array, dims
from vla_edge_ros.kernels._loads import widen
from vla_edge_ros.kernels.dtypes import WeightKind, weight_kind_of

_THREADS = 256


@functools.cache
def _gather_kernel(kind: WeightKind) -> CudaFunction:
    widen_weight = widen(kind)

    @cuda.jit
    def gather(table, ids, out):
        t = cuda.blockIdx.y
        h = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if h < out.shape[1]:
            out[t, h] = widen_weight(table[ids[t], h])

    return gather


def embedding_gather(
    table: DeviceArray, ids: DeviceArray, out: DeviceArray, stream: Stream = 0
) -> None:
    """out[t, :] = table[ids[t], :] widened to fp32. Every id must lie in [0, V)."""
    hidden = dims(table, "table", 2)[1]
    (tokens,) = dims(ids, "ids", 1)
    check_array(ids, "ids", (tokens,), (np.int32,))
    check_array(out, "out", (tokens, hidden), (np.float32,))
    if tokens == 0:
        return
    kernel = _gather_kernel(weight_kind_of(table))
    kernel[(cdiv(hidden, _THREADS), tokens), _THREADS, stream](table, ids, out)
