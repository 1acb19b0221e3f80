"""Time in the runtime: integer nanoseconds, on the monotonic clock live, or on a clock offline runs control.

``VirtualClock`` is bag (or simulation) time that only moves when told: block costs move it
(``block_costs.VirtualTimer``), and waiting for the next frame jumps it. ``WallClock`` paces bag time by
the monotonic clock (``vla-edge replay --realtime``). Tests of timing logic use the virtual clock, so
no assertion depends on how busy the machine is.
"""

from __future__ import annotations

import time

NS_PER_MS = 1_000_000


class VirtualClock:
    """Bag time in ns; only ever moves forward."""

    def __init__(self, start_ns: int) -> None:
        self.now = start_ns

    def __call__(self) -> int:
        return self.now

    def wait_until(self, t_ns: int) -> None:
        self.now = max(self.now, t_ns)


class WallClock:
    """Bag time paced by the wall clock (``--realtime``): bag start + elapsed monotonic time."""

    def __init__(self, start_ns: int) -> None:
        self._offset = start_ns - time.monotonic_ns()

    def __call__(self) -> int:
        return time.monotonic_ns() + self._offset

    def wait_until(self, t_ns: int) -> None:
        delay = t_ns - self()
        if delay > 0:
            time.sleep(delay / 1e9)
