"""The narrow weight layouts (numerics/weight_formats.py): what each stores, what it stands for, what it costs."""

from __future__ import annotations

import numpy as np
import pytest

from vla_edge_ros.config import choices_of
from vla_edge_ros.numerics.bf16 import bf16_bits
from vla_edge_ros.numerics.weight_formats import (FORMATS, INT4_GROUPS, concat_rows, dequantize, matrix_bytes, pack,
                                                  pack_bf16_bits, reference_linear, take_rows)


def _weights(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((rows, cols)) * 0.05).astype(np.float32)


def test_int4_stores_each_group_as_low_then_high_nibbles_of_q_plus_8():
    """Group 32 of one row: input j in the low nibble of byte j, input j + 16 in the high one, as q + 8."""
    q = np.array([(j % 16) - 8 for j in range(32)], dtype=np.float32)  # every level -8..7, twice
    packed = pack(q[None, :] * 0.5, "int4", 32)
    assert packed.scales.tolist() == [[0.5]]
    expected = [(j % 16) | ((((j + 16) % 16)) << 4) for j in range(16)]
    assert packed.data.tolist() == [expected]
    np.testing.assert_array_equal(dequantize(packed), q[None, :] * 0.5)


def test_int8_is_symmetric_per_output_row():
    w = np.array([[1.0, -0.5, 0.25], [0.0, 0.0, 0.0], [-3.0, 1.5, 0.0]], dtype=np.float32)
    packed = pack(w, "int8")
    np.testing.assert_allclose(packed.scales, [1 / 127, 0.0, 3 / 127], rtol=1e-7)
    assert packed.data.tolist() == [[127, -64, 32], [0, 0, 0], [-127, 64, 0]]  # -63.5 rounds to even
    np.testing.assert_allclose(dequantize(packed)[0], [1.0, -64 / 127, 32 / 127], rtol=1e-6)


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_stands_for_the_matrix_within_its_rounding(fmt):
    w = _weights(37, 100)
    error = np.linalg.norm(dequantize(pack(w, fmt)) - w) / np.linalg.norm(w)
    assert error <= {"float32": 0.0, "bfloat16": 4e-3, "int8": 1.2e-2, "int4": 0.12}[fmt]


@pytest.mark.parametrize("group", INT4_GROUPS)
def test_a_short_last_int4_group_is_zero_padded(group):
    w = _weights(5, group + 7)  # one whole group and 7 inputs of the next
    packed = pack(w, "int4", group)
    assert packed.data.shape == (5, group) and packed.scales.shape == (5, 2) and packed.groups == 2
    assert dequantize(packed).shape == w.shape
    padded = np.concatenate((packed.data[:, group // 2 + 7:] & 0x0F, packed.data[:, group // 2:] >> 4), axis=1)
    assert (padded == 8).all()  # q = 0 past the last input


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(1, 1), (3, 100), (64, 129)])
def test_matrix_bytes_is_what_packing_holds(fmt, shape):
    for group in INT4_GROUPS if fmt == "int4" else (64,):
        assert matrix_bytes(*shape, fmt, group) == pack(_weights(*shape), fmt, group).nbytes


def test_bf16_bits_are_kept_as_they_are():
    bits = bf16_bits(_weights(4, 6))
    packed = pack_bf16_bits(bits)
    np.testing.assert_array_equal(packed.data, bits)
    np.testing.assert_array_equal(pack(dequantize(packed), "bfloat16").data, bits)  # exact both ways


@pytest.mark.parametrize("fmt", FORMATS)
def test_stacked_rows_and_taken_rows_are_the_packed_stack_and_slice(fmt):
    a, b = _weights(7, 96, 1), _weights(5, 96, 2)
    stacked = concat_rows(pack(a, fmt), pack(b, fmt))
    np.testing.assert_array_equal(dequantize(stacked), dequantize(pack(np.concatenate((a, b)), fmt)))
    np.testing.assert_array_equal(dequantize(take_rows(stacked, slice(3, 9))), dequantize(stacked)[3:9])
    np.testing.assert_array_equal(dequantize(take_rows(stacked, np.array([11, 0]))), dequantize(stacked)[[11, 0]])
    with pytest.raises(ValueError, match="one format"):
        concat_rows(pack(a, fmt), pack(a, "int8" if fmt != "int8" else "int4"))


def test_reference_linear_is_the_product_with_the_dequantized_matrix():
    w, x, bias = _weights(9, 40), _weights(3, 40, 5), _weights(1, 9, 6)[0]
    packed = pack(w, "int4", 32)
    np.testing.assert_allclose(reference_linear(x, packed, bias), x @ dequantize(packed).T + bias, rtol=1e-6)


def test_bad_formats_and_groups_are_refused():
    with pytest.raises(ValueError, match="weight format must be one of"):
        pack(_weights(2, 2), "int3")
    with pytest.raises(ValueError, match="int4 group must be one of"):
        pack(_weights(2, 2), "int4", 48)
    with pytest.raises(ValueError, match="2-D"):
        pack(np.zeros(4, np.float32), "int8")


def test_the_schema_offers_exactly_these_formats_and_groups():
    """config.py sits beside numerics/ (neither imports the other), so the lists are written twice: held equal."""
    assert choices_of("reasoning", "weights") == ("auto",) + FORMATS
    assert choices_of("reasoning", "weights_group") == INT4_GROUPS


def test_stored_kv_is_bound_to_the_format_when_it_changes_the_weights(tiny_model):
    """KV computed with int8 weights is not the KV of the files' weights: another fingerprint, so a stored
    block is a miss, never a load. Holding bf16 files as bf16 changes nothing, so it keeps the fingerprint."""
    from vla_edge_ros.kv_store.fingerprint import model_fingerprint
    from vla_edge_ros.model.checkpoint import load_checkpoint

    prints = {w: model_fingerprint(load_checkpoint(tiny_model, weights=w)) for w in ("auto", "bfloat16", "int8", "int4")}
    assert load_checkpoint(tiny_model).storage_dtype == "BF16"
    assert prints["auto"] == prints["bfloat16"]
    assert len({prints["auto"], prints["int8"], prints["int4"]}) == 3
    assert model_fingerprint(load_checkpoint(tiny_model, weights="int4", weights_group=32)) != prints["int4"]
