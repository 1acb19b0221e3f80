"""Which compute backend runs the decoder (and, through ``vl/tower.py``, a VL checkpoint's vision tower):
``numpy`` anywhere, ``cuda`` on an NVIDIA GPU, ``auto`` picks."""

from __future__ import annotations

from ..config import choices_of
from ..dependencies import missing
from .arena import KVArena
from .backend import Backend
from .checkpoint import Checkpoint

BACKENDS = choices_of("reasoning", "backend")  # auto, numpy, cuda


def cuda_simulated() -> bool:
    """True when Numba's CUDA simulator stands in for a GPU (NUMBA_ENABLE_CUDASIM=1, as in the tests)."""
    try:
        from numba import config
    except ImportError:
        return False
    return bool(config.ENABLE_CUDASIM)


def cuda_installed() -> bool:
    """True when numba-cuda, the CUDA target the kernels are built and tested on, is installed (the cuda extra);
    Numba's own built-in target, deprecated, does not count."""
    try:
        import numba_cuda  # noqa: F401
    except ModuleNotFoundError:
        return False
    return True


def cuda_available() -> bool:
    """True when a real CUDA device is usable (Numba's simulator does not count)."""
    if cuda_simulated() or not cuda_installed():
        return False
    try:
        from numba import cuda
    except ImportError:
        return False
    try:
        return bool(cuda.is_available())
    except Exception:  # a broken driver install must not take the numpy path down with it
        return False


def resolve_backend(name: str) -> str:
    """``auto`` means cuda when a GPU is present, else numpy."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    if name == "auto":
        return "cuda" if cuda_available() else "numpy"
    return name


def on_cuda(name: str) -> bool:
    """Whether backend ``name`` runs on CUDA; refuses 'cuda' where no GPU (or simulator) is usable."""
    if resolve_backend(name) != "cuda":
        return False
    if not cuda_installed():
        raise missing("cuda", "backend 'cuda'")
    if not (cuda_available() or cuda_simulated()):
        raise ValueError("backend 'cuda' was requested but no CUDA GPU is usable here; use 'auto' or 'numpy'")
    return True


def make_backend(name: str, checkpoint: Checkpoint, arena: KVArena) -> Backend:
    """Build the requested backend over ``arena``."""
    if on_cuda(name):
        from .cuda_backend import CudaBackend

        return CudaBackend(checkpoint, arena)
    from .numpy_backend import NumpyBackend

    return NumpyBackend(checkpoint, arena)
