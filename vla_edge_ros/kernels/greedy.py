"""Greedy token pick: argmax over a logit vector in two block-reduction passes.

A NaN logit compares false with everything, so a plain argmax would quietly pick some other index (and
NumPy's would pick the NaN): no token is meaningful then. Both passes therefore also reduce a flag, set
when any logit is NaN or infinite, and the pick is -1 (``NO_TOKEN``) when it is set: one int comes back
to the host either way.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32

from vla_edge_ros.kernels._launch import DeviceArray, Stream, cdiv, check, check_array, dims
from vla_edge_ros.kernels._reduce import is_better, tree_argmax

_THREADS = 128
_MAX_BLOCKS = 64
_NEG_INF = np.float32(-np.inf)
_NO_INDEX = np.int32(np.iinfo(np.int32).max)
NO_TOKEN = -1  # argmax_rows' answer when a logit is NaN or infinite


@cuda.jit
def _argmax_blocks(logits, part_val, part_idx, part_bad):
    # Pass 1: each block scans a grid-strided share of the vector (coalesced) and keeps its best, and
    # whether it saw a non-finite logit.
    vals = cuda.shared.array(_THREADS, float32)
    idxs = cuda.shared.array(_THREADS, int32)
    bad = cuda.shared.array(1, int32)
    tid = cuda.threadIdx.x
    if tid == 0:
        bad[0] = 0
    cuda.syncthreads()
    best_val = _NEG_INF
    best_idx = _NO_INDEX
    for i in range(cuda.grid(1), logits.shape[0], cuda.gridsize(1)):
        value = logits[i]
        if math.isnan(value) or math.isinf(value):
            bad[0] = 1
        elif is_better(value, i, best_val, best_idx):
            best_val = value
            best_idx = int32(i)
    vals[tid] = best_val
    idxs[tid] = best_idx
    tree_argmax(vals, idxs, tid)  # begins and ends with a barrier: every flag write is seen below
    if tid == 0:
        part_val[cuda.blockIdx.x] = vals[0]
        part_idx[cuda.blockIdx.x] = idxs[0]
        part_bad[cuda.blockIdx.x] = bad[0]


@cuda.jit
def _argmax_final(part_val, part_idx, part_bad, result):
    # Pass 2: one block reduces the per-block winners, carrying their original indices and flags.
    vals = cuda.shared.array(_THREADS, float32)
    idxs = cuda.shared.array(_THREADS, int32)
    bad = cuda.shared.array(1, int32)
    tid = cuda.threadIdx.x
    if tid == 0:
        bad[0] = 0
    cuda.syncthreads()
    best_val = _NEG_INF
    best_idx = _NO_INDEX
    for i in range(tid, part_val.shape[0], _THREADS):
        if part_bad[i]:
            bad[0] = 1
        if is_better(part_val[i], part_idx[i], best_val, best_idx):
            best_val = part_val[i]
            best_idx = part_idx[i]
    vals[tid] = best_val
    idxs[tid] = best_idx
    tree_argmax(vals, idxs, tid)
    if tid == 0:
        result[0] = NO_TOKEN if bad[0] else idxs[0]


def argmax_rows(logits: DeviceArray, stream: Stream = 0) -> int:
    """Index of the largest logit (ties -> lowest index, as numpy.argmax), or ``NO_TOKEN`` (-1) when any
    logit is NaN or infinite.

    Blocks until the result is on the host, since the caller needs the token id as a Python int.
    """
    (n,) = dims(logits, "logits", 1)
    check(n > 0, "argmax_rows needs a non-empty vector")
    check_array(logits, "logits", (n,), (np.float32,))
    blocks = min(_MAX_BLOCKS, cdiv(n, _THREADS))
    part_val = cuda.device_array(blocks, np.float32, stream=stream)
    part_idx = cuda.device_array(blocks, np.int32, stream=stream)
    part_bad = cuda.device_array(blocks, np.int32, stream=stream)
    result = cuda.device_array(1, np.int32, stream=stream)
    _argmax_blocks[blocks, _THREADS, stream](logits, part_val, part_idx, part_bad)
    _argmax_final[1, _THREADS, stream](part_val, part_idx, part_bad, result)
    host = result.copy_to_host(stream=stream)
    if stream:
        stream.synchronize()
    return int(host[0])
