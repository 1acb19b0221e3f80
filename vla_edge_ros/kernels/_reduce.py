"""Block-wide reductions through shared memory.

Only shared memory and __syncthreads are used (no warp shuffles), because the CUDA simulator that
the tests run under implements neither shuffles nor __syncwarp; every thread of the block must call
these functions, and the shared buffer's width must be a power of two no larger than the block.
"""

from __future__ import annotations

from numba import cuda


@cuda.jit(device=True)
def tree_sum_rows(buf, tid):
    """Sum each row of the shared 2-D `buf` into its column 0; all threads see the result."""
    cuda.syncthreads()
    half = buf.shape[1] >> 1
    while half > 0:
        if tid < half:
            for r in range(buf.shape[0]):
                buf[r, tid] += buf[r, tid + half]
        cuda.syncthreads()
        half >>= 1


@cuda.jit(device=True)
def is_better(val, idx, best_val, best_idx):
    """Argmax order: a larger value wins, an equal value wins with a lower index (NumPy's rule)."""
    return val > best_val or (val == best_val and idx < best_idx)


@cuda.jit(device=True)
def tree_argmax(vals, idxs, tid):
    """Reduce shared (value, index) pairs into slot 0: largest value, ties to the lowest index."""
    cuda.syncthreads()
    half = vals.shape[0] >> 1
    while half > 0:
        if tid < half:
            if is_better(vals[tid + half], idxs[tid + half], vals[tid], idxs[tid]):
                vals[tid] = vals[tid + half]
                idxs[tid] = idxs[tid + half]
        cuda.syncthreads()
        half >>= 1
