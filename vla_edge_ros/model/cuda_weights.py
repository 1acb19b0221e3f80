"""Checkpoint tensors onto the device, shared by the CUDA decoder and the CUDA vision tower.

Matrices go up in the format asked for (``reasoning.weights``): ``auto`` keeps their storage precision
(fp16, or bf16 as its uint16 bits), widened inside the kernels; ``float32``, ``bfloat16``, ``int8`` and
``int4`` are packed on the host by ``numerics.weight_formats`` (the same values the numpy backend holds)
and uploaded as they are, to be dequantized in registers. Several matrices that feed one GEMM are fused
along the output dimension (gate/up); every format scales per row, so fusing commutes with packing.
Norm weights and biases go up as fp32: exact, tiny, and one kernel variant fewer.
"""

from __future__ import annotations

import numpy as np

from .. import kernels
from ..numerics.weight_formats import DEFAULT_INT4_GROUP, pack
from .safetensors_io import StoredTensor

KINDS = {"F32": kernels.WeightKind.FP32, "F16": kernels.WeightKind.FP16, "BF16": kernels.WeightKind.BF16}


def device_matrix(*stored: StoredTensor, shape: tuple[int, int] | None = None, fmt: str = "auto",
                  group: int = DEFAULT_INT4_GROUP) -> kernels.DeviceWeight:
    """Upload 2-D weights [out, in] fused along ``out``, in format ``fmt`` (``weight_formats.FORMATS``; int4 in
    groups of ``group`` inputs), or ``auto``: in storage precision when they share one, else fp32.

    ``shape`` reshapes a single stored tensor first (a Conv3d kernel read as the [out, in] matrix of its GEMM).
    """
    arrays = [t.array if shape is None else t.array.reshape(shape) for t in stored]
    if fmt == "auto" and len({t.dtype for t in stored}) == 1:
        data = np.ascontiguousarray(np.concatenate(arrays))
        return kernels.DeviceWeight.of(kernels.to_device_weight(data, KINDS[stored[0].dtype]))
    widened = np.concatenate([StoredTensor(t.dtype, a).to_float32() for t, a in zip(stored, arrays)])
    return kernels.to_device_packed(pack(widened, "float32" if fmt == "auto" else fmt, group))

def device_vector(*stored: StoredTensor):
    """Upload 1-D tensors (norm weights, biases) as one fp32 vector, concatenated."""
    return kernels.to_device_vector(np.concatenate([t.to_float32() for t in stored]), kernels.WeightKind.FP32)
