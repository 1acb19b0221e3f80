"""Which frames a memory policy holds, named by the caller's own frame ids.

The one way to ask a policy "which frames do you keep": replay names them by their index in the bag
(``tools/replay/memory_view.py``), the live debug image by the frame buffer's sequence numbers
(``cycle_view.py``). Policies keep slots, not frames, and reuse a slot once its frame is gone, so this
follows one policy cycle by cycle and remembers which frame each stored frame was: a policy's
``frames_seen`` grows by one exactly when a cycle stores its frame (the gate admitted the encode), and that
frame is the policy's frame number ``frames_seen - 1``. What "kept" means follows each policy:

- fifo, cosine (``FrameWindowPolicy.frames``, slots of each kept frame, oldest first): a frame is known
  by its first slot, noted when it is stored;
- aura: the KV cache holds the current frame only (``policy.current``); the past lives in the fast
  weights, which is why ``recent_writes`` lists the frames whose cycle wrote into them;
- dms: a frame is kept while any (layer, KV head) still reads one of its tokens (``DmsPolicy.frames_held``).

A frame is evicted in the cycle in which its last token left. Frames the policy stored before it was
followed have no id and are left out (a debug image switched on mid-episode, an episode memory restored
from the KV store); a policy that was reset since (a new episode) needs a new ``KeptFrames``, which
``policy.frames_seen`` falling below ``seen`` tells. Every call runs on the thread that runs the cycles,
between them: a policy is never read while it changes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..memory.aura import AuraPolicy
from ..memory.base import MemoryPolicy
from ..memory.dms import DmsPolicy
from ..memory.frames import FrameWindowPolicy

RECENT_WRITES = 32
"""How many of the latest frames that wrote into the memory ``KeptUpdate.recent_writes`` lists."""


@dataclass(frozen=True)
class KeptUpdate:
    """The memory right after one cycle, in the caller's frame ids."""

    stored: bool  # this cycle's frame entered the memory
    written: bool  # the policy's write count rose in this cycle (aura: a fast-weight write)
    kept: tuple[int, ...]  # frames the cache holds tokens of, ascending
    evicted: tuple[int, ...]  # frames whose last token left in this cycle
    recent_writes: tuple[int, ...]  # the latest RECENT_WRITES frames whose cycle wrote, oldest first


class KeptFrames:
    """Follows one attached policy from now on; call ``after_cycle`` after every cycle."""

    def __init__(self, policy: MemoryPolicy, recent: int = RECENT_WRITES) -> None:
        if not isinstance(policy, (FrameWindowPolicy, AuraPolicy, DmsPolicy)):
            raise TypeError(f"cannot tell which frames the {policy.name} policy keeps")
        self.policy = policy
        self.seen = policy.frames_seen  # the policy's frames_seen after the last cycle followed
        self._writes = policy.writes
        self._ids: dict[int, int] = {}  # the policy's frame number -> the caller's id, while kept
        self._by_first_slot: dict[int, int] = {}  # fifo, cosine: first slot of a stored frame -> its frame number
        self._kept: tuple[int, ...] = ()  # frame numbers with an id, kept after the last cycle
        self._recent_writes: deque[int] = deque(maxlen=recent)

    def after_cycle(self, frame_id: int) -> KeptUpdate:
        """The memory after the cycle that took frame ``frame_id``."""
        policy = self.policy
        stored = policy.frames_seen > self.seen
        written = policy.writes > self._writes
        self.seen, self._writes = policy.frames_seen, policy.writes
        if stored:
            number = self.seen - 1
            self._ids[number] = frame_id
            if isinstance(policy, FrameWindowPolicy):
                self._by_first_slot[int(policy.frames[-1][0])] = number
        if written:
            self._recent_writes.append(frame_id)
        kept = self._kept_numbers()
        evicted = sorted(set(self._kept) - set(kept))
        self._kept = kept
        return KeptUpdate(stored, written, tuple(sorted(self._ids[n] for n in kept)),
                          tuple(self._ids.pop(n) for n in evicted), tuple(self._recent_writes))

    def _kept_numbers(self) -> tuple[int, ...]:
        """The kept frames' numbers that have an id (frames stored before following began have none)."""
        policy = self.policy
        if isinstance(policy, FrameWindowPolicy):
            numbers = (self._by_first_slot.get(int(slots[0])) for slots in policy.frames)
            return tuple(n for n in numbers if n is not None and n in self._ids)
        if isinstance(policy, AuraPolicy):
            current = self.seen - 1
            return (current,) if policy.current.size and current in self._ids else ()
        return tuple(n for n in policy.frames_held().tolist() if n in self._ids)
