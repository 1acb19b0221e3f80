"""How often things happened lately: counts of named events over a sliding time window, in constant memory.

The window is cut into ``slices`` equal slices of time kept in a ring; an event adds one to its slice,
and a slice older than the window is cleared before it is reused. Counts are therefore exact to one
slice (``window_s / slices``) at the window's far edge, and memory does not grow with the event rate:
a 1 kHz camera costs the same as a 1 Hz one. Time is whatever ``now_ns`` the caller passes (the
monotonic clock live, a virtual clock in tests and replay), so the numbers never depend on how busy
the machine is when they are checked.

A rate divides by the time the window has actually covered: right after start that is less than the
window, so a 30 Hz timer is not reported as slow in its first second.
"""

from __future__ import annotations

from collections import Counter

NS_PER_S = 1_000_000_000


class EventWindow:
    """Counts per event kind over the last ``window_s`` (at most one slice more)."""

    def __init__(self, window_s: float, slices: int = 20) -> None:
        if not window_s > 0 or slices < 1:
            raise ValueError(f"an event window needs window_s > 0 and slices >= 1, got {window_s}, {slices}")
        self.window_ns = round(window_s * NS_PER_S)
        self._slice_ns = max(1, self.window_ns // slices)
        self._counts: list[Counter] = [Counter() for _ in range(slices)]
        self._starts = [-1] * slices  # slice index (time // slice_ns) each ring entry counts, -1: never used
        self._first_ns: int | None = None

    def add(self, kind: str, now_ns: int, count: int = 1) -> None:
        index = now_ns // self._slice_ns
        entry = index % len(self._counts)
        if self._starts[entry] != index:
            self._counts[entry].clear()
            self._starts[entry] = index
        self._counts[entry][kind] += count
        if self._first_ns is None:
            self._first_ns = now_ns

    def counts(self, now_ns: int) -> Counter:
        """Events per kind in the slices that overlap the last ``window_s`` before ``now_ns``."""
        oldest = (now_ns - self.window_ns) // self._slice_ns
        total: Counter = Counter()
        for start, counts in zip(self._starts, self._counts):
            if oldest <= start <= now_ns // self._slice_ns:
                total.update(counts)
        return total

    def covered_s(self, now_ns: int) -> float:
        """How much of the window has passed since the first event (0 before any)."""
        if self._first_ns is None:
            return 0.0
        return min(self.window_ns, max(0, now_ns - self._first_ns)) / NS_PER_S

    def rate_hz(self, kind: str, now_ns: int) -> float:
        """Events of ``kind`` per second over the covered window (0 before a full slice has passed)."""
        covered = self.covered_s(now_ns)
        return self.counts(now_ns)[kind] / covered if covered * NS_PER_S >= self._slice_ns else 0.0
