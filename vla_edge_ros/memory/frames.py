"""Frames kept as KV in arrival order: the bookkeeping fifo and cosine share."""

from __future__ import annotations

import numpy as np

from .base import FrameTokens, MemoryPolicy, _array


class FrameWindowPolicy(MemoryPolicy):
    """Keeps whole frames in the cache; subclasses choose which frame goes when room is needed."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[np.ndarray] = []  # slots of each kept frame, oldest first

    def reset(self) -> None:
        super().reset()
        self.frames.clear()

    def capacity_frames(self) -> int:
        """Frames the arena holds beside the pinned prompt and the action scratch."""
        return self._context().site().frames()

    def make_room(self, tokens: int) -> int:
        arena = self._context().arena
        evicted = 0
        while arena.capacity - arena.used < tokens:
            if not self.frames:
                raise RuntimeError(f"{self.name}: {tokens} tokens do not fit even in an empty memory")
            index = self.choose_victim()
            arena.release(self.frames.pop(index))
            self.forget(index)
            evicted += 1
        self.evictions += evicted
        return evicted

    def choose_victim(self) -> int:
        """Index (into ``frames``, oldest first) of the frame to evict."""
        raise NotImplementedError

    def forget(self, index: int) -> None:
        """Drop per-frame state of the evicted frame at ``index`` (after it left ``frames``)."""

    def add_frame(self, frame: FrameTokens) -> None:
        self.frames.append(frame.slots)
        self.frames_seen += 1
        self.writes += 1

    def frames_kept(self) -> int:
        return len(self.frames)

    def snapshot(self) -> dict[str, np.ndarray]:
        state = super().snapshot()
        state["frame_slots"] = (np.stack(self.frames) if self.frames
                                else np.empty((0, self._frame_tokens()), dtype=np.int32)).astype(np.int32)
        return state

    def restore(self, state: dict[str, np.ndarray]) -> None:
        super().restore(state)
        slots = _array(state, "frame_slots", np.int32, (None, self._frame_tokens()))
        self.frames = [row.copy() for row in slots]

    def _frame_tokens(self) -> int:
        """Tokens of one kept frame: an observation's."""
        return self._context().config.observation_tokens
