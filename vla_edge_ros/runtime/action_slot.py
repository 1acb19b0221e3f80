"""The newest action, handed from the reasoning thread to the action publisher's timer.

Only ever read whole: the reasoning thread publishes a new immutable ``TimedAction`` by a single
reference store (atomic in CPython with or without the GIL), the publisher reads one reference. The
publisher never waits for reasoning; staleness is judged by the reader against its own clock.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TimedAction:
    """An action in robot units and when it became ready (monotonic ns), plus the frame it answers."""

    values: np.ndarray
    ready_ns: int
    frame_stamp_ns: int


class ActionSlot:
    def __init__(self) -> None:
        self._latest: TimedAction | None = None

    def put(self, values: np.ndarray, ready_ns: int, frame_stamp_ns: int) -> None:
        frozen = np.array(values, dtype=np.float32)
        frozen.flags.writeable = False
        self._latest = TimedAction(frozen, ready_ns, frame_stamp_ns)

    def latest(self) -> TimedAction | None:
        return self._latest

    def clear(self) -> None:
        """Withdraw the newest action (reasoning stopped): the publisher commands a stop, not the answer to an
        old frame, which would stay fresh for up to ``action_timeout_ms``."""
        self._latest = None
