"""Host-side launch plumbing shared by the launchers: grid arithmetic and argument checks.

The checks run before every launch because an out-of-bounds index in a CUDA kernel corrupts
memory or reads garbage silently instead of raising; a shape mistake must fail on the host.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np


class DeviceArray(Protocol):
    """What the launchers need from a Numba device array (a real one or the simulator's)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    size: int


Stream = object
"""A Numba CUDA stream, or 0 for the default stream."""

CudaFunction = Callable[..., Any]
"""A Numba CUDA kernel or device function (the simulator's stand-in under test)."""


def cdiv(a: int, b: int) -> int:
    """Ceiling division for grid sizes."""
    return -(-a // b)


def check(condition: bool, message: str) -> None:
    """Raise ValueError with `message` unless `condition` holds."""
    if not condition:
        raise ValueError(message)


def dims(array: DeviceArray, name: str, rank: int) -> tuple[int, ...]:
    """The shape of `array`, after checking that it has `rank` dimensions."""
    check(
        len(array.shape) == rank,
        f"{name} must have {rank} dimensions, got shape {tuple(array.shape)}",
    )
    return tuple(array.shape)


def check_array(
    array: DeviceArray,
    name: str,
    shape: Sequence[int | None],
    dtypes: Sequence[np.dtype | type],
) -> None:
    """Check rank, the dimensions given (None = any) and that the dtype is one of `dtypes`."""
    for axis, (got, want) in enumerate(zip(dims(array, name, len(shape)), shape, strict=True)):
        check(
            want is None or got == want,
            f"{name} has size {got} on axis {axis}, expected {want} (shape {tuple(array.shape)})",
        )
    allowed = [np.dtype(d) for d in dtypes]
    check(
        np.dtype(array.dtype) in allowed,
        f"{name} has dtype {np.dtype(array.dtype)}, expected one of {[str(d) for d in allowed]}",
    )
