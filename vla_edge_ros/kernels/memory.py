"""Kernels for the KV memory policies: signature matching and a fast-weight (delta rule) memory.

- cosine_similarities scores the stored signatures against a query, one block per live row.
- The fast-weight memory is a linear map W [d_v, d_k] plus bias b [d_v], read as W q + b. A step
  predicts v from k, and writes one delta-rule update only when the prediction error (the surprise)
  exceeds a threshold or the caller forces it. The decision is taken on the device, so a step is a
  single launch without a host round trip between predict and write.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32

from vla_edge_ros.kernels._launch import CudaFunction, DeviceArray, Stream, check, check_array, dims
from vla_edge_ros.kernels._reduce import tree_sum_rows

_THREADS = 128
MAX_FAST_WEIGHT_DIM = 1024
"""Largest d_v (one thread per row of W, one block) and d_k the fast-weight step accepts."""


@cuda.jit
def _cosine_kernel(signatures, query, out):
    # One block per live row; the query's norm is recomputed per block, which costs less than a
    # second launch at these widths.
    buf = cuda.shared.array((3, _THREADS), float32)  # dot, |s|^2, |q|^2
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    dot = float32(0)
    ss = float32(0)
    qq = float32(0)
    for d in range(tid, signatures.shape[1], _THREADS):
        s = signatures[row, d]
        q = query[d]
        dot += s * q
        ss += s * s
        qq += q * q
    buf[0, tid] = dot
    buf[1, tid] = ss
    buf[2, tid] = qq
    tree_sum_rows(buf, tid)
    if tid == 0:
        norms = math.sqrt(buf[1, 0]) * math.sqrt(buf[2, 0])
        out[row] = buf[0, 0] / norms if norms > float32(0) else float32(0)


@cuda.jit
def _fast_weight_read_kernel(w, b, q, out):
    # One block per row of W: consecutive threads read consecutive columns (coalesced).
    buf = cuda.shared.array((1, _THREADS), float32)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    acc = float32(0)
    for j in range(tid, w.shape[1], _THREADS):
        acc += w[row, j] * q[j]
    buf[0, tid] = acc
    tree_sum_rows(buf, tid)
    if tid == 0:
        out[row] = buf[0, 0] + b[row]


@functools.cache
def _fast_weight_step_kernel(threads: int) -> CudaFunction:
    """The step kernel for a block of `threads` (a power of two): the shared buffer's width."""

    @cuda.jit
    def step(w, b, k, v, beta, threshold, force, result):
        # Thread i owns row i of W and b: it reads that row for the prediction and later writes
        # only that row, and the reduction's barriers separate every read from every write.
        buf = cuda.shared.array((1, threads), float32)
        tid = cuda.threadIdx.x
        d_v, d_k = w.shape
        err = float32(0)
        if tid < d_v:
            pred = b[tid]
            for j in range(d_k):
                pred += w[tid, j] * k[j]
            err = v[tid] - pred
        buf[0, tid] = err * err
        tree_sum_rows(buf, tid)
        surprise = math.sqrt(buf[0, 0])
        write = force != 0 or surprise > threshold  # the same decision in every thread
        if write and tid < d_v:
            scaled = beta * err
            for j in range(d_k):
                w[tid, j] += scaled * k[j]
            b[tid] += scaled
        if tid == 0:
            result[0] = surprise
            result[1] = float32(1) if write else float32(0)

    return step


def cosine_similarities(
    signatures: DeviceArray, count: int, query: DeviceArray, out: DeviceArray, stream: Stream = 0
) -> None:
    """out[i] = cos(signatures[i], query) for i < count; out[count:] is left as it was.

    A row or query of zero norm scores 0.0 rather than NaN, so an empty signature never matches.
    """
    capacity, width = dims(signatures, "signatures", 2)
    check_array(signatures, "signatures", (capacity, width), (np.float32,))
    check_array(query, "query", (width,), (np.float32,))
    check_array(out, "out", (capacity,), (np.float32,))
    check(0 <= count <= capacity, f"count must be in [0, {capacity}], got {count}")
    if count:
        _cosine_kernel[count, _THREADS, stream](signatures, query, out)


def fast_weight_step(
    w: DeviceArray,
    b: DeviceArray,
    k: DeviceArray,
    v: DeviceArray,
    beta: float,
    threshold: float,
    force: bool,
    result: DeviceArray,
    stream: Stream = 0,
) -> None:
    """One surprise-gated delta-rule write: err = v - (W k + b), surprise = ||err||; if forced or
    surprise > threshold, W += beta err k^T and b += beta err (err from before the update).

    result receives [surprise, 1.0 if written else 0.0]; it stays on the device, so a caller that
    does not need it now does not synchronise.
    """
    d_v, d_k = dims(w, "W", 2)
    check(
        1 <= d_v <= MAX_FAST_WEIGHT_DIM and 1 <= d_k <= MAX_FAST_WEIGHT_DIM,
        f"W must be at most {MAX_FAST_WEIGHT_DIM} x {MAX_FAST_WEIGHT_DIM} and non-empty, "
        f"got {(d_v, d_k)}",
    )
    check_array(w, "W", (d_v, d_k), (np.float32,))
    check_array(b, "b", (d_v,), (np.float32,))
    check_array(k, "k", (d_k,), (np.float32,))
    check_array(v, "v", (d_v,), (np.float32,))
    check_array(result, "result", (2,), (np.float32,))
    threads = 1 << (d_v - 1).bit_length()  # at most MAX_FAST_WEIGHT_DIM, a power of two
    _fast_weight_step_kernel(threads)[1, threads, stream](
        w, b, k, v, np.float32(beta), np.float32(threshold), np.int32(bool(force)), result
    )


def fast_weight_read(
    w: DeviceArray, b: DeviceArray, q: DeviceArray, out: DeviceArray, stream: Stream = 0
) -> None:
    """out = W q + b: recall from the fast-weight memory."""
    d_v, d_k = dims(w, "W", 2)
    check_array(w, "W", (d_v, d_k), (np.float32,))
    check_array(b, "b", (d_v,), (np.float32,))
    check_array(q, "q", (d_k,), (np.float32,))
    check_array(out, "out", (d_v,), (np.float32,))
    if d_v:
        _fast_weight_read_kernel[d_v, _THREADS, stream](w, b, q, out)
