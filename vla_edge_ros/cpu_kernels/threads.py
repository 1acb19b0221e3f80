"""How many threads the compiled kernels use, and one launch at a time.

Numba's thread count is per calling thread, so the count set here is applied in whichever thread runs a
kernel. Numba takes the threading layer it finds (OpenMP on the development machine); its fallback,
workqueue, aborts the process when two threads launch parallel kernels at once, so launches take a lock.
The kernels release the GIL, so other Python threads (a ROS executor's) keep running meanwhile. OpenMP's
and OpenBLAS's workers both spin a while after their work: on two cores, a 2-thread kernel called between
2-thread BLAS calls ran 5-7x slower (median) than next to 1-thread ones: two here go with ``blas_threads`` 1.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import numba

_LAUNCH = threading.Lock()
_threads = 1  # until set_threads says otherwise: spinning workers on shared cores cost more than they give


def set_threads(count: int) -> None:
    """Use ``count`` threads (1 to the cores Numba saw at start; 0: all of them) for every later kernel call."""
    global _threads
    cores = numba.config.NUMBA_NUM_THREADS
    if not 0 <= count <= cores:
        raise ValueError(f"threads must be 0 (every core) to {cores}, got {count}")
    _threads = count or cores


def threads() -> int:
    return _threads


@contextmanager
def launch() -> Iterator[None]:
    """Hold the launch lock with this thread's Numba thread count set."""
    with _LAUNCH:
        if numba.get_num_threads() != _threads:
            numba.set_num_threads(_threads)
        yield
