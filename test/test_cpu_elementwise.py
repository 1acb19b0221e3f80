"""``cpu_kernels.elementwise`` and ``cpu_kernels.rope`` against their NumPy twins in ``numerics.ops``."""

from __future__ import annotations

import numpy as np
import pytest

from vla_edge_ros.cpu_kernels.elementwise import add_rms_norm, exp, rms_norm, silu_gate
from vla_edge_ros.cpu_kernels.rope import rotate_rows
from vla_edge_ros.numerics import ops


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return (3.0 * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def test_exp_is_within_fp32_rounding_of_numpy():
    x = np.concatenate([-np.geomspace(1e-8, 87.0, 2000), np.geomspace(1e-8, 87.0, 2000), [0.0]]).astype(np.float32)
    got = np.array([exp(value) for value in x], dtype=np.float32)
    np.testing.assert_allclose(got, np.exp(x), rtol=3e-7, atol=0)
    assert 0.0 < exp(np.float32(-1e4)) < 1.2e-38 and np.isfinite(exp(np.float32(1e4)))  # clamped, never garbage
    assert np.isnan(exp(np.float32(np.nan)))


@pytest.mark.parametrize("tokens", [1, 16])
def test_norms_and_the_gate_equal_the_numpy_twins(tokens):
    x, delta, weight = rand(tokens, 96), rand(tokens, 96, seed=1), rand(96, seed=2)
    eps = np.float32(1e-6)
    out = np.empty_like(x)
    rms_norm(x, weight, eps, out)
    np.testing.assert_allclose(out, ops.rms_norm(x, weight, 1e-6), rtol=2e-6, atol=1e-6)
    summed = x.copy()
    add_rms_norm(summed, delta, weight, eps, out)
    assert np.array_equal(summed, x + delta)
    np.testing.assert_allclose(out, ops.rms_norm(x + delta, weight, 1e-6), rtol=2e-6, atol=1e-6)
    gate_up = rand(tokens, 2 * 48, seed=3)
    gated = np.empty((tokens, 48), dtype=np.float32)
    silu_gate(gate_up, gated)
    np.testing.assert_allclose(gated, ops.silu(gate_up[:, :48]) * gate_up[:, 48:], rtol=2e-6, atol=1e-6)


def test_rotate_rows_is_apply_rope_bit_for_bit():
    k_rows = rand(50, 32)
    rows = np.array([[3, 7, -1, 20], [4, -1, 9, 21]], dtype=np.int64)  # [heads, tokens], -1: not held
    cos, sin = ops.rope_cos_sin(np.array([-5, 2, 7, -40], dtype=np.int32), ops.rope_inv_freq(32, 10000.0))
    want = k_rows.copy()
    held = rows >= 0
    column = np.broadcast_to(np.arange(4), rows.shape)[held]
    want[rows[held]] = ops.apply_rope(k_rows[rows[held]][:, None, :], cos[column], sin[column])[:, 0]
    rotate_rows(k_rows, rows, cos, sin)
    assert np.array_equal(k_rows, want)
