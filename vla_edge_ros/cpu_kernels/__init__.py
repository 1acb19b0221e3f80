"""Numba-compiled CPU kernels: x @ w.T (+ bias) for a weight matrix held as fp32, bf16, int8 or int4.

``linear(x, matrix, bias=None, out=None)`` takes a ``numerics.weight_formats.PackedMatrix`` [out, in] and
relies on exactly the layouts that module documents: fp32 and bf16 (uint16 bits) rows [out, in]; int8 rows
with one fp32 scale a row; int4 as uint8 [out, groups * group / 2], byte j of a group carrying input j in
its low nibble and input j + group / 2 in its high one, each q + 8, with scales [out, groups] and a short
last group zero-padded (the kernels read only the inputs that exist). ``dequantize`` there is the twin
every result is tested against.

Decode and prefill are different problems, so ``linear`` splits on the token count T:

- T <= ``DECODE_TOKENS`` (8): ``matvec``, one pass over the weight bytes, rows split over threads by
  ``prange``. bf16 is read as weight pairs (uint32 words: the high half masked and the low half shifted
  are two fp32 weights) against x split once into even and odd inputs. int8, and int4 in groups of 64
  or 128, round each token to int16 once (a step of its largest |x| / 32767) and sum in integers
  (``vpdpwssd`` with AVX-512): int8 a row exactly, scaled once; int4 a group at a time (the low nibbles
  against the group's first half of x, the high ones against its second half, less 8), each group's
  sum times its scale in fp32. Without AVX-512BW, int8 gets the same sums as LLVM vectorizes them and
  int4 widens each nibble to fp32, as groups of 32 always do. From 4096 inputs x no longer stays in
  L1 beside the streamed rows, so bf16 takes 8 rows and int8 16 rows a pass over x (the down
  projection: bf16 2.16 -> 1.16 ms, int8 0.75 -> 0.60). Each further token re-reads the row (or rows)
  from L1 or L2, so time grows about linearly with T; BLAS's sgemm is slow on a handful of tokens
  (30-50 ms a layer for T = 2 to 16 on one core), and at T = 8 the matrix-vector kernels were still as
  fast or faster for every format, at T = 16 no longer for fp32 and int4 (measured before the int16
  kernels). fp32 decodes here too: it beat NumPy's sgemv (table below).
- T > 8: ``dequantize`` widens 4 MiB blocks of rows into a reusable per-thread fp32 buffer and hands each
  to NumPy's BLAS, so speed stays near sgemm and no fp32 copy of the matrix is held; fp32 goes to BLAS
  directly. Each block is multiplied as ``block @ x.T`` and the small [rows, T] result transposed into
  place, which OpenBLAS runs 1.5x faster than ``x @ block.T`` at 16 tokens and as fast at 70 (the 1.5B
  shape's gate/up in bf16, one core: 14.9 ms at T = 16, 50 ms at T = 70, against 20 and 47 for sgemm on
  the fp32 matrix stored transposed).

One Qwen2.5-1.5B decoder layer ([2048, 1536] qkv, [1536, 1536] o, [17920, 1536] gate/up, [1536, 8960] down;
four distinct copies, so nothing stays cached), one token, ``bench/bench_cpu_linear.py`` on the 2-core
Zen 4 (ms a token, best of 11; floor: a compiled streaming read of the same buffers; ranges over runs
on a shared machine; bf16, int8 and int4 over two or three runs at load 2.0-2.8, fp32 over six at 2.5-6):

    format    MB     1 thread: ms   x floor     2 threads: ms   x floor
    float32  187.2   7.0-8.1        1.20-1.33   4.6-6.6         1.04-1.19
    bfloat16  93.6   3.6-4.1        1.12-1.34   2.2 (a)         1.25
    int8      46.9   2.2-2.3        1.29-1.32   1.6-1.7 (a)     1.09-1.19
    int4      26.3   1.8            2.1-2.2     1.1-2.0 (a)     2.2-2.4
    NumPy fp32 (sgemv), 1 thread: 9.5-10.6 ms, 1.5-1.7 x floor
    int4 in groups of 128: 1.7 ms, 2.2 x; of 32 (before these changes): 7.6 ms, 6.5 x (1 thread;
    ``matvec_int4_group32``, not changed)
    (a) the runs not slowed 3-30x by another process's threads on the two cores

The same layer, old and new kernels interleaved in one process, 1 thread, best ms (x floor), load 1.6:
bf16 4.67 (1.61) -> 3.34 (1.15), int8 3.77 (2.40) -> 2.02 (1.28); at load 2.7, int4 in groups of 64
3.65 (4.45) -> 1.65 (2.02), of 128 3.18 (3.78) -> 1.63 (1.93). Before, each weight was widened to fp32
(bf16: ``vpmovzxwd``, ``vpslld``; int8: ``vpmovsxbd``, ``vcvtdq2ps``) for an fp32 FMA. Eight tokens:
bf16 21.1 -> 17.6 ms, int8 18.1 -> 11.5.

What the rest of the gap is, one core: rows whose x fits L1 (1536 inputs) stream at 1.03-1.1 x floor
for bf16 and 1.1-1.2 for int8; the down projection stays at 1.2-1.4. Tried and slower: software
prefetch (also of each row's start), splitting rows into column blocks that fit L1 (2.8 x floor on the
down projection: every short run of a row restarts the hardware's stream), two or more rows at a time
on short rows (2.6 x: the same), and AVX-512 BF16 ``vdpbf16ps``: with x rounded to bf16 it is 1.24 x but
moves products by 1.5e-3 of their scale; as x = hi + lo in two bf16 (2.4e-6) it was slower than fp32
FMAs. int4 still does more work a byte (unpacking nibbles, a conversion and a scale a group).
A second thread helps most where compute binds.

``set_threads(n)`` sets the threads of every later call (Numba's count is per calling thread, so it is
applied at each launch); BLAS's threads are set apart (the ``blas_threads`` parameter). Each kernel compiles
once, for fp32 C-contiguous x and the format's own dtypes (a read-only weight array adds a second
compilation); ``cache=True`` keeps them: about 7 s to compile all four formats' kernels on first use
(int4's group-32 kernel 2-4 s more, compiled only if used), 0.5 s to import and load them from the cache.
"""

from .product import DECODE_TOKENS, linear
from .threads import set_threads, threads

__all__ = ["DECODE_TOKENS", "linear", "set_threads", "threads"]
