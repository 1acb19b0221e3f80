"""Latest-frame handoff from the camera thread to the reasoning thread, without a queue.

The camera callback must never wait for reasoning, and reasoning must never chew through a
backlog: it takes the newest complete frame and the ones it missed are counted as dropped.

Three preallocated slots change hands; a slot is always owned by exactly one party:

    writer's back slot -> ``_ready`` (at most one published slot) -> reader's front slot -> ``_free``

``write`` copies pixels into the back slot, takes back a published slot the reader never took
(that frame is dropped, and its slot becomes the next back slot), publishes the back slot, and
otherwise takes its next back slot from ``_free``. ``read_latest`` first returns the slot it
held to ``_free``, then takes the published slot. The writer therefore only ever writes into a
slot nobody else can reach, and the reader only ever sees a slot whose copy has finished: no
torn frame, and the held frame cannot change under the reader. Why ``_free`` is never empty
when the writer needs it: the reader holds at most one slot and ``_ready`` at most one (the
writer's own, just published), which leaves the third in ``_free``. That count needs the
reader to release before it takes; so a frame is valid until the *next* ``read_latest`` call,
even one that returns None. A read that lands between the writer's take-back and its publish
returns None; the newer frame is there for the next read.

The only shared operations are ``list.append`` and ``list.pop()`` on ``_ready`` and ``_free``.
CPython's thread-safety page (Doc/library/threadsafety.rst, "Thread safety for list objects")
documents both as atomic in the free-threaded build: they run under the list's per-object lock,
as they have since 3.13t (whose own free-threading HOWTO still called that the current
implementation rather than a promise). Under the GIL each is a single C call that runs no
Python code, so no other thread runs in the middle of it.

Memory ordering, ARM included: the writer's pixel and metadata stores precede its ``append``
and the reader's loads follow its ``pop``; the edge between them is a lock release then acquire,
of the list's mutex (free-threaded) or of the GIL (default build; numpy may drop the GIL during
the copy, but the writer holds it again for ``append`` and must release it before the reader can
run its ``pop``). The way back, reader loads before ``_free.append`` before the writer's
``_free.pop`` before its next copy, rides the same edges, so the writer cannot overwrite pixels
the reader is still loading.

What this is not: lock-free in the strict sense. In the free-threaded build, ``append``/``pop``
may wait on the other thread's hold of the same list's lock, which lasts a few machine
instructions; with the GIL, every Python thread waits for the GIL anyway. Neither side ever
waits on the other side's pixel copy or processing. One writer thread and one reader thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Frame:
    """A published frame as the reader sees it; valid until the reader's next ``read_latest``."""

    image: np.ndarray  # read-only HxWx3 uint8 view into the slot the reader owns
    stamp_ns: int  # header stamp of the source message
    receive_ns: int  # time.monotonic_ns() when the camera callback got it
    seq: int  # per-buffer write sequence number, 0 for the first frame


@dataclass(frozen=True, slots=True)
class FrameBufferStats:
    """Counter snapshot for diagnostics. While both threads run, fields may be one frame apart;
    once quiet, ``written == read + dropped + pending`` exactly."""

    written: int
    read: int
    dropped: int  # published, then replaced by a newer frame before the reader took it
    pending: int  # 1 if a published frame is waiting for the reader, else 0


class _Slot:
    """Preallocated pixels and metadata; touched only by the party that owns the slot."""

    __slots__ = ("pixels", "view", "stamp_ns", "receive_ns", "seq")

    def __init__(self, shape: tuple[int, int, int]) -> None:
        self.pixels = np.zeros(shape, dtype=np.uint8)
        self.view = self.pixels.view()
        self.view.flags.writeable = False
        self.stamp_ns = 0
        self.receive_ns = 0
        self.seq = -1


class FrameBuffer:
    """Triple buffer of HxWx3 uint8 frames: one writer thread, one reader thread, no waiting."""

    def __init__(self, height: int, width: int) -> None:
        if height <= 0 or width <= 0:
            raise ValueError(f"frame size must be positive, got {height}x{width}")
        self.shape = (height, width, 3)
        self._slots = tuple(_Slot(self.shape) for _ in range(3))
        self._back = 0  # writer-owned
        self._front: int | None = None  # reader-owned
        self._ready: list[int] = []  # shared: the published slot, if any
        self._free: list[int] = [1, 2]  # shared: slots nobody owns
        self._written = 0  # writer-only counters
        self._dropped = 0
        self._read = 0  # reader-only counter

    def write(self, image: np.ndarray, stamp_ns: int, receive_ns: int | None = None) -> int:
        """Copy ``image`` in and publish it (camera thread); returns its sequence number.

        A wrong shape or dtype raises ValueError before anything changes.
        """
        if image.shape != self.shape or image.dtype != np.uint8:
            raise ValueError(f"frame must be {self.shape} uint8, got {image.shape} {image.dtype}")
        slot = self._slots[self._back]
        np.copyto(slot.pixels, image)
        seq = self._written
        slot.stamp_ns = int(stamp_ns)
        slot.receive_ns = time.monotonic_ns() if receive_ns is None else int(receive_ns)
        slot.seq = seq
        self._written = seq + 1
        try:
            stale: int | None = self._ready.pop()  # the reader never took it
        except IndexError:
            stale = None
        self._ready.append(self._back)
        if stale is None:
            self._back = self._free.pop()
        else:
            self._back = stale
            self._dropped += 1
        return seq

    def read_latest(self) -> Frame | None:
        """The newest frame not yet read, or None (reasoning thread).

        Releases the frame returned by the previous call, whatever this call returns.
        """
        if self._front is not None:
            self._free.append(self._front)
            self._front = None
        try:
            index = self._ready.pop()
        except IndexError:
            return None
        self._front = index
        self._read += 1
        slot = self._slots[index]
        return Frame(slot.view, slot.stamp_ns, slot.receive_ns, slot.seq)

    def stats(self) -> FrameBufferStats:
        """Counters, readable from any thread."""
        return FrameBufferStats(self._written, self._read, self._dropped, len(self._ready))
