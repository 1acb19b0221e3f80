"""Token embedding lookup: gather rows of the table (fp32, fp16, bf16, or int8 / int4 with their scales: a
tied lm_head's one copy) into fp32 activations."""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from vla_edge_ros.kernels._launch import CudaFunction, DeviceArray, Stream, cdiv, check_array, dims
from vla_edge_ros.kernels._loads import element_reader
from vla_edge_ros.kernels.dtypes import DeviceWeight, WeightKind, as_device_weight

_THREADS = 256


@functools.cache
def _gather_kernel(kind: WeightKind, group: int) -> CudaFunction:
    read_weight = element_reader(kind, group)

    @cuda.jit
    def gather(table, scales, ids, out):
        t = cuda.blockIdx.y
        h = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if h < out.shape[1]:
            out[t, h] = read_weight(table, scales, ids[t], h)

    return gather


def embedding_gather(
    table: DeviceWeight | DeviceArray, ids: DeviceArray, out: DeviceArray, stream: Stream = 0
) -> None:
    """out[t, :] = table[ids[t], :] widened (and scaled) to fp32. Every id must lie in [0, V)."""
    weight = as_device_weight(table)
    hidden = weight.shape[1]
    (tokens,) = dims(ids, "ids", 1)
    check_array(ids, "ids", (tokens,), (np.int32,))
    check_array(out, "out", (tokens, hidden), (np.float32,))
    if tokens == 0:
        return
    kernel = _gather_kernel(weight.kind, weight.group)
    kernel[(cdiv(hidden, _THREADS), tokens), _THREADS, stream](weight.data, weight.scales, ids, out)
