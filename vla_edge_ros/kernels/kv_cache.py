"""Scatter the keys and values of new tokens into their slots of one layer's KV arena."""

from __future__ import annotations

import numpy as np
from numba import cuda

from vla_edge_ros.kernels._launch import DeviceArray, Stream, cdiv, check_array, dims

_THREADS = 256


@cuda.jit
def _kv_write_kernel(k, v, k_cache, v_cache, slots):
    # Consecutive threads walk the head dimension, so both the reads and the writes are coalesced.
    _, kv_heads, head_dim = k.shape
    idx = cuda.grid(1)
    if idx < k.size:
        d = idx % head_dim
        th = idx // head_dim
        h = th % kv_heads
        t = th // kv_heads
        slot = slots[t]
        k_cache[h, slot, d] = k[t, h, d]
        v_cache[h, slot, d] = v[t, h, d]


def kv_write(
    k: DeviceArray,
    v: DeviceArray,
    k_cache: DeviceArray,
    v_cache: DeviceArray,
    slots: DeviceArray,
    stream: Stream = 0,
) -> None:
    """k_cache[h, slots[t], :] = k[t, h, :], likewise for v; slots distinct and in [0, S)."""
    kv_heads, capacity, head_dim = dims(k_cache, "k_cache", 3)
    tokens = dims(k, "k", 3)[0]
    check_array(k, "k", (tokens, kv_heads, head_dim), (np.float32,))
    check_array(v, "v", (tokens, kv_heads, head_dim), (np.float32,))
    check_array(k_cache, "k_cache", (kv_heads, capacity, head_dim), (np.float32,))
    check_array(v_cache, "v_cache", (kv_heads, capacity, head_dim), (np.float32,))
    check_array(slots, "slots", (tokens,), (np.int32,))
    if k.size:
        _kv_write_kernel[cdiv(k.size, _THREADS), _THREADS, stream](k, v, k_cache, v_cache, slots)
