"""Latest-observation handoff from the camera thread to the reasoning thread, without a queue.

The camera callback must never wait for reasoning, and reasoning must never chew through a
backlog: it takes the newest complete observation and the ones it missed are counted as dropped.

An observation is what one reasoning cycle acts on: the primary camera's frame, the frame of each
extra camera (``extra_cameras``, all at the buffer's size), and the robot's state (``state_dim``
float32 values; none when 0), with the primary frame's stamp and the observation's receive time. A
buffer "frame" is one whole observation; with one camera and no state it is just the camera's frame.
Putting an observation together (syncing the cameras, pairing the state) is the writer's business
(``observation.py``); this buffer only hands complete ones over.

Three preallocated slots change hands; a slot holds a whole observation (every camera's pixels, the
state and the metadata) and is always owned by exactly one party:

    writer's back slot -> ``_ready`` (at most one published slot) -> reader's front slot -> ``_free``

``write`` checks every part, then copies all of them into the back slot, takes back a published slot
the reader never took (that observation is dropped, and its slot becomes the next back slot),
publishes the back slot, and otherwise takes its next back slot from ``_free``. ``read_latest`` first
returns the slot it held to ``_free``, then takes the published slot. The writer therefore only ever
writes into a slot nobody else can reach, and the reader only ever sees a slot whose copies have all
finished: no torn observation (no camera's pixels, and no state, from another observation than the
rest), and the held observation cannot change under the reader. A part that does not fit (a shape, a
camera too few or many, a state missing, misshapen or not finite) raises ValueError before anything
changes: the slot is never published half-written, and a missing state is never filled in. Why ``_free`` is never empty
when the writer needs it: the reader holds at most one slot and ``_ready`` at most one (the
writer's own, just published), which leaves the third in ``_free``. That count needs the
reader to release before it takes; so an observation is valid until the *next* ``read_latest``
call, even one that returns None. A read that lands between the writer's take-back and its publish
returns None; the newer observation is there for the next read.

The only shared operations are ``list.append`` and ``list.pop()`` on ``_ready`` and ``_free``.
CPython's thread-safety page (Doc/library/threadsafety.rst, "Thread safety for list objects")
documents both as atomic in the free-threaded build: they run under the list's per-object lock,
as they have since 3.13t (whose own free-threading HOWTO still called that the current
implementation rather than a promise). Under the GIL each is a single C call that runs no
Python code, so no other thread runs in the middle of it.

Memory ordering, ARM included: the writer's pixel, state and metadata stores precede its ``append``
and the reader's loads follow its ``pop``; the edge between them is a lock release then acquire,
of the list's mutex (free-threaded) or of the GIL (default build; numpy may drop the GIL during
the copy, but the writer holds it again for ``append`` and must release it before the reader can
run its ``pop``). The way back, reader loads before ``_free.append`` before the writer's
``_free.pop`` before its next copy, rides the same edges, so the writer cannot overwrite pixels or
a state the reader is still loading.

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
    """A published observation as the reader sees it; valid until the reader's next ``read_latest``."""

    image: np.ndarray  # the primary camera's: a read-only HxWx3 uint8 view into the slot the reader owns
    stamp_ns: int  # header stamp of the primary camera's message
    receive_ns: int  # time.monotonic_ns() when the observation's first frame reached the camera callback
    seq: int  # per-buffer write sequence number, 0 for the first observation
    extra_images: tuple[np.ndarray, ...] = ()  # the extra cameras', in their configured order (read-only views)
    state: np.ndarray | None = None  # the robot's state (read-only float32 view); None when the buffer has none


@dataclass(frozen=True, slots=True)
class FrameBufferStats:
    """Counter snapshot for diagnostics. While both threads run, fields may be one frame apart;
    once quiet, ``written == read + dropped + pending`` exactly."""

    written: int
    read: int
    dropped: int  # published, then replaced by a newer observation before the reader took it
    pending: int  # 1 if a published frame is waiting for the reader, else 0


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


class _Slot:
    """Preallocated pixels (one array per camera), state and metadata; touched only by the slot's owner."""

    __slots__ = ("pixels", "views", "state", "state_view", "stamp_ns", "receive_ns", "seq")

    def __init__(self, shape: tuple[int, int, int], cameras: int, state_dim: int) -> None:
        self.pixels = tuple(np.zeros(shape, dtype=np.uint8) for _ in range(cameras))
        self.views = tuple(_read_only(pixels) for pixels in self.pixels)
        self.state = np.zeros(state_dim, dtype=np.float32)
        self.state_view = _read_only(self.state) if state_dim else None
        self.stamp_ns = 0
        self.receive_ns = 0
        self.seq = -1


class FrameBuffer:
    """Triple buffer of observations (HxWx3 uint8 frames of 1 + ``extra_cameras`` cameras, and a ``state_dim``
    state): one writer thread, one reader thread, no waiting."""

    def __init__(self, height: int, width: int, extra_cameras: int = 0, state_dim: int = 0) -> None:
        if height <= 0 or width <= 0:
            raise ValueError(f"frame size must be positive, got {height}x{width}")
        if extra_cameras < 0 or state_dim < 0:
            raise ValueError(f"extra cameras and state values cannot be negative, got {extra_cameras}, {state_dim}")
        self.shape = (height, width, 3)
        self.extra_cameras = extra_cameras
        self.state_dim = state_dim
        self._slots = tuple(_Slot(self.shape, 1 + extra_cameras, state_dim) for _ in range(3))
        self._back = 0  # writer-owned
        self._front: int | None = None  # reader-owned
        self._ready: list[int] = []  # shared: the published slot, if any
        self._free: list[int] = [1, 2]  # shared: slots nobody owns
        self._written = 0  # writer-only counters
        self._dropped = 0
        self._read = 0  # reader-only counter

    def write(self, image: np.ndarray, stamp_ns: int, receive_ns: int | None = None,
              extra_images: tuple[np.ndarray, ...] = (), state: np.ndarray | None = None) -> int:
        """Copy an observation in and publish it (camera thread); returns its sequence number.

        ``image`` is the primary camera's frame, ``extra_images`` the extra cameras' in order, ``state`` the
        robot's state. Any part that does not fit raises ValueError before anything changes.
        """
        images = (image, *extra_images)
        if len(extra_images) != self.extra_cameras:
            raise ValueError(f"an observation has {self.extra_cameras} extra camera frames, got {len(extra_images)}")
        for frame in images:
            if frame.shape != self.shape or frame.dtype != np.uint8:
                raise ValueError(f"frame must be {self.shape} uint8, got {frame.shape} {frame.dtype}")
        if self.state_dim:
            values = np.asarray(state, dtype=np.float32) if state is not None else None
            if values is None or values.shape != (self.state_dim,) or not np.isfinite(values).all():
                raise ValueError(f"an observation's state must be {self.state_dim} finite values, got {state!r:.80}")
        elif state is not None:
            raise ValueError("this buffer holds no state, and one was given")
        slot = self._slots[self._back]
        for pixels, frame in zip(slot.pixels, images):
            np.copyto(pixels, frame)
        if self.state_dim:
            np.copyto(slot.state, values)
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
        """The newest observation not yet read, or None (reasoning thread).

        Releases the observation returned by the previous call, whatever this call returns.
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
        return Frame(slot.views[0], slot.stamp_ns, slot.receive_ns, slot.seq, slot.views[1:], slot.state_view)

    def stats(self) -> FrameBufferStats:
        """Counters, readable from any thread."""
        return FrameBufferStats(self._written, self._read, self._dropped, len(self._ready))
