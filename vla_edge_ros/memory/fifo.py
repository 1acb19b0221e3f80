"""``fifo``: a sliding window of frames; the oldest frame goes. The baseline everyone has.

Capacity in frames is what the arena holds beside the pinned prompt and the action scratch:
``(kv_capacity_tokens - prompt - dof) // observation_tokens``. Positions: prompt 0..P-1, then the
frames in arrival order, re-numbered after each eviction.
"""

from __future__ import annotations

from .frames import FrameWindowPolicy


class FifoPolicy(FrameWindowPolicy):
    name = "fifo"

    def choose_victim(self) -> int:
        return 0
