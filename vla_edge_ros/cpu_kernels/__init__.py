"""Numba-compiled CPU kernels: x @ w.T (+ bias) for a weight matrix held as fp32, bf16, int8 or int4.

``linear(x, matrix, bias=None, out=None)`` takes a ``numerics.weight_formats.PackedMatrix`` [out, in] and
relies on exactly the layouts that module documents: fp32 and bf16 (uint16 bits) rows [out, in]; int8 rows
with one fp32 scale a row; int4 as uint8 [out, groups * group / 2], byte j of a group carrying input j in
its low nibble and input j + group / 2 in its high one, each q + 8, with scales [out, groups] and a short
last group zero-padded (the kernels read only the inputs that exist). ``dequantize`` there is the twin
every result is tested against.

Decode and prefill are different problems, so ``linear`` splits on the token count T:

- T <= ``DECODE_TOKENS`` (8): ``matvec``, one pass over the weight bytes, each widened to fp32 in a
  register (bf16 by a bit cast, int8 by a conversion and the row's scale at the end, int4 a group at a
  time: the low nibbles against the group's first half of x, the high ones against its second half,
  less 8, times the group's scale), rows split over threads by ``prange``. Each further token re-reads the
  row from L1, so time grows about linearly with T; BLAS's sgemm is slow on a handful of tokens (30-50 ms
  a layer for T = 2 to 16 on one core), and at T = 8 the matrix-vector kernels were still as fast or
  faster for every format, at T = 16 no longer for fp32 and int4. fp32 decodes here too: it beat NumPy's
  sgemv (table below).
- T > 8: ``dequantize`` widens 4 MiB blocks of rows into a reusable per-thread fp32 buffer and hands each
  to NumPy's BLAS (``x @ block.T``), so speed stays near sgemm and no fp32 copy of the matrix is held:
  at T = 70, 104-108 ms a layer on one core against 107-124 for sgemm on the whole fp32 matrix; on two,
  67-71 against 56-64 (the widening itself runs on one thread). fp32 goes to BLAS directly.

One Qwen2.5-1.5B decoder layer ([2048, 1536] qkv, [1536, 1536] o, [17920, 1536] gate/up, [1536, 8960] down;
four distinct copies, so nothing stays cached), one token, ``bench/bench_cpu_linear.py`` on the 2-core
Zen 4 (ms a token, best of 11; floor: a compiled streaming read of the same buffers; ranges over six runs
on a shared machine, load average 2.5-6):

    format    MB     1 thread: ms   x floor     2 threads: ms   x floor
    float32  187.2   7.0-8.1        1.20-1.33   4.6-6.6         1.04-1.19
    bfloat16  93.6   4.7-5.5        1.40-1.66   3.2-4.0         1.16-1.32
    int8      46.9   3.4-4.7        2.0-2.9     2.1-2.9         1.4-1.9
    int4      26.3   3.6-4.0        3.4-4.6     2.0-2.3         2.2-3.0
    NumPy fp32 (sgemv), 1 thread: 9.5-10.6 ms, 1.5-1.7 x floor
    int4 in groups of 128: 3.2 ms, 3.4 x; of 32: 7.6 ms, 6.5 x (1 thread; ``matvec_int4_group32``)

bf16 and int8 on one core are bound by the instructions that widen and multiply, not by the bytes: the
same kernels run 25-30 G weights/s on a matrix in L2, but streaming from memory while computing, one core
keeps too few lines in flight (software prefetch made it slower). int4 does more work a byte still. A
second thread helps most where compute binds.

``set_threads(n)`` sets the threads of every later call (Numba's count is per calling thread, so it is
applied at each launch); BLAS's threads are set apart (the ``blas_threads`` parameter). Each kernel compiles
once, for fp32 C-contiguous x and the format's own dtypes (a read-only weight array adds a second
compilation); ``cache=True`` keeps them: about 7 s to compile all four formats' kernels on first use
(int4's group-32 kernel 2-4 s more, compiled only if used), 0.5 s to import and load them from the cache.
"""

from .product import DECODE_TOKENS, linear
from .threads import set_threads, threads

__all__ = ["DECODE_TOKENS", "linear", "set_threads", "threads"]
