"""The runtime without ROS, on one clock: what offline replay and closed-loop evaluation both drive.

The pieces are the live pipeline's own. The camera's frames go into the latest-frame buffer
(``camera``); the reasoner takes the newest one through the admission gate (``reason``); the action
publisher's rule decides what the robot is told at a tick (``command``). Live, the camera node, the
reasoning thread and the publisher timer call the same objects; here the caller calls them, in the
order its clock says:

    driver = Driver(engine, settings, clock, costs)   # clock: VirtualClock (or WallClock for --realtime)
    driver.camera(image, stamp_ns, arrival_ns)          # a frame arrives (it overwrites an unread one)
    if driver.clock() <= t:                             # the reasoner is free at time t:
        clock.wait_until(t)
        cycle = driver.reason()                         # newest frame -> gate -> engine; the blocks' costs
                                                        # move the clock; None when no frame waits
    command = driver.command(t)                         # what the publisher sends at tick t

``driver.feed`` is the debug image's hand-off (``cycle_view.DebugFeed``), off until ``feed.enabled`` is set:
``reason`` calls it around each cycle exactly as the live reasoning thread does.

An action becomes the robot's at the moment it is ready (``CycleResult.ready_ns``), not when
``reason`` returns: a tick before that still commands the previous action, or a safe stop once
that one is older than ``action_timeout_ms``, exactly as the action slot and the publisher's
timer behave live. Only the newest action not yet ready and the newest ready one are kept: a
cycle starts only once the previous one's action is ready, so nothing older can matter again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import OutputKnobs, Settings
from ..engine import VlaEngine
from .action_output import ActionOutput, Command
from .action_slot import TimedAction
from .admission import AdmissionGate
from .block_costs import CostModel, VirtualTimer
from .clock import VirtualClock, WallClock
from .cycle_view import DebugFeed
from .frame_buffer import Frame, FrameBuffer
from .reasoner import CycleResult, Reasoner, block_kinds


@dataclass(frozen=True)
class Cycle:
    """One frame the reasoner took, and what became of it."""

    frame: Frame
    result: CycleResult


class Driver:
    """Frame buffer, admission gate, reasoner and action output of one engine, on ``clock``."""

    def __init__(self, engine: VlaEngine, settings: Settings, clock: VirtualClock | WallClock,
                 costs: CostModel | None, frame_size: tuple[int, int]) -> None:
        """``costs`` None: blocks take the wall time they take (a ``WallClock``); else they move ``clock``."""
        self.engine = engine
        self.clock = clock
        self.frame_size = frame_size
        self.gate = AdmissionGate.from_settings(settings["reasoning"], clock=clock)
        self.reasoner = Reasoner(engine, self.gate, None if costs is None else VirtualTimer(clock, costs))
        if costs is not None:
            costs.require(block_kinds(engine.config))
        self.knobs = OutputKnobs.of(settings["action_publisher"])
        self.output = ActionOutput(self.knobs)
        self.buffer = FrameBuffer(*frame_size)
        self.feed = DebugFeed()
        self._pending: TimedAction | None = None  # the newest action, until its ready time
        self._ready: TimedAction | None = None  # the newest action that is ready

    def new_episode(self) -> None:
        """Frames and actions of the last episode are gone (the gate keeps what it learned of costs)."""
        self.buffer = FrameBuffer(*self.frame_size)
        self._pending = self._ready = None

    def camera(self, image: np.ndarray, stamp_ns: int, arrival_ns: int) -> int:
        """A decoded frame arrives; returns its sequence number in the buffer."""
        return self.buffer.write(image, stamp_ns, arrival_ns)

    def reason(self) -> Cycle | None:
        """One reasoning cycle on the newest frame, now; None when no unread frame waits."""
        frame = self.buffer.read_latest()
        if frame is None:
            return None
        self.feed.before_cycle(self.engine.policy)
        result = self.reasoner.cycle(frame.image, frame.receive_ns)
        if result.action is not None:
            if self._pending is not None:
                self._ready = self._pending  # it was ready before this cycle could start
            self._pending = TimedAction(result.action, result.ready_ns, frame.stamp_ns)
        self.feed.after_cycle(frame, result)
        return Cycle(frame, result)

    def command(self, now_ns: int) -> Command:
        """What the action publisher sends at ``now_ns``: the newest ready action, clipped and mapped, while
        it is fresh; a safe stop otherwise."""
        if self._pending is not None and self._pending.ready_ns <= now_ns:
            self._ready, self._pending = self._pending, None
        return self.output.decide(self._ready, now_ns, self.knobs)
