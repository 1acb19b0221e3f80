"""Weight storage kinds, the device weight ``linear`` reads, and their host-side conversions.

Weights stay on the device in the checkpoint's precision (halving memory and bandwidth for fp16 and
bf16), or in int8 / int4 (``numerics.weight_formats``: a quarter or an eighth of fp32's bytes, which
is what a decode step's time is), and are widened to fp32 inside the kernels. Numba has no portable
bf16 array type, so a bf16 weight lives on the device as its raw uint16 bit pattern; the dtype of a
float weight therefore names its kind unambiguously: float32, float16 or uint16 (bf16 bits), and such
an array stands alone (an embedding table, a matrix). An int8 or int4 matrix does not: its values need
their scales (and int4 its group), so ``linear`` takes a ``DeviceWeight`` that carries them together.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
from numba import cuda

from vla_edge_ros.kernels._launch import DeviceArray, Stream, check, check_array, dims
from vla_edge_ros.numerics.bf16 import bf16_bits_to_float32
from vla_edge_ros.numerics.weight_formats import INT4_GROUPS, PackedMatrix


class WeightKind(enum.Enum):
    """How a weight matrix is stored on the device."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"  # int8 [out, in], an fp32 scale per row
    INT4 = "int4"  # uint8 [out, groups * group / 2] of Q4_0-ordered nibbles, an fp32 scale per row and group

    @property
    def storage_dtype(self) -> np.dtype:
        """The NumPy dtype of the stored elements (uint16 bit patterns for bf16, nibble pairs for int4)."""
        return np.dtype({"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16, "int8": np.int8,
                         "int4": np.uint8}[self.value])

    @property
    def scaled(self) -> bool:
        """Whether stored values need scales to mean anything (int8, int4)."""
        return self in (WeightKind.INT8, WeightKind.INT4)


ELEMENT_KINDS = (WeightKind.FP32, WeightKind.FP16, WeightKind.BF16)
"""The kinds whose stored elements are values on their own: what an embedding table or a bare array holds."""

_FORMAT_KINDS = {"float32": WeightKind.FP32, "bfloat16": WeightKind.BF16, "int8": WeightKind.INT8,
                 "int4": WeightKind.INT4}


@dataclass(frozen=True)
class DeviceWeight:
    """A weight matrix [out, in] on the device, as ``linear`` reads it: the stored data and, for int8 and
    int4, the fp32 scales (``[out]``; ``[out, groups]`` with ``group`` inputs each) in the layouts of
    ``numerics.weight_formats``. ``shape`` is the matrix's, since int4's data is padded to whole groups."""

    kind: WeightKind
    shape: tuple[int, int]
    data: DeviceArray
    scales: DeviceArray | None = None
    group: int = 0

    @classmethod
    def of(cls, array: DeviceArray) -> DeviceWeight:
        """A float matrix held as a bare device array (fp32, fp16 or bf16 bits)."""
        rows, cols = dims(array, "w", 2)
        return cls(weight_kind_of(array), (rows, cols), array)

    @property
    def nbytes(self) -> int:
        """Device bytes of data and scales: what a product over the whole matrix reads."""
        return self.data.nbytes + (0 if self.scales is None else self.scales.nbytes)

    def __getitem__(self, rows: slice) -> DeviceWeight:
        """Output rows ``rows`` as a view (lm_head's action bins, a third of a fused qkv matrix)."""
        data = self.data[rows]
        scales = None if self.scales is None else self.scales[rows]
        return DeviceWeight(self.kind, (data.shape[0], self.shape[1]), data, scales, self.group)


def as_device_weight(weight: DeviceWeight | DeviceArray) -> DeviceWeight:
    """`weight` as a DeviceWeight (a bare array is a float matrix), its data and scales checked against its
    shape on the host: a kernel would read past them silently."""
    if not isinstance(weight, DeviceWeight):
        return DeviceWeight.of(weight)
    (rows, cols), kind = weight.shape, weight.kind
    check(kind.scaled == (weight.scales is not None), f"a {kind.value} weight has scales iff it is int8 or int4")
    if kind is WeightKind.INT4:
        check(weight.group in INT4_GROUPS, f"int4 group must be one of {INT4_GROUPS}, got {weight.group}")
        groups = -(-cols // weight.group)
        check_array(weight.data, "w", (rows, groups * weight.group // 2), (kind.storage_dtype,))
        check_array(weight.scales, "w scales", (rows, groups), (np.float32,))
    else:
        check_array(weight.data, "w", (rows, cols), (kind.storage_dtype,))
        if kind is WeightKind.INT8:
            check_array(weight.scales, "w scales", (rows,), (np.float32,))
    return weight


def weight_kind_of(array: DeviceArray | np.ndarray) -> WeightKind:
    """The kind of a bare stored weight, read from its dtype (int8 / int4 come as a ``DeviceWeight``)."""
    dtype = np.dtype(array.dtype)
    for kind in ELEMENT_KINDS:
        if kind.storage_dtype == dtype:
            return kind
    raise TypeError(f"no weight kind is stored as {dtype}; use float32, float16 or uint16 (bf16), "
                    "or a DeviceWeight for int8 / int4")


def to_float32(array: np.ndarray, kind: WeightKind) -> np.ndarray:
    """Decode a host array stored as `kind` into fp32 (exact for every element kind)."""
    _check_storage(array, kind)
    if kind.scaled:
        raise TypeError(f"{kind.value} values mean nothing without their scales: see weight_formats.dequantize")
    if kind is WeightKind.BF16:
        return bf16_bits_to_float32(array)
    return np.asarray(array, dtype=np.float32)


def to_device_weight(array: np.ndarray, kind: WeightKind, stream: Stream = 0) -> DeviceArray:
    """Upload a weight matrix or embedding table in its storage kind (no widening on the host)."""
    _check_storage(array, kind)
    return cuda.to_device(np.ascontiguousarray(array), stream=stream)


def to_device_packed(matrix: PackedMatrix, stream: Stream = 0) -> DeviceWeight:
    """Upload a ``weight_formats.pack``-ed matrix as is: its data and scales keep their host layout."""
    if matrix.format not in _FORMAT_KINDS:
        raise ValueError(f"no device kind holds weight format {matrix.format!r}")
    scales = None if matrix.scales is None else cuda.to_device(np.ascontiguousarray(matrix.scales), stream=stream)
    data = cuda.to_device(np.ascontiguousarray(matrix.data), stream=stream)
    return DeviceWeight(_FORMAT_KINDS[matrix.format], matrix.shape, data, scales, matrix.group)


def to_device_vector(array: np.ndarray, kind: WeightKind, stream: Stream = 0) -> DeviceArray:
    """Upload a bias or norm weight as fp32: exact, tiny, and keeps the kernels to one variant."""
    return cuda.to_device(np.ascontiguousarray(to_float32(array, kind)), stream=stream)


def _check_storage(array: np.ndarray, kind: WeightKind) -> None:
    if np.dtype(array.dtype) != kind.storage_dtype:
        raise TypeError(
            f"a {kind.value} weight must be stored as {kind.storage_dtype}, got {array.dtype}"
        )
