"""The online-softmax steps shared by the attention kernels (paged decoder KV, vision segments).

A block holds a tile of query rows and walks the keys in chunks staged in shared memory. Per chunk it
writes scores into p_s (-inf where a key is invisible), then ``update_rows`` turns them into
probabilities against the new running max and keeps (max, sum, rescale) per row in stat_s, and
``accumulate_rows`` rescales the output tile and adds probabilities times the staged values. Built per
(tile_rows, chunk, head_dim, threads) so every loop bound is a compile-time constant.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32

from vla_edge_ros.kernels._launch import CudaFunction

NEG_INF = np.float32(-np.inf)


@functools.cache
def online_softmax(tile_rows: int, chunk: int, head_dim: int, threads: int) -> tuple[CudaFunction, CudaFunction]:
    """(update_rows, accumulate_rows) device functions for one tile geometry."""

    @cuda.jit(device=True)
    def update_rows(p_s, stat_s, tid):
        # Thread tid < tile_rows owns row tid; a row whose scores are all -inf keeps probabilities 0.
        if tid < tile_rows:
            m_old = stat_s[0, tid]
            m_new = m_old
            for j in range(chunk):
                m_new = max(m_new, p_s[tid, j])
            total = float32(0)
            for j in range(chunk):
                score = p_s[tid, j]
                prob = float32(0) if score == NEG_INF else math.exp(score - m_new)
                p_s[tid, j] = prob
                total += prob
            rescale = float32(0) if m_old == NEG_INF else math.exp(m_old - m_new)
            stat_s[0, tid] = m_new
            stat_s[1, tid] = stat_s[1, tid] * rescale + total
            stat_s[2, tid] = rescale

    @cuda.jit(device=True)
    def accumulate_rows(o_s, p_s, kv_s, stat_s, tid):
        for p in range(tid, tile_rows * head_dim, threads):
            r = p // head_dim
            d = p - r * head_dim
            acc = o_s[r, d] * stat_s[2, r]
            for j in range(chunk):
                acc += p_s[r, j] * kv_s[j, d]
            o_s[r, d] = acc

    return update_rows, accumulate_rows
