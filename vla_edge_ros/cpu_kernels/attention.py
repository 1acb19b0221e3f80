"""One decoder layer's attention in one call: RoPE, the new keys and values into the pool, masked GQA attention.

At a small model's size the NumPy path (``model/numpy_backend.py``: ``project``, the row writes,
``attention_inputs``, ``numerics.ops.gqa_attention``) is some 25 NumPy calls a layer, each costing more
in dispatch than in arithmetic; this kernel does the same work in one. Its NumPy twin is that path, and
``test/test_cpu_attention.py`` holds it to it.

- RoPE is ``rope.rotate``, ``ops.apply_rope`` bit for bit: the keys it stores, and the queries, are
  NumPy's, so a probe that recomputes queries with ``project`` and reads the stored keys
  (``tools/memory_bench/attention.py``) sees what the forward saw.
- Each KV head reads pool rows ``read_rows`` [kv_heads, n] (-1: no entry), so the dense layout (a run of
  rows per head) and the per-head one (rows through a block table) are one case. An entry is visible to
  query t when its position is at or before ``positions[t]``; ``entry_positions`` carries ``HIDDEN``
  where there is no entry. A query that may read nothing gets zeros, as the twin gives.
- A head's rows are gathered transposed ([D, n]) so that every loop runs along the n entries, long and
  contiguous, and vectorises; sums reorder (fast-math ``reassoc``) and softmax's exp is a polynomial
  LLVM vectorises (``elementwise.exp``, within 3e-7 of NumPy's): results differ from the twin within fp32 rounding.
  Against the twin, one core, 4 query and 2 KV heads of 32: 16 new tokens over 112 entries 49 against
  98 us, over 500 entries 187 against 246 us; one token over 112 entries 9 against 57 us (load 2-4).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .elementwise import SUMS, exp
from .rope import rotate

HIDDEN = np.iinfo(np.int32).max
"""``entry_positions`` of a place that holds no entry: after every query, so never read."""


@njit(**SUMS)
def _attend_head(queries, positions, group, k_rows, v_rows, read_rows, entry_positions, keys, values, scores,
                 out):
    """Softmax attention of one KV head's scaled queries [T * group, D] (query j: token j // group) over the
    entries at pool rows ``read_rows`` [n], each query's result into out [T * group, D]. keys, values
    [D, n] and scores [T * group, n] are scratch: the entries' rows are gathered transposed, so every loop
    below runs along the n entries (long, contiguous: vectorised)."""
    lanes, dim = queries.shape
    n = read_rows.shape[0]
    for e in range(n):
        row = read_rows[e]
        if row < 0:
            keys[:, e] = 0.0
            values[:, e] = 0.0
            continue
        for d in range(dim):
            keys[d, e] = k_rows[row, d]
            values[d, e] = v_rows[row, d]
    for j in range(lanes):
        position = positions[j // group]
        score = scores[j]
        score[:] = 0.0
        for d in range(dim):
            q = queries[j, d]
            for e in range(n):
                score[e] += q * keys[d, e]
        peak, read = np.float32(-np.inf), 0
        for e in range(n):
            if entry_positions[e] <= position:
                read += 1
                peak = max(peak, score[e])  # a NaN score is passed over here, and shows in the sums below
        if not read:  # reads nothing: zeros
            out[j] = 0.0
            continue
        total = np.float32(0.0)
        for e in range(n):
            weight = exp(score[e] - peak) if entry_positions[e] <= position else np.float32(0.0)
            score[e] = weight
            total += weight
        for e in range(n):
            score[e] /= total
        for d in range(dim):
            acc = np.float32(0.0)
            for e in range(n):
                acc += score[e] * values[d, e]
            out[j, d] = acc


@njit(cache=True, nogil=True)
def attention_layer(qkv, cos, sin, q_heads, k_rows, v_rows, new_rows, read_rows, entry_positions, positions,
                    scale, out):
    """out [T, q_heads * D] = attention of the new tokens' fused projections qkv [T, (q_heads + 2 kv_heads) D]
    at ``positions`` [T] (int32), rotated by cos, sin [T, D/2]. Their rotated keys and values go first into
    pool rows ``new_rows`` [kv_heads, T] of k_rows, v_rows [rows, D] (a token reads itself); the heads then
    read rows ``read_rows`` [kv_heads, n] at ``entry_positions`` [kv_heads, n] (int32, ``HIDDEN``: none).
    ``scale`` (fp32) multiplies the rotated queries, as ``ops.gqa_attention`` does."""
    tokens = qkv.shape[0]
    kv_heads, n = read_rows.shape
    dim = k_rows.shape[1]
    group = q_heads // kv_heads
    k_first, v_first = q_heads * dim, (q_heads + kv_heads) * dim
    for t in range(tokens):
        for h in range(kv_heads):
            row = new_rows[h, t]
            rotate(qkv[t, k_first + h * dim:k_first + (h + 1) * dim], cos[t], sin[t], k_rows[row])
            v_rows[row] = qkv[t, v_first + h * dim:v_first + (h + 1) * dim]
    lanes = tokens * group
    queries = np.empty((lanes, dim), dtype=np.float32)
    keys, values = np.empty((dim, n), dtype=np.float32), np.empty((dim, n), dtype=np.float32)
    scores = np.empty((lanes, n), dtype=np.float32)
    head_out = np.empty((lanes, dim), dtype=np.float32)
    for h in range(kv_heads):
        for t in range(tokens):
            for g in range(group):
                head = h * group + g
                rotate(qkv[t, head * dim:(head + 1) * dim], cos[t], sin[t], queries[t * group + g])
                queries[t * group + g] *= scale
        _attend_head(queries, positions, group, k_rows, v_rows, read_rows[h], entry_positions[h], keys, values,
                     scores, head_out)
        for t in range(tokens):
            for g in range(group):
                head = h * group + g
                out[t, head * dim:(head + 1) * dim] = head_out[t * group + g]
