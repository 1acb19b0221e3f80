"""How many threads the compiled kernels use, and one launch at a time.

Numba's thread count is per calling thread, so the count set here is applied in whichever thread runs a
kernel. Numba's default threading layer (workqueue, the only one without TBB or OpenMP installed) aborts
the process when two threads launch parallel kernels at once, so launches take a lock; the kernels release
the GIL, so other Python threads (a ROS executor's) keep running meanwhile.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import numba

_LAUNCH = threading.Lock()
_threads = numba.config.NUMBA_NUM_THREADS


def set_threads(count: int) -> None:
    """Use ``count`` threads (1 to the cores Numba saw at start) for every later kernel call."""
    global _threads
    if not 1 <= count <= numba.config.NUMBA_NUM_THREADS:
        raise ValueError(f"threads must be 1 to {numba.config.NUMBA_NUM_THREADS}, got {count}")
    _threads = count


def threads() -> int:
    return _threads


@contextmanager
def launch() -> Iterator[None]:
    """Hold the launch lock with this thread's Numba thread count set."""
    with _LAUNCH:
        if numba.get_num_threads() != _threads:
            numba.set_num_threads(_threads)
        yield
