"""What a memory policy holds after each cycle, with frames named by their index in the bag.

Which frames are kept, stored and evicted comes from ``runtime/kept_frames.py`` (the one way to ask a policy,
which the live debug image asks too); this adds what the replay's files print beside them: the memory's size
and counters, and the policy's own figures:

- aura: the surprise that decided whether this frame was written into the fast weights;
- dms: the slots held and the heads' compression.

The record is what the decisions file and the predictions CSV print, so two runs whose files are identical
kept and evicted the same frames.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...memory.aura import AuraPolicy
from ...memory.base import MemoryPolicy
from ...memory.dms import DmsPolicy
from ...runtime.kept_frames import KeptFrames


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
    """Follows one attached policy cycle by cycle (``after_cycle``), from its first frame."""

    def __init__(self, policy: MemoryPolicy) -> None:
        self._frames = KeptFrames(policy)
        self.policy = policy
        self.write_unit = "tokens" if isinstance(policy, DmsPolicy) else "frames"
        self.figure_names: tuple[str, ...] = (
            ("surprise",) if isinstance(policy, AuraPolicy)
            else ("slots_held", "heads_ratio") if isinstance(policy, DmsPolicy) else ())

    def after_cycle(self, bag_index: int) -> MemoryRecord:
        """The memory after the cycle that took bag frame ``bag_index``."""
        update = self._frames.after_cycle(bag_index)
        stats = self.policy.stats()
        return MemoryRecord(stats.kv_tokens, stats.memory_bytes, stats.writes, stats.evictions, update.stored,
                            update.kept, update.evicted, self._figures(update.stored))

    def _figures(self, stored: bool) -> tuple[float, ...]:
        policy = self.policy
        if isinstance(policy, AuraPolicy):
            return (policy.last_surprise if stored else math.nan,)  # it decided this frame's write only if stored
        if isinstance(policy, DmsPolicy):
            compression = policy.compression()
            return float(compression.slots_held), compression.ratio
        return ()
