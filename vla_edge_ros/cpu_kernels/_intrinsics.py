"""bf16 bits and int4 nibbles to fp32, and int8 rows against int16 activations, inside compiled code.

- A bf16 weight widens to fp32 exactly as its 16 bits moved to the top of a 32-bit word. Numba has no
  scalar bit cast, and going through a small uint32 buffer viewed as float32 keeps LLVM from vectorizing
  the dot product (1.4 ns a weight against 0.09 with this cast, one Zen 4 core, row in L1).
- Two neighbouring bf16 weights read as one uint32 word are two fp32 values in place: the high half
  masked (``bf16_high``) and the low half shifted up (``bf16_low``), one instruction each for 2 weights
  against widening each 16-bit lane (``vpmovzxwd``) and then shifting it.
- An int4 nibble in Numba's integer arithmetic is an int64, and LLVM then converts 8 lanes at a time
  (``vcvtqq2ps``); widening the byte to int32 here keeps 16 lanes a conversion (twice the speed, in L2).
- int8 rows against int16 activations sum in int32, which Numba's arithmetic (int64 for any integer)
  hides from LLVM: ``madd_int16_int8`` keeps a scalar sum int32, and LLVM then vectorizes it as
  ``vpmaddwd`` 16 lanes wide; ``dot_int16_int8_avx512`` writes the loop itself, 32 lanes a step,
  which LLVM fuses into one ``vpdpwssd`` (AVX-512 VNNI) per 32 weights. One Qwen2.5-1.5B layer, one
  core, interleaved: 1.74 ms against 3.41 for fp32 products (load 2.8); the vectorized scalar loop
  2.55 against 3.05 (load 2.1). int4 groups go the same way (``_int4_groups_avx512``), a group's
  integer sum then times its scale in fp32: 1.65 ms a layer against 3.65 (groups of 64, load 2.7).
"""

from __future__ import annotations

import llvmlite.binding as llvm
from numba import types
from numba.core import cgutils, config
from numba.core.cgutils import ir  # llvmlite's IR module, as Numba's extension API uses it
from numba.extending import intrinsic

AVX512BW = "+avx512bw" in (config.CPU_FEATURES or llvm.get_host_cpu_features().flatten()).split(",")
"""Whether Numba compiles for a CPU with AVX-512BW (its own rule: ``NUMBA_CPU_FEATURES``, else the host's),
so ``dot_int16_int8_avx512`` may be used."""
INT8_STEP = 128
"""Inputs ``dot_int16_int8_avx512`` takes a loop step: 4 independent sums of 32 (one ``vpdpwssd`` each)."""
INT8_CHUNK = 32768
"""The most inputs a call of ``dot_int16_int8_avx512`` takes: each of its 64 int32 lanes then sums 512
products of at most 32767 * 128, 2 147 418 112 < 2 ** 31, so no lane can overflow."""
INT8_ROWS = 16
"""Rows ``dot_rows_int16_int8_avx512`` sums in one pass over x: on the [1536, 8960] down projection (one
core, load 4) 0.60-0.64 ms against 0.64-0.65 for 8 rows and 0.71-0.75 for one; 4 rows gained nothing."""
INT8_STEP_ROWS = 32
"""Inputs ``dot_rows_int16_int8_avx512`` takes a loop step: one sum of 32 a row (the rows keep enough in flight)."""
INT8_CHUNK_ROWS = 8192
"""The most inputs a call of ``dot_rows_int16_int8_avx512`` takes: a row's 16 lanes then sum 512 products each."""


@intrinsic
def bf16_to_float32(typingctx, bits):  # noqa: ARG001 (Numba passes the typing context)
    """The fp32 that the bf16 bit pattern ``bits`` (uint16) stands for."""
    if bits != types.uint16:
        return None

    def codegen(context, builder, signature, args):  # noqa: ARG001
        word = builder.shl(builder.zext(args[0], ir.IntType(32)), ir.IntType(32)(16))
        return builder.bitcast(word, ir.FloatType())

    return types.float32(types.uint16), codegen


