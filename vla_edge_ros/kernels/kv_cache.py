"""Copy key and value rows between row arrays: how the paged KV pool is written, read and compacted.

The pool is rows of head_dim values (a page is ``page_tokens`` consecutive rows). One copy serves three
moves: new tokens' keys and values into their rows (a scatter), held rows out for the host (a gather),
and a head's last entries into the holes its evictions left (compaction, within the pool).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from vla_edge_ros.kernels._launch import DeviceArray, Stream, cdiv, check, check_array, dims

_THREADS = 256


@cuda.jit
def _copy_rows_kernel(src_k, src_v, src_rows, dst_k, dst_v, dst_rows):
    # Consecutive threads walk the head dimension, so both the reads and the writes are coalesced.
    head_dim = src_k.shape[1]
    idx = cuda.grid(1)
    if idx < src_rows.shape[0] * head_dim:
        i = idx // head_dim
        d = idx - i * head_dim
        dst_k[dst_rows[i], d] = src_k[src_rows[i], d]
        dst_v[dst_rows[i], d] = src_v[src_rows[i], d]


def copy_rows(
    src_k: DeviceArray,
    src_v: DeviceArray,
    src_rows: DeviceArray,
    dst_k: DeviceArray,
    dst_v: DeviceArray,
    dst_rows: DeviceArray,
    stream: Stream = 0,
) -> None:
    """dst_k[dst_rows[i], :] = src_k[src_rows[i], :], likewise for v (arrays [rows, D]).

    The copies run in parallel: destination rows must be distinct, and none may be a source row when
    source and destination are the same array.
    """
    src_count, head_dim = dims(src_k, "src_k", 2)
    dst_count = dims(dst_k, "dst_k", 2)[0]
    (n,) = dims(src_rows, "src_rows", 1)
    check_array(src_k, "src_k", (src_count, head_dim), (np.float32,))
    check_array(src_v, "src_v", (src_count, head_dim), (np.float32,))
    check_array(dst_k, "dst_k", (dst_count, head_dim), (np.float32,))
    check_array(dst_v, "dst_v", (dst_count, head_dim), (np.float32,))
    check_array(src_rows, "src_rows", (n,), (np.int32,))
    check_array(dst_rows, "dst_rows", (n,), (np.int32,))
    check(head_dim > 0, "rows must have at least one value")
    if n:
        _copy_rows_kernel[cdiv(n * head_dim, _THREADS), _THREADS, stream](src_k, src_v, src_rows, dst_k, dst_v,
                                                                          dst_rows)
