"""The compiled CPU kernels against ``reference_linear``, their NumPy twin, on shapes that catch layout slips.

Widths of 100 and 320 leave a short last int4 group for every group size (256 leaves none), so a nibble
order, a scale index or a group boundary that is wrong moves the result by far more than the tolerance;
token counts straddle ``DECODE_TOKENS`` so both the matrix-vector kernels and the blocked BLAS path run.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

from vla_edge_ros.cpu_kernels import DECODE_TOKENS, linear, product, set_threads, threads
from vla_edge_ros.numerics.weight_formats import PackedMatrix, pack, reference_linear

PACKINGS = [("float32", 0), ("bfloat16", 0), ("int8", 0), ("int4", 32), ("int4", 64), ("int4", 128)]
TOKENS = [1, 2, 5, DECODE_TOKENS, DECODE_TOKENS + 1, 70]
THREADS = [1, 2] if numba.config.NUMBA_NUM_THREADS >= 2 else [1]


@pytest.fixture(autouse=True)
def restore_threads():
    before = threads()
    yield
    set_threads(before)


def packed(fmt: str, group: int, rows: int, width: int, seed: int = 0) -> PackedMatrix:
    weights = np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32)
    return pack(weights, fmt, group) if group else pack(weights, fmt)


def tokens_of(count: int, width: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, width)).astype(np.float32)


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    """Within fp32 rounding of a different summation order: 1e-5 of the output's scale."""
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("fmt,group", PACKINGS)
@pytest.mark.parametrize("count", TOKENS)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("thread_count", THREADS)
def test_linear_equals_the_numpy_twin(fmt, group, count, with_bias, thread_count):
    set_threads(thread_count)
    for rows, width in ((1, 100), (3, 320), (37, 256)):
        matrix = packed(fmt, group, rows, width)
        x = tokens_of(count, width)
        bias = np.random.default_rng(2).standard_normal(rows).astype(np.float32) if with_bias else None
        assert_close(linear(x, matrix, bias), reference_linear(x, matrix, bias))


@pytest.mark.parametrize("fmt,group", PACKINGS)
@pytest.mark.parametrize("count", [1, 70])
def test_out_is_filled_and_returned(fmt, group, count):
    matrix = packed(fmt, group, 5, 100)
    x = tokens_of(count, 100)
    out = np.full((count, 5), np.nan, dtype=np.float32)
    assert linear(x, matrix, out=out) is out
    assert_close(out, reference_linear(x, matrix))


@pytest.mark.parametrize("fmt,group", PACKINGS)
def test_prefill_over_many_blocks_with_a_short_last_one(fmt, group, monkeypatch):
    monkeypatch.setattr(product, "_BLOCK_BYTES", 3 * 4 * 100)  # 3 rows a block: 11 blocks, the last of 2
    matrix = packed(fmt, group, 32, 100)
    x = tokens_of(DECODE_TOKENS + 1, 100)
    bias = np.arange(32, dtype=np.float32)
    assert_close(linear(x, matrix, bias), reference_linear(x, matrix, bias))


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # BLAS's inf * 0, as the twin's
@pytest.mark.parametrize("fmt,group", PACKINGS)
@pytest.mark.parametrize("count", [2, 70])
def test_non_finite_input_gives_non_finite_output(fmt, group, count):
    """A NaN or inf in a token reaches every output of that token (no masking), and no other token's."""
    matrix = packed(fmt, group, 7, 100)
    x = tokens_of(count, 100)
    x[0, 41] = np.nan
    x[1, 99] = np.inf
    out = linear(x, matrix)
    assert not np.isfinite(out[:2]).any()
    assert np.isfinite(out[2:]).all()


def test_a_matrix_of_one_row_and_no_tokens():
    matrix = packed("int4", 64, 1, 100)
    assert linear(np.zeros((0, 100), np.float32), matrix).shape == (0, 1)


def test_wrong_shapes_are_refused():
    matrix = packed("int8", 0, 3, 100)
    with pytest.raises(ValueError, match="x must be"):
        linear(tokens_of(1, 99), matrix)
    with pytest.raises(ValueError, match="out must be"):
        linear(tokens_of(1, 100), matrix, out=np.empty((1, 4), np.float32))
    with pytest.raises(ValueError, match="bias must be"):
        linear(tokens_of(1, 100), matrix, np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="threads must be"):
        set_threads(-1)


def test_zero_threads_means_every_core():
    before = threads()
    try:
        set_threads(0)
        assert threads() == numba.config.NUMBA_NUM_THREADS
    finally:
        set_threads(before)
