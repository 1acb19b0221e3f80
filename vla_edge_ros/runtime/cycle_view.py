"""The newest cycle as the debug image shows it, handed from the reasoning thread by one reference.

The reasoning thread must not spend its deadline on pictures, so it does no image work at all: around each
cycle it asks the memory policy which frames it keeps (``kept_frames.py``: ids and counters, a few
microseconds) and publishes an immutable ``CycleView`` by a single reference store, as ``action_slot.py``
publishes an action; the ROS layer (or replay) reads the newest one whenever it draws, and never waits. The
pixels are the ROS layer's own small copies, made as frames arrive (``debug_image.FrameCopies``), so the
view names frames by id only.

``DebugFeed`` does nothing while ``enabled`` is false (the default: the node's ``debug_image.enabled``), and
starts following the policy afresh whenever it is switched on, the policy is replaced, or the policy was
reset for a new episode (``KeptFrames``). The live node and the offline ``Driver`` call it the same way::

    feed.before_cycle(policy)                  # reasoning thread, before the cycle
    result = reasoner.cycle(frame)
    feed.after_cycle(frame, result)            # after the action went to its slot
    view = feed.latest()                       # any thread, any time
"""

from __future__ import annotations

from dataclasses import dataclass

from ..memory.aura import AuraPolicy
from ..memory.base import MemoryPolicy
from .frame_buffer import Frame
from .kept_frames import KeptFrames
from .reasoner import CycleResult


@dataclass(frozen=True)
class CycleView:
    """One cycle: the frame it acted on (by id), what became of it, and the frames the memory shows."""

    frame_id: int  # the frame buffer's sequence number of the frame
    stamp_ns: int  # the frame's header stamp
    receive_ns: int  # when the camera callback got the frame (the gate's clock)
    result: CycleResult
    policy: str  # the memory policy's name
    strip: tuple[int, ...]  # ids, oldest first: the frames kept; aura: the latest frames written to its fast weights
    strip_kind: str  # "kept" or "written"


class DebugFeed:
    """The reasoning thread's side of the debug image: the newest ``CycleView``, by reference."""

    def __init__(self) -> None:
        self.enabled = False  # set by the ROS layer (or replay); read by the reasoning thread
        self.errors = 0  # cycles whose memory could not be followed (reported by the node; the cycle is unharmed)
        self._frames: KeptFrames | None = None
        self._latest: CycleView | None = None

    def before_cycle(self, policy: MemoryPolicy) -> None:
        """Reasoning thread, before a cycle: follow ``policy`` from here if it is new, or was reset since."""
        frames = self._frames
        if not self.enabled:
            self._frames = None  # switched on again, it follows afresh: it has missed cycles
        elif frames is None or frames.policy is not policy or policy.frames_seen < frames.seen:
            self._frames = KeptFrames(policy)

    def after_cycle(self, frame: Frame, result: CycleResult) -> None:
        """Reasoning thread, after a cycle: publish its view (ids and references only)."""
        frames = self._frames
        if frames is None:
            return
        try:
            update = frames.after_cycle(frame.seq)
        except Exception:  # the debug image must never cost the robot a cycle: count it, follow afresh
            self.errors += 1
            self._frames = None
            return
        aura = isinstance(frames.policy, AuraPolicy)
        self._latest = CycleView(frame.seq, frame.stamp_ns, frame.receive_ns, result, frames.policy.name,
                                 update.recent_writes if aura else update.kept, "written" if aura else "kept")

    def latest(self) -> CycleView | None:
        """The newest view (any thread); None while off (a cycle that began before it was switched off may still
        leave one), before the first cycle followed, and after ``clear``."""
        return self._latest if self.enabled else None

    def clear(self) -> None:
        """Forget the newest view (the debug image was switched off)."""
        self._latest = None
