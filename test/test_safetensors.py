"""Our safetensors reader/writer: round trips, bf16, and refusal of damaged files."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from vla_edge_ros.model.safetensors_io import SafetensorsError, StoredTensor, read_safetensors, write_safetensors
from vla_edge_ros.numerics.bf16 import bf16_bits


def test_round_trip_all_storage_dtypes(tmp_path):
    rng = np.random.default_rng(1)
    values = rng.standard_normal((3, 5)).astype(np.float32)
    tensors = {
        "a": StoredTensor("F32", values),
        "b": StoredTensor("F16", values.astype(np.float16)),
        "c": StoredTensor("BF16", bf16_bits(values)),
        "scalar_like": StoredTensor("F32", np.array([7.0], np.float32)),
    }
    write_safetensors(tmp_path / "m.safetensors", tensors)
    back = read_safetensors(tmp_path / "m.safetensors")
    assert set(back) == set(tensors)
    np.testing.assert_array_equal(back["a"].to_float32(), values)
    np.testing.assert_array_equal(back["b"].to_float32(), values.astype(np.float16).astype(np.float32))
    np.testing.assert_allclose(back["c"].to_float32(), values, rtol=2 ** -8)


def test_bf16_matches_torch_rounding():
    torch = pytest.importorskip("torch")
    values = np.random.default_rng(2).standard_normal(10_000).astype(np.float32) * 100
    expected = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(bf16_bits(values), expected)


def test_reads_files_written_by_the_safetensors_library(tmp_path):
    from safetensors.numpy import save_file

    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    save_file({"w": values}, str(tmp_path / "x.safetensors"))
    np.testing.assert_array_equal(read_safetensors(tmp_path / "x.safetensors")["w"].to_float32(), values)


def _write(path, header: dict, data: bytes) -> None:
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)


@pytest.mark.parametrize("damage", ["truncated_data", "huge_header", "bad_json", "bad_dtype", "short_file", "bad_entry"])
def test_damaged_files_are_refused_with_a_reason(tmp_path, damage):
    path = tmp_path / "bad.safetensors"
    good_header = {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}
    if damage == "truncated_data":
        _write(path, good_header, b"\0" * 10)
    elif damage == "huge_header":
        path.write_bytes(struct.pack("<Q", 10 ** 12) + b"{}")
    elif damage == "bad_json":
        path.write_bytes(struct.pack("<Q", 5) + b"{nope")
    elif damage == "bad_dtype":
        _write(path, {"w": {"dtype": "C64", "shape": [2], "data_offsets": [0, 16]}}, b"\0" * 16)
    elif damage == "short_file":
        path.write_bytes(b"abc")
    else:
        _write(path, {"w": {"dtype": "F32"}}, b"")
    with pytest.raises(SafetensorsError, match="bad.safetensors"):
        read_safetensors(path)


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def test_a_released_tensor_gives_its_pages_back_and_loses_nothing(tmp_path):
    """A load reads every tensor once (the finite check, packing): release() drops those file pages from the
    process's resident memory, and a later read faults the same values in again."""
    values = np.arange(16 << 20, dtype=np.float32)  # 64 MiB
    path = tmp_path / "big.safetensors"
    write_safetensors(path, {"a": StoredTensor("F32", np.ones(3, np.float32)), "big": StoredTensor("F32", values)})
    big = read_safetensors(path)["big"]
    assert float(big.array.sum(dtype=np.float64)) == float(values.sum(dtype=np.float64))  # every page read
    before = _resident_bytes()
    big.release()
    assert before - _resident_bytes() > 48 << 20
    np.testing.assert_array_equal(big.array, values)
    StoredTensor("F32", values).release()  # not mapped: nothing to give back
    np.testing.assert_array_equal(values[:3], [0.0, 1.0, 2.0])
