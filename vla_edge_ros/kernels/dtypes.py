"""Weight storage kinds and their host-side conversions.

Weights stay on the device in the checkpoint's precision (halving memory and bandwidth for fp16 and
bf16) and are widened to fp32 inside the kernels. Numba has no portable bf16 array type, so a bf16
weight lives on the device as its raw uint16 bit pattern; the dtype of a device weight therefore
names its kind unambiguously: float32, float16 or uint16 (bf16 bits).
"""

from __future__ import annotations

import enum

import numpy as np
from numba import cuda

from vla_edge_ros.kernels._launch import DeviceArray, Stream
from vla_edge_ros.numerics.bf16 import bf16_bits_to_float32


class WeightKind(enum.Enum):
    """How a weight matrix is stored on the device."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"

    @property
    def storage_dtype(self) -> np.dtype:
        """The NumPy dtype of the stored elements (uint16 bit patterns for bf16)."""
        return np.dtype({"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16}[self.value])


def weight_kind_of(array: DeviceArray | np.ndarray) -> WeightKind:
    """The kind of a stored weight, read from its dtype."""
    dtype = np.dtype(array.dtype)
    for kind in WeightKind:
        if kind.storage_dtype == dtype:
            return kind
    raise TypeError(f"no weight kind is stored as {dtype}; use float32, float16 or uint16 (bf16)")


def to_float32(array: np.ndarray, kind: WeightKind) -> np.ndarray:
    """Decode a host array stored as `kind` into fp32 (exact for every kind)."""
    _check_storage(array, kind)
    if kind is WeightKind.BF16:
        return bf16_bits_to_float32(array)
    return np.asarray(array, dtype=np.float32)


def to_device_weight(array: np.ndarray, kind: WeightKind, stream: Stream = 0) -> DeviceArray:
    """Upload a weight matrix or embedding table in its storage kind (no widening on the host)."""
    _check_storage(array, kind)
    return cuda.to_device(np.ascontiguousarray(array), stream=stream)


def to_device_vector(array: np.ndarray, kind: WeightKind, stream: Stream = 0) -> DeviceArray:
    """Upload a bias or norm weight as fp32: exact, tiny, and keeps the kernels to one variant."""
    return cuda.to_device(np.ascontiguousarray(to_float32(array, kind)), stream=stream)


def _check_storage(array: np.ndarray, kind: WeightKind) -> None:
    if np.dtype(array.dtype) != kind.storage_dtype:
        raise TypeError(
            f"a {kind.value} weight must be stored as {kind.storage_dtype}, got {array.dtype}"
        )