def _bf16_of_word(high: bool):
    @intrinsic
    def half(typingctx, word):  # noqa: ARG001
        if word != types.uint32:
            return None

        def codegen(context, builder, signature, args):  # noqa: ARG001
            int32 = ir.IntType(32)
            bits = builder.and_(args[0], int32(0xFFFF0000)) if high else builder.shl(args[0], int32(16))
            return builder.bitcast(bits, ir.FloatType())

        return types.float32(types.uint32), codegen

    return half


bf16_low = _bf16_of_word(high=False)
"""The bf16 in the low half of a uint32 word (the first of two weights, little-endian) as fp32."""
bf16_high = _bf16_of_word(high=True)
"""The bf16 in the high half of a uint32 word (the second of two weights) as fp32."""


def _nibble_to_float32(high: bool):
    @intrinsic
    def nibble(typingctx, byte):  # noqa: ARG001
        if byte != types.uint8:
            return None

        def codegen(context, builder, signature, args):  # noqa: ARG001
            int32 = ir.IntType(32)
            word = builder.zext(args[0], int32)
            word = builder.lshr(word, int32(4)) if high else builder.and_(word, int32(15))
            return builder.fsub(builder.sitofp(word, ir.FloatType()), ir.FloatType()(8.0))

        return types.float32(types.uint8), codegen

    return nibble


low_nibble = _nibble_to_float32(high=False)
"""The low nibble of a byte, less 8, as fp32: int4's first input of a pair."""
high_nibble = _nibble_to_float32(high=True)
"""The high nibble of a byte, less 8, as fp32: int4's second input of a pair."""


@intrinsic
def madd_int16_int8(typingctx, acc, x, w):  # noqa: ARG001
    """``acc + x * w`` in int32 (acc int32, x int16, w int8), for a sum LLVM vectorizes as ``vpmaddwd``."""
    if (acc, x, w) != (types.int32, types.int16, types.int8):
        return None

    def codegen(context, builder, signature, args):  # noqa: ARG001
        int32 = ir.IntType(32)
        return builder.add(args[0], builder.mul(builder.sext(args[1], int32), builder.sext(args[2], int32)))

    return types.int32(types.int32, types.int16, types.int8), codegen


def _c_array(kind: types.Type, dtype: types.Type, ndim: int) -> bool:
    """Whether ``kind`` is a C-contiguous array of ``dtype`` and ``ndim``, read-only or not."""
    return isinstance(kind, types.Array) and kind.dtype == dtype and kind.ndim == ndim and kind.layout == "C"


