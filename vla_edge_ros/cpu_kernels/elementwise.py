"""A layer's small steps inside compiled code: exp, RMSNorm (with the residual add before it), the SiLU gate.

Each is ``numerics.ops``' function of the same name (the twin ``test/test_cpu_elementwise.py`` holds it to)
in one call instead of the five to eight NumPy calls it takes there, which at a small model's widths cost
more than their arithmetic. Sums reorder (fast-math ``reassoc``), so results are the twin's within fp32
rounding; no "nnan": a NaN shows, as in NumPy.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.core.cgutils import ir  # llvmlite's IR module, as Numba's extension API uses it
from numba.extending import intrinsic

SUMS = dict(cache=True, nogil=True, fastmath={"reassoc", "contract"}, error_model="numpy")
"""Compile flags of kernels whose sums may reorder."""

_EXP_LOW, _EXP_HIGH = np.float32(-87.33), np.float32(88.0)  # 2^n stays a normal fp32 in between
_LOG2E = np.float32(1.44269504088896341)
_LN2_HI, _LN2_LO = np.float32(0.693359375), np.float32(-2.12194440e-4)
_P0, _P1, _P2 = np.float32(1.9875691500e-4), np.float32(1.3981999507e-3), np.float32(8.3334519073e-3)
_P3, _P4, _P5 = np.float32(4.1665795894e-2), np.float32(1.6666665459e-1), np.float32(5.0000001201e-1)


@intrinsic
def _float_of_bits(typingctx, bits):  # noqa: ARG001 (Numba passes the typing context)
    """The fp32 whose bit pattern is ``bits`` (int32)."""
    if bits != types.int32:
        return None

    def codegen(context, builder, signature, args):  # noqa: ARG001
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@njit(**SUMS, inline="always")
def exp(x):
    """exp(x) of an fp32 within 3e-7 relative (Cephes' expf: x = n ln 2 + r, a degree-7 polynomial in r,
    2^n from its exponent bits); below -87.33 it gives exp(-87.33) (< 1.2e-38), above 88 exp(88). Unlike
    libm's scalar call LLVM vectorises it: softmax's and SiLU's exps cost most otherwise. NaN stays NaN."""
    x = _EXP_LOW if x < _EXP_LOW else x
    x = _EXP_HIGH if x > _EXP_HIGH else x
    n = np.floor(x * _LOG2E + np.float32(0.5))
    r = x - n * _LN2_HI - n * _LN2_LO
    p = ((((_P0 * r + _P1) * r + _P2) * r + _P3) * r + _P4) * r + _P5  # written out: a loop kept LLVM scalar
    return (p * r * r + r + np.float32(1.0)) * _float_of_bits(np.int32((np.int32(n) + 127) << 23))


@njit(**SUMS)
def rms_norm(x, weight, eps, out):
    """out [T, H] = ``ops.rms_norm(x, weight, eps)`` of x [T, H]; ``eps`` fp32."""
    tokens, width = x.shape
    for t in range(tokens):
        total = np.float32(0.0)
        for i in range(width):
            total += x[t, i] * x[t, i]
        scale = np.float32(1.0) / np.sqrt(total / np.float32(width) + eps)
        for i in range(width):
            out[t, i] = x[t, i] * scale * weight[i]


@njit(**SUMS)
def add_rms_norm(x, delta, weight, eps, out):
    """x += delta (the residual add, in place), then out = ``rms_norm`` of the new x."""
    x += delta
    rms_norm(x, weight, eps, out)


@njit(**SUMS)
def silu_gate(gate_up, out):
    """out [T, I] = ``ops.silu(gate) * up`` of gate_up [T, 2 I] = [gate | up], the MLP's fused product."""
    tokens, width = out.shape
    for t in range(tokens):
        for i in range(width):
            gate = gate_up[t, i]
            out[t, i] = gate / (np.float32(1.0) + exp(-gate)) * gate_up[t, width + i]
