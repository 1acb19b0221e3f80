"""What a memory policy holds after each cycle, with frames named by their index in the bag.

Policies keep slots, not frames, and reuse a slot once its frame is gone, so this view remembers which
bag frame each stored frame was: a policy's ``frames_seen`` grows by one exactly when a cycle stores its
frame (the gate admitted the encode), and that frame is the policy's frame number ``frames_seen - 1``.
What "kept" means follows each policy:

- fifo, cosine (``FrameWindowPolicy.frames``, slots of each kept frame, oldest first): a frame is known
  by its first slot, noted when it is stored;
- aura: the KV cache holds the current frame only (``policy.current``); the past lives in the fast
  weights, so its figure is the surprise that decided whether this frame was written;
- dms: a frame is kept while any (layer, KV head) still reads one of its tokens
  (``DmsPolicy.slots_of_frame``); its figures are the slots held and the heads' compression.

A frame is evicted in the cycle in which its last token left. The record is what the decisions file
and the predictions CSV print, so two runs whose files are identical kept and evicted the same frames.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...memory.aura import AuraPolicy
from ...memory.base import MemoryPolicy
from ...memory.dms import DmsPolicy
from ...memory.frames import FrameWindowPolicy


@dataclass(frozen=True)
class MemoryRecord:
    """The policy's memory right after one cycle."""

    kv_tokens: int  # cache slots in use, pinned prompt included
    memory_bytes: int  # KV of those tokens + the policy's own state
    writes: int  # since the start (frames stored; aura: fast-weight writes; dms: tokens), see ``MemoryView.write_unit``
    evictions: int  # since the start, in the same unit
    stored: bool  # this cycle's frame entered the memory
    kept: tuple[int, ...]  # bag frame indices the cache holds tokens of, ascending
    evicted: tuple[int, ...]  # bag frame indices whose last token left in this cycle
    figures: tuple[float, ...]  # the policy's own figures, named by ``MemoryView.figure_names``


class MemoryView:
    """Follows one attached policy cycle by cycle (``after_cycle``)."""

    def __init__(self, policy: MemoryPolicy) -> None:
        if not isinstance(policy, (FrameWindowPolicy, AuraPolicy, DmsPolicy)):
            raise TypeError(f"replay cannot tell which frames the {policy.name} policy keeps")
        self.policy = policy
        self.write_unit = "tokens" if isinstance(policy, DmsPolicy) else "frames"
        self.figure_names: tuple[str, ...] = (
            ("surprise",) if isinstance(policy, AuraPolicy)
            else ("slots_held", "heads_ratio") if isinstance(policy, DmsPolicy) else ())
        self._bag_index: dict[int, int] = {}  # the policy's frame number -> bag frame index
        self._by_first_slot: dict[int, int] = {}  # fifo, cosine: first slot of a stored frame -> its frame number
        self._kept: tuple[int, ...] = ()  # frame numbers kept after the last cycle
        self._seen = policy.stats().frames_seen

    def after_cycle(self, bag_index: int) -> MemoryRecord:
        """The memory after the cycle that took bag frame ``bag_index``."""
        stats = self.policy.stats()
        stored = stats.frames_seen > self._seen
        self._seen = stats.frames_seen
        if stored:
            number = stats.frames_seen - 1
            self._bag_index[number] = bag_index
            if isinstance(self.policy, FrameWindowPolicy):
                self._by_first_slot[int(self.policy.frames[-1][0])] = number
        kept = self._kept_numbers(stored)
        evicted = sorted(set(self._kept) - set(kept))
        self._kept = kept
        return MemoryRecord(stats.kv_tokens, stats.memory_bytes, stats.writes, stats.evictions, stored,
                            tuple(sorted(self._bag_index[n] for n in kept)),
                            tuple(self._bag_index.pop(n) for n in evicted), self._figures(stored))

    def _kept_numbers(self, stored: bool) -> tuple[int, ...]:
        policy = self.policy
        if isinstance(policy, FrameWindowPolicy):
            return tuple(self._by_first_slot[int(slots[0])] for slots in policy.frames)
        if isinstance(policy, AuraPolicy):
            return (self._seen - 1,) if policy.current.size else ()
        candidates = set(self._kept) | ({self._seen - 1} if stored else set())
        return tuple(n for n in sorted(candidates) if policy.slots_of_frame(n).size)

    def _figures(self, stored: bool) -> tuple[float, ...]:
        policy = self.policy
        if isinstance(policy, AuraPolicy):
            return (policy.last_surprise if stored else math.nan,)  # it decided this frame's write only if stored
        if isinstance(policy, DmsPolicy):
            compression = policy.compression()
            return float(compression.slots_held), compression.ratio
        return ()
