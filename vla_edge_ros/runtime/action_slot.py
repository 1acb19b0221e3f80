"""The newest chunk of actions, handed from the reasoning thread to the action publisher's timer.

Only ever read whole: the reasoning thread publishes a new immutable ``TimedAction`` by a single
reference store (atomic in CPython with or without the GIL), the publisher reads one reference. The
publisher never waits for reasoning; what each tick commands is decided by the reader against its own
clock (``action_timeline.py``), and a chunk it never saw because a newer one replaced it is simply gone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TimedAction:
    """A chunk of actions [H, dof] in robot units, when it became ready (monotonic ns), the stamp of the frame it
    answers, and its observation's time ``obs_ns`` (monotonic ns, the frame's receive time): action i is meant
    for ``obs_ns`` + i control periods."""

    chunk: np.ndarray
    ready_ns: int
    frame_stamp_ns: int
    obs_ns: int

    @property
    def values(self) -> np.ndarray:
        """The first action [dof]: the one for the observation's own time (all that ``sync`` executes)."""
        return self.chunk[0]


def frozen_chunk(values: np.ndarray) -> np.ndarray:
    """``values`` ([dof], one action, or [H, dof]) as a read-only float32 chunk [H, dof] of its own."""
    chunk = np.array(values, dtype=np.float32, ndmin=2)
    if chunk.ndim != 2:
        raise ValueError(f"an action chunk must be [dof] or [H, dof], got shape {list(np.shape(values))}")
    chunk.flags.writeable = False
    return chunk


class ActionSlot:
    def __init__(self) -> None:
        self._latest: TimedAction | None = None
        self.episode = 0  # bumped by ``new_episode``: the publisher drops what it holds when it changes

    def put(self, values: np.ndarray, ready_ns: int, frame_stamp_ns: int, obs_ns: int) -> None:
        """Publish a chunk ([H, dof], or one action [dof]) whose observation was received at ``obs_ns``."""
        self._latest = TimedAction(frozen_chunk(values), ready_ns, frame_stamp_ns, obs_ns)

    def latest(self) -> TimedAction | None:
        return self._latest

    def clear(self) -> None:
        """Withdraw the newest chunk (reasoning stopped): the publisher commands a stop, not the rest of an old
        frame's chunk, which could run on for up to a horizon (or ``action_timeout_ms`` in ``sync``)."""
        self._latest = None

    def new_episode(self) -> None:
        """A new episode started: every chunk handed over so far answers another episode's frames. The newest is
        withdrawn and ``episode`` bumped, so the publisher drops all it holds (even if it never ticked while the
        slot was empty) and blends nothing of them into the new episode's first chunk."""
        self._latest = None
        self.episode += 1
