"""The compiled CPU kernels against ``reference_linear``, their NumPy twin, on shapes that catch layout slips.

Widths of 100 and 320 leave a short last int4 group for every group size (256 leaves none), so a nibble
order, a scale index or a group boundary that is wrong moves the result by far more than the tolerance;
token counts straddle ``DECODE_TOKENS`` so both the matrix-vector kernels and the blocked BLAS path run.
int8 and int4 decoding round each token to int16 (a step of its largest |x| / 32767), so their products may
move by half a step times the row's absolute sum more: that bound, not a looser tolerance, is what they meet.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

from vla_edge_ros.cpu_kernels import DECODE_TOKENS, linear, matvec, product, set_threads, threads
from vla_edge_ros.cpu_kernels._intrinsics import AVX512BW, INT8_CHUNK, INT8_CHUNK_ROWS, INT8_ROWS, INT8_STEP
from vla_edge_ros.numerics.weight_formats import PackedMatrix, dequantize, pack, reference_linear

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


def activation_rounding(x: np.ndarray, matrix: PackedMatrix) -> np.ndarray:
    """[T, out]: how far int8 and int4 decoding's int16 tokens may move a product, half a step times |row|'s sum."""
    if matrix.format not in ("int8", "int4") or x.shape[0] > DECODE_TOKENS:
        return np.zeros((x.shape[0], matrix.shape[0]))
    steps = np.abs(x).max(axis=1, keepdims=True) / 32767
    return steps / 2 * np.abs(dequantize(matrix)).sum(axis=1)


def assert_close(got: np.ndarray, want: np.ndarray, rounding: np.ndarray | float = 0.0) -> None:
    """Within fp32 rounding of a different summation order (1e-5 of the output's scale) and ``rounding``."""
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_array_less(np.abs(got - want), 1e-5 * max(1.0, float(np.abs(want).max())) + rounding)


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
        assert_close(linear(x, matrix, bias), reference_linear(x, matrix, bias), activation_rounding(x, matrix))


INT8_KERNELS = [matvec.matvec_int8_portable] + ([matvec.matvec_int8] if AVX512BW else [])


@pytest.mark.parametrize("width", [101, 4096, 4097])
@pytest.mark.parametrize("thread_count", THREADS)
def test_bfloat16_rows_in_pairs_and_eights(width, thread_count):
    """bf16 reads weight pairs (an odd width goes to the widening path) and, from 4096 inputs, eight rows
    at a time: 19 rows are two eights and three single rows."""
    set_threads(thread_count)
    matrix = packed("bfloat16", 0, 19, width)
    for count in (1, 3):
        x = tokens_of(count, width)
        assert_close(linear(x, matrix), reference_linear(x, matrix))


def test_tokens_round_to_int16_within_half_a_step():
    """Each token's largest |x| becomes 32767, every input lands within half a step (and fp32 rounding)."""
    x = tokens_of(3, 1000) * np.float32(5)
    xq, steps = matvec._quantize_tokens(x, 1024)
    np.testing.assert_array_equal(steps, np.abs(x).max(axis=1) / np.float32(32767))
    assert np.abs(xq).max(axis=1).tolist() == [32767] * 3 and not xq[:, 1000:].any()
    xq = xq[:, :1000]
    assert (np.abs(xq * steps[:, None].astype(np.float64) - x) <= steps[:, None] * (0.5 + 1e-3)).all()


def integer_twin(x: np.ndarray, matrix: PackedMatrix) -> np.ndarray:
    """int8 decoding in NumPy on the kernels' own int16 tokens: exact integer sums, scaled in fp32."""
    xq, steps = matvec._quantize_tokens(x, x.shape[1])
    sums = (xq.astype(np.int64) @ matrix.data.T.astype(np.int64)).astype(np.float32)
    return sums * (steps[:, None] * matrix.scales)


@pytest.mark.parametrize("width", [100, INT8_STEP, 3 * INT8_STEP + 64, 4096 + 2 * INT8_CHUNK_ROWS + 37,
                                   INT8_CHUNK + 2 * INT8_STEP + 5])
@pytest.mark.parametrize("thread_count", THREADS)
def test_int8_kernels_give_the_integer_twins_bits(width, thread_count):
    """Both int8 kernels sum integers exactly, so each gives ``integer_twin``'s bits (over steps, tails and
    chunks, one row or, from 4096 inputs, ``INT8_ROWS`` at a time, and 3 left over); a zero and a tiny token
    take the fp32 path instead, and meet the twin there."""
    set_threads(thread_count)
    rows = 2 * INT8_ROWS + 3
    matrix = packed("int8", 0, rows, width)
    x = tokens_of(4, width)
    x[1] = 0.0
    x[2] *= 1e-32
    for kernel in INT8_KERNELS:
        out = np.full((4, rows), np.nan, dtype=np.float32)
        kernel(x, matrix.data, matrix.scales, np.zeros(0, np.float32), out)
        np.testing.assert_array_equal(out[[0, 3]], integer_twin(x, matrix)[[0, 3]])
        assert_close(out, reference_linear(x, matrix), activation_rounding(x, matrix))


INT4_KERNELS = [matvec.matvec_int4] + ([matvec.matvec_int4_avx512] if AVX512BW else [])


@pytest.mark.parametrize("group", [64, 128])
@pytest.mark.parametrize("width", [100, 256, 320, 4100])
@pytest.mark.parametrize("thread_count", THREADS)
def test_int4_kernels_meet_the_twin(group, width, thread_count):
    """The portable int4 kernel (fp32 products) and the AVX-512 one (int16 tokens, integer group sums) over
    whole and short last groups; a zero and a tiny token take the fp32 path in the latter."""
    set_threads(thread_count)
    matrix = packed("int4", group, 7, width)
    x = tokens_of(4, width)
    x[1] = 0.0
    x[2] *= 1e-32
    for kernel in INT4_KERNELS:
        out = np.full((4, 7), np.nan, dtype=np.float32)
        kernel(x, matrix.data, matrix.scales, group, np.zeros(0, np.float32), out)
        assert_close(out, reference_linear(x, matrix), activation_rounding(x, matrix))


def test_int8_activation_rounding_is_far_below_the_weights_own():
    """Tokens with a few huge inputs, as hidden states have, make the coarsest int16 steps; the rounding
    still moves products by under 1e-3 of their rms (measured 4.4e-4), 20 times below int8's own error."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((256, 8960)) * 0.02).astype(np.float32)
    matrix = pack(w, "int8")
    x = rng.standard_normal((4, 8960)).astype(np.float32)
    x[:, rng.choice(8960, 4, replace=False)] = 3000.0
    twin = reference_linear(x, matrix)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)

    def rms(a: np.ndarray) -> float:
        return float(np.sqrt(np.mean(np.square(a))))

    rounding = rms(linear(x, matrix) - twin) / rms(twin)
    assert 0 < rounding < 1e-3 and rounding < rms(twin - exact) / rms(exact) / 10


@pytest.mark.parametrize("fmt,group", PACKINGS)
@pytest.mark.parametrize("count", [1, 70])
def test_out_is_filled_and_returned(fmt, group, count):
    matrix = packed(fmt, group, 5, 100)
    x = tokens_of(count, 100)
    out = np.full((count, 5), np.nan, dtype=np.float32)
    assert linear(x, matrix, out=out) is out
    assert_close(out, reference_linear(x, matrix), activation_rounding(x, matrix))


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


@pytest.mark.parametrize("fmt,group", PACKINGS)
@pytest.mark.parametrize("width", [100, 4100])
def test_read_only_weights(fmt, group, width):
    """Weights mapped from a file are read-only arrays: every kernel takes them (a second compilation)."""
    matrix = packed(fmt, group, 35, width)
    for array in (matrix.data, matrix.scales):
        if array is not None:
            array.setflags(write=False)
    x = tokens_of(2, width)
    assert_close(linear(x, matrix), reference_linear(x, matrix), activation_rounding(x, matrix))


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
