"""Read and write safetensors files with NumPy, bf16 included.

The format is an 8-byte little-endian header length, a JSON header mapping tensor names to
dtype/shape/byte offsets, then the raw bytes. We parse it ourselves because the ``safetensors``
NumPy bindings cannot represent bf16, which is how Qwen2 checkpoints ship; bf16 tensors are kept
as their raw uint16 bits (memory-mapped, no copy) and widened to fp32 only when asked.
"""

from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..numerics.bf16 import bf16_bits_to_float32
from ..numerics.finite import count_nonfinite_bits

_NUMPY_DTYPES = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # raw bits; see StoredTensor.to_float32
    "F64": np.dtype("<f8"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "U8": np.dtype("u1"),
}
_MAX_HEADER_BYTES = 100 * 1024 * 1024


class SafetensorsError(ValueError):
    """A safetensors file that is truncated, malformed or inconsistent with itself."""


@dataclass(frozen=True)
class StoredTensor:
    """A tensor as stored on disk: its safetensors dtype name and a NumPy view of its bytes."""

    dtype: str
    array: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    def to_float32(self) -> np.ndarray:
        """Widen to fp32 exactly."""
        if self.dtype == "BF16":
            return bf16_bits_to_float32(self.array)
        return self.array.astype(np.float32)

    def nonfinite_count(self) -> int:
        """How many values are NaN or Inf, read from the stored bits (``numerics/finite.py``)."""
        return count_nonfinite_bits(self.array, self.dtype)

    def release(self) -> None:
        """Give back the memory a read of this tensor left resident: the pages of the mapped file that lie wholly
        inside its bytes. The file is mapped read-only, so nothing is lost: a later read faults them in again from
        the page cache. Without this, every tensor a load reads once (the finite check, packing into a narrower
        format) stays in the process's resident memory beside what it was packed into."""
        root = self.array
        while isinstance(root.base, np.ndarray):
            root = root.base
        if not isinstance(root, np.memmap) or not isinstance(root.base, mmap.mmap) or not self.array.nbytes:
            return
        mapping_start = root.ctypes.data - root.offset % mmap.ALLOCATIONGRANULARITY
        begin = self.array.ctypes.data - mapping_start
        first = -(-begin // mmap.PAGESIZE) * mmap.PAGESIZE
        last = (begin + self.array.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if last > first:
            root.base.madvise(mmap.MADV_DONTNEED, first, last - first)


def read_safetensors(path: str | Path) -> dict[str, StoredTensor]:
    """Memory-map ``path`` and return its tensors; any inconsistency raises SafetensorsError."""
    path = Path(path)
    size = path.stat().st_size
    if size < 8:
        raise SafetensorsError(f"{path}: {size} bytes is too short to be a safetensors file")
    with path.open("rb") as handle:
        (header_len,) = struct.unpack("<Q", handle.read(8))
        if header_len > min(_MAX_HEADER_BYTES, size - 8):
            raise SafetensorsError(f"{path}: header length {header_len} exceeds the file ({size} bytes): truncated?")
        header = _parse_header(handle.read(header_len), path)
    data_start = 8 + header_len
    data_len = size - data_start
    buffer = np.memmap(path, dtype=np.uint8, mode="r", offset=data_start, shape=(data_len,)) if data_len else np.empty(0, np.uint8)
    return _tensor_views(header, buffer, path)


def unpack_arrays(data: bytes | memoryview, source: str) -> dict[str, np.ndarray]:
    """The arrays of an in-memory safetensors image (as ``pack_arrays`` makes), as read-only views."""
    size = len(data)
    if size < 8:
        raise SafetensorsError(f"{source}: {size} bytes is too short to be a safetensors image")
    (header_len,) = struct.unpack_from("<Q", data, 0)
    if header_len > min(_MAX_HEADER_BYTES, size - 8):
        raise SafetensorsError(f"{source}: header length {header_len} exceeds the image ({size} bytes)")
    header = _parse_header(bytes(data[8:8 + header_len]), source)
    buffer = np.frombuffer(data, dtype=np.uint8, offset=8 + header_len)
    return {name: tensor.array for name, tensor in _tensor_views(header, buffer, source).items()}


def _parse_header(raw: bytes, source: object) -> dict:
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SafetensorsError(f"{source}: header is not valid JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise SafetensorsError(f"{source}: header is not a JSON object")
    return header


def _tensor_views(header: dict, buffer: np.ndarray, source: object) -> dict[str, StoredTensor]:
    data_len = buffer.size
    tensors: dict[str, StoredTensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype_name = info["dtype"]
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SafetensorsError(f"{source}: tensor {name!r} has a malformed header entry: {info!r}") from exc
        if dtype_name not in _NUMPY_DTYPES:
            raise SafetensorsError(f"{source}: tensor {name!r} has unsupported dtype {dtype_name}")
        dtype = _NUMPY_DTYPES[dtype_name]
        expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if not 0 <= begin <= end <= data_len or end - begin != expected:
            raise SafetensorsError(
                f"{source}: tensor {name!r} ({dtype_name}{list(shape)}) has byte range [{begin}, {end}) "
                f"that does not fit its shape or the {data_len} data bytes: truncated or corrupt")
        tensors[name] = StoredTensor(dtype_name, buffer[begin:end].view(dtype).reshape(shape))
    return tensors


def write_safetensors(path: str | Path, tensors: dict[str, StoredTensor], metadata: dict[str, str] | None = None) -> None:
    """Write tensors (already in their storage dtype) as one safetensors file."""
    with Path(path).open("wb") as handle:
        for chunk in _encode(tensors, metadata or {"format": "pt"}):
            handle.write(chunk)


def pack_arrays(arrays: dict[str, np.ndarray]) -> bytes:
    """One in-memory safetensors image of plain NumPy arrays (f32/f64/f16, i32/i64, u8 and bool as u8)."""
    tensors = {}
    for name, array in arrays.items():
        array = np.asarray(array)
        if array.dtype == np.bool_:
            array = array.astype(np.uint8)
        names = [key for key, dtype in _NUMPY_DTYPES.items() if dtype == array.dtype.newbyteorder("<") and key != "BF16"]
        if not names:
            raise SafetensorsError(f"array {name!r} has dtype {array.dtype}, which a safetensors image cannot hold")
        tensors[name] = StoredTensor(names[0], array)
    return b"".join(_encode(tensors, {"format": "np"}))


def _encode(tensors: dict[str, StoredTensor], metadata: dict[str, str]):
    """The header, then each tensor's little-endian bytes, as a sequence of chunks."""
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for name, tensor in tensors.items():
        nbytes = tensor.array.nbytes
        header[name] = {"dtype": tensor.dtype, "shape": list(tensor.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # keep tensor data 8-byte aligned, as the reference writer does
    yield struct.pack("<Q", len(encoded))
    yield encoded
    for name, tensor in tensors.items():
        yield np.ascontiguousarray(tensor.array, dtype=_NUMPY_DTYPES[tensor.dtype]).tobytes()
