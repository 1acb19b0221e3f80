"""RoPE inside compiled code, ``ops.apply_rope`` bit for bit, and the arena's in-place re-rotation of keys.

``rotate`` rounds each product and each sum to fp32 on its own, as NumPy does (compiled without fast-math,
so LLVM fuses no multiply-add): keys stored by a compiled forward are the ones the NumPy path stores.
"""

from __future__ import annotations

from numba import njit


@njit(cache=True, nogil=True)
def rotate(x, cos, sin, out):
    """``ops.apply_rope`` of one head's vector x [D] by one token's cos, sin [D/2], into out [D] (may be x)."""
    half = cos.shape[0]
    for i in range(half):
        x1, x2 = x[i], x[half + i]
        out[i] = x1 * cos[i] - x2 * sin[i]
        out[half + i] = x2 * cos[i] + x1 * sin[i]


@njit(cache=True, nogil=True)
def rotate_rows(k_rows, rows, cos, sin):
    """Rotate pool rows ``rows`` [heads, n] (-1: not held) of k_rows [rows, D] in place, row ``rows[h, j]`` by
    cos, sin [n, D/2] of its column j: one shift per token, whichever heads hold it (``rotate_keys``)."""
    heads, n = rows.shape
    for h in range(heads):
        for j in range(n):
            row = rows[h, j]
            if row >= 0:
                rotate(k_rows[row], cos[j], sin[j], k_rows[row])
