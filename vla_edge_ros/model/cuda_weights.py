"""Checkpoint tensors onto the device, shared by the CUDA decoder and the CUDA vision tower.

Matrices stay in their storage precision (fp16, or bf16 as its uint16 bits) and are widened inside the
kernels; several matrices that feed one GEMM are fused along the output dimension (q/k/v, gate/up).
Norm weights and biases go up as fp32: exact, tiny, and one kernel variant fewer.
"""

from __future__ import annotations

import numpy as np

from .. import kernels
from .safetensors_io import StoredTensor

KINDS = {"F32": kernels.WeightKind.FP32, "F16": kernels.WeightKind.FP16, "BF16": kernels.WeightKind.BF16}


def device_matrix(*stored: StoredTensor, shape: tuple[int, int] | None = None):
    """Upload 2-D weights [out, in] fused along ``out``, in storage precision when they share one (else fp32).

    ``shape`` reshapes a single stored tensor first (a Conv3d kernel read as the [out, in] matrix of its GEMM).
    """
    arrays = [t.array if shape is None else t.array.reshape(shape) for t in stored]
    if len({t.dtype for t in stored}) == 1:
        return kernels.to_device_weight(np.ascontiguousarray(np.concatenate(arrays)), KINDS[stored[0].dtype])
    widened = [StoredTensor(t.dtype, a).to_float32() for t, a in zip(stored, arrays)]
    return kernels.to_device_weight(np.concatenate(widened), kernels.WeightKind.FP32)


def device_vector(*stored: StoredTensor):
    """Upload 1-D tensors (norm weights, biases) as one fp32 vector, concatenated."""
    return kernels.to_device_vector(np.concatenate([t.to_float32() for t in stored]), kernels.WeightKind.FP32)