def _int8_rows_avx512(rows: int, sums_per_row: int):
    """An intrinsic (xq, q, n, start, stop): sum(xq[k] * q[n + r, k] for k in [start, stop)) exactly, as int64,
    for the ``rows`` rows from n (a tuple of them past one); xq int16 [K] and q int8 [N, K], C-contiguous.

    Each step loads 32 inputs of x once for all rows and keeps ``sums_per_row`` independent sums a row;
    ``stop - start`` must be a multiple of the step, at most the chunk, and all in bounds (nothing is
    checked). Needs ``AVX512BW``: ``llvm.x86.avx512.pmaddw.d.512`` multiplies 32 int16 pairs and adds
    neighbours into 16 int32 lanes; adding that to a sum becomes ``vpdpwssd`` with VNNI."""
    step = 32 * sums_per_row

    @intrinsic
    def dot(typingctx, xq, q, n, start, stop):  # noqa: ARG001
        if not (AVX512BW and _c_array(xq, types.int16, 1) and _c_array(q, types.int8, 2)):
            return None

        def codegen(context, builder, signature, args):  # noqa: ARG001
            int8, int16, int32, int64 = (ir.IntType(bits) for bits in (8, 16, 32, 64))
            sums_type, half = ir.VectorType(int32, 16), ir.VectorType(int16, 32)
            madd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(sums_type, [half, half]),
                                                  "llvm.x86.avx512.pmaddw.d.512")
            x_data = context.make_array(signature.args[0])(context, builder, args[0]).data
            matrix = context.make_array(signature.args[1])(context, builder, args[1])
            width = builder.extract_value(matrix.shape, 1)
            first, start, stop = args[2], args[3], args[4]
            row_starts = [builder.mul(builder.add(first, int64(r)), width) for r in range(rows)]
            zero = ir.Constant(sums_type, None)
            entry = builder.basic_block
            loop, done = builder.append_basic_block("dot.loop"), builder.append_basic_block("dot.done")
            builder.cbranch(builder.icmp_signed("<", start, stop), loop, done)

            builder.position_at_end(loop)
            k = builder.phi(int64)
            k.add_incoming(start, entry)
            sums = [[builder.phi(sums_type) for _ in range(sums_per_row)] for _ in range(rows)]
            stepped = [[None] * sums_per_row for _ in range(rows)]
            for j in range(sums_per_row):
                at = builder.add(k, int64(32 * j))
                x = builder.load(builder.bitcast(builder.gep(x_data, [at]), half.as_pointer()), align=2)
                for r in range(rows):
                    weights = builder.gep(matrix.data, [builder.add(row_starts[r], at)])
                    w = builder.load(builder.bitcast(weights, ir.VectorType(int8, 32).as_pointer()), align=1)
                    sums[r][j].add_incoming(zero, entry)
                    stepped[r][j] = builder.add(sums[r][j], builder.call(madd, [x, builder.sext(w, half)]))
            following = builder.add(k, int64(step))
            k.add_incoming(following, loop)
            for r in range(rows):
                for j in range(sums_per_row):
                    sums[r][j].add_incoming(stepped[r][j], loop)
            builder.cbranch(builder.icmp_signed("<", following, stop), loop, done)

            builder.position_at_end(done)
            finals = []
            for r in range(rows):
                for j in range(sums_per_row):
                    final = builder.phi(sums_type)
                    final.add_incoming(zero, entry)
                    final.add_incoming(stepped[r][j], loop)
                    finals.append(final)
            wide = ir.VectorType(int64, 16)
            totals = []
            for r in range(rows):
                lanes = builder.sext(finals[r * sums_per_row], wide)
                for final in finals[r * sums_per_row + 1:(r + 1) * sums_per_row]:
                    lanes = builder.add(lanes, builder.sext(final, wide))
                total = int64(0)
                for lane in range(16):
                    total = builder.add(total, builder.extract_element(lanes, int32(lane)))
                totals.append(total)
            return totals[0] if rows == 1 else context.make_tuple(builder, signature.return_type, totals)

        result = types.int64 if rows == 1 else types.UniTuple(types.int64, rows)
        return result(xq, q, types.intp, types.intp, types.intp), codegen

    return dot


