"""bf16 <-> fp32 on the host. NumPy has no bf16 dtype, so a bf16 value lives as its uint16 bit pattern."""

from __future__ import annotations

import numpy as np


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """Round fp32 values to bf16 (nearest, ties to even; NaN stays NaN), returned as uint16 bits."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    bits = values.view(np.uint32)
    tie_to_even = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = ((bits + np.uint32(0x7FFF) + tie_to_even) >> np.uint32(16)).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded).astype(np.uint16)


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """Widen bf16 bit patterns to fp32 exactly: they are the high half of the fp32 bits."""
    return (np.ascontiguousarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
