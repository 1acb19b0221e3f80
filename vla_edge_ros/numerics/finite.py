"""Non-finite values: counted in stored weights, refused in what the model outputs.

A NaN in the logits is not a weak opinion: ``argmax`` of NaN logits is the first bin, which is a
confident near-full-speed command. So a checkpoint whose weights hold NaN or Inf is refused at load,
and a cycle whose hidden state or head input is not finite produces no action at all.

In every IEEE-style format a checkpoint stores (fp64, fp32, fp16, bf16) a value is non-finite exactly
when all its exponent bits are set (Inf with a zero mantissa, NaN otherwise). Counting on the raw bits
reads a bf16 tensor as it lies on disk, without widening it, and works the same for any float format a
checkpoint adds later (the scales of int8 and int4 weights are stored as one of these).
"""

from __future__ import annotations

import numpy as np

# safetensors dtype name -> (the unsigned integer of its width, the mask of its exponent bits)
EXPONENT_MASKS: dict[str, tuple[type, int]] = {
    "F64": (np.uint64, 0x7FF0_0000_0000_0000),
    "F32": (np.uint32, 0x7F80_0000),
    "F16": (np.uint16, 0x7C00),
    "BF16": (np.uint16, 0x7F80),
}
_CHUNK = 1 << 22  # elements per pass: the temporaries stay a few MB however large the tensor


class NonFiniteError(ValueError):
    """A model output (hidden state, logits, head input) that holds NaN or Inf: no action can come of it.

    A ValueError, as every error about bad input is (``config.USER_ERRORS``): a corrupt checkpoint is bad input."""


def count_nonfinite_bits(array: np.ndarray, dtype: str) -> int:
    """How many values of ``array`` (a float tensor's storage, in safetensors dtype ``dtype``) are NaN or Inf.

    Integer dtypes hold no non-finite values (0). The array is read in chunks, so a memory-mapped tensor
    is scanned once without a full-size temporary.
    """
    if dtype not in EXPONENT_MASKS:
        return 0
    unsigned, mask = EXPONENT_MASKS[dtype]
    flat = np.ascontiguousarray(array).reshape(-1).view(unsigned)
    exponent = unsigned(mask)
    return sum(int(np.count_nonzero((flat[start:start + _CHUNK] & exponent) == exponent))
               for start in range(0, flat.size, _CHUNK))


def require_finite(values: np.ndarray, what: str) -> np.ndarray:
    """``values`` when every one is finite; else NonFiniteError saying how many of them are not."""
    finite = np.isfinite(values)
    if not finite.all():
        bad = int(finite.size - np.count_nonzero(finite))
        raise NonFiniteError(f"{what}: not finite ({bad} of {finite.size} values NaN or Inf)")
    return values