dot_int16_int8_avx512 = _int8_rows_avx512(rows=1, sums_per_row=INT8_STEP // 32)
"""One row, 4 sums of 32 inputs a step (``INT8_STEP``), at most ``INT8_CHUNK`` inputs a call."""
dot_rows_int16_int8_avx512 = _int8_rows_avx512(rows=INT8_ROWS, sums_per_row=INT8_STEP_ROWS // 32)
"""``INT8_ROWS`` rows sharing each x load, one sum each a step, at most ``INT8_CHUNK_ROWS`` inputs a call."""


def _int4_groups_avx512(group: int):
    """An intrinsic (xq, packed, scales, n): row n of an int4 matrix in groups of ``group`` (64 or 128)
    against int16 x, as sum over groups of scales[n, g] * (the group's exact integer sum), in fp32.

    xq must hold every group's inputs (zeros past the row's width: a short last group's padding then adds
    nothing). Each 32 bytes of a group give 32 low nibbles (against x at the group's start + 32 c) and 32
    high ones (against x half a group further), less 8, through ``llvm.x86.avx512.pmaddw.d.512``; the
    group's 16 int32 lanes become fp32 and join a 16-lane fp32 sum times its scale. Needs ``AVX512BW``."""
    half, chunks = group // 2, group // 64

    @intrinsic
    def dot(typingctx, xq, packed, scales, n):  # noqa: ARG001
        if not (AVX512BW and _c_array(xq, types.int16, 1) and _c_array(packed, types.uint8, 2)
                and _c_array(scales, types.float32, 2)):
            return None

        def codegen(context, builder, signature, args):  # noqa: ARG001
            int8, int16, int32, int64 = (ir.IntType(bits) for bits in (8, 16, 32, 64))
            lanes_type, pairs = ir.VectorType(int32, 16), ir.VectorType(int16, 32)
            floats = ir.VectorType(ir.FloatType(), 16)
            madd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(lanes_type, [pairs, pairs]),
                                                  "llvm.x86.avx512.pmaddw.d.512")
            x_data = context.make_array(signature.args[0])(context, builder, args[0]).data
            data = context.make_array(signature.args[1])(context, builder, args[1])
            scale_array = context.make_array(signature.args[2])(context, builder, args[2])
            groups = builder.extract_value(scale_array.shape, 1)
            row_bytes = builder.mul(args[3], builder.extract_value(data.shape, 1))
            row_scales = builder.mul(args[3], groups)
            eight, low_bits, shift = (ir.Constant(pairs, [value] * 32) for value in (8, 15, 4))
            zero = ir.Constant(floats, None)
            entry = builder.basic_block
            loop, done = builder.append_basic_block("groups.loop"), builder.append_basic_block("groups.done")
            builder.cbranch(builder.icmp_signed("<", int64(0), groups), loop, done)

            builder.position_at_end(loop)
            g = builder.phi(int64)
            total = builder.phi(floats)
            g.add_incoming(int64(0), entry)
            total.add_incoming(zero, entry)
            first_input = builder.mul(g, int64(group))
            lanes = ir.Constant(lanes_type, None)
            for c in range(chunks):
                at = builder.add(row_bytes, builder.add(builder.mul(g, int64(half)), int64(32 * c)))
                raw = builder.load(builder.bitcast(builder.gep(data.data, [at]), ir.VectorType(int8, 32).as_pointer()),
                                   align=1)
                nibbles = builder.zext(raw, pairs)
                low = builder.sub(builder.and_(nibbles, low_bits), eight)
                high = builder.sub(builder.lshr(nibbles, shift), eight)
                for weights, offset in ((low, 32 * c), (high, half + 32 * c)):
                    x_at = builder.gep(x_data, [builder.add(first_input, int64(offset))])
                    x = builder.load(builder.bitcast(x_at, pairs.as_pointer()), align=2)
                    lanes = builder.add(lanes, builder.call(madd, [x, weights]))
            scale = builder.load(builder.gep(scale_array.data, [builder.add(row_scales, g)]))
            scale = builder.insert_element(ir.Constant(floats, ir.Undefined), scale, int32(0))
            scale = builder.shuffle_vector(scale, scale, ir.Constant(ir.VectorType(int32, 16), [0] * 16))
            stepped = builder.fadd(total, builder.fmul(builder.sitofp(lanes, floats), scale, flags=["contract"]),
                                   flags=["contract", "reassoc"])
            following = builder.add(g, int64(1))
            g.add_incoming(following, loop)
            total.add_incoming(stepped, loop)
            builder.cbranch(builder.icmp_signed("<", following, groups), loop, done)

            builder.position_at_end(done)
            final = builder.phi(floats)
            final.add_incoming(zero, entry)
            final.add_incoming(stepped, loop)
            result = ir.Constant(ir.FloatType(), 0.0)
            for lane in range(16):
                result = builder.fadd(result, builder.extract_element(final, int32(lane)), flags=["reassoc"])
            return result

        return types.float32(xq, packed, scales, types.intp), codegen

    return dot


dot_int16_int4_g64_avx512 = _int4_groups_avx512(64)
"""A row of int4 in groups of 64 against int16 x (``_int4_groups_avx512``)."""
dot_int16_int4_g128_avx512 = _int4_groups_avx512(128)
"""A row of int4 in groups of 128 against int16 x (``_int4_groups_avx512``)."""
