"""The runtime without ROS, on one clock: what offline replay and closed-loop evaluation both drive.

The pieces are the live pipeline's own. The cameras' frames and the robot's states go through the
observation assembler (``observation.py``: cameras synced, the state paired) into the latest-observation
buffer (``camera``, ``state``); the reasoner takes the newest observation through the admission gate
(``reason``); the action publisher's rule decides what the robot is told at a tick (``command``). Live,
the camera node, the reasoning thread and the publisher timer call the same objects; here the caller
calls them, in the order its clock says:

    driver = Driver(engine, settings, clock, costs)   # clock: VirtualClock (or WallClock for --realtime)
    driver.state(msg, stamp_ns, arrival_ns)             # a state message arrives (models that read one)
    driver.camera(image, stamp_ns, arrival_ns)          # a frame arrives; with its state (and the other cameras'
                                                        # frames) it overwrites an unread observation; both
                                                        # return the sets of frames they settled
    if driver.clock() <= t:                             # the reasoner is free at time t:
        clock.wait_until(t)
        cycle = driver.reason()                         # newest frame -> gate -> engine; the blocks' costs
                                                        # move the clock; None when no observation waits
    command = driver.command(t)                         # what the publisher sends at tick t

A chunked model whose chunks the timeline executes (``execution`` other than sync) is planned on the
horizon (``admission.py``): each cycle's deadline is where the next chunk should take over (the end of the
held chunk's execution horizon in rtc and ensemble, where the commands the timeline holds run out in chunk),
and the reasoner should not start before ``start_at_ns()``, when that moment comes within the predicted cycle. The
caller waits for it, as the live reasoning loop does before it takes a frame: ``reason_at(t, next_t)`` is the
step above with that wait (frames arriving at t, the next at next_t). ``reason`` itself runs when it is
called; a caller that reasons before ``start_at_ns`` computes chunks the robot did not need yet.

``driver.feed`` is the debug image's hand-off (``cycle_view.DebugFeed``), off until ``feed.enabled`` is set:
``reason`` calls it around each cycle exactly as the live reasoning thread does.

A chunk becomes the robot's at the moment it is ready (``CycleResult.ready_ns``), not when
``reason`` returns: a tick before that still commands what the action timeline held (the previous
chunk, or a safe stop once that is stale or has run out), exactly as the action slot and the
publisher's timer behave live: at each tick the timeline (``action_timeline.py``, under
``action_publisher.execution``) is handed the newest ready chunk, as the publisher reads the slot. Only
the newest chunk not yet ready and the newest ready one are kept: a cycle starts only once the previous
one's chunk is ready, so nothing older can matter again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import ObservationKnobs, OutputKnobs, Settings
from ..engine import VlaEngine
from .action_output import ActionOutput, Command
from .action_slot import TimedAction, frozen_chunk
from .action_timeline import ActionTimeline
from .admission import AdmissionGate, Horizon
from .block_costs import CostModel, VirtualTimer
from .clock import VirtualClock, WallClock
from .cycle_view import DebugFeed
from .frame_buffer import Frame
from .observation import ObservationAssembler, Settled, observation_buffer
from .reasoner import CycleResult, Reasoner, block_kinds
from .robot_state import StateInput, state_reader


@dataclass(frozen=True)
class Cycle:
    """One observation the reasoner took, and what became of it."""

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
        self.period_ns = round(1e9 / settings["action_publisher"]["control_rate_hz"])
        self.timeline = ActionTimeline(ActionOutput(self.knobs))
        self.observation = ObservationKnobs.of(settings["camera_subscriber"])
        self.new_episode()
        self.feed = DebugFeed()

    def new_episode(self) -> None:
        """Frames, states and actions of the last episode are gone (the gate keeps what it learned of costs)."""
        knobs = self.observation
        self.buffer = observation_buffer(*self.frame_size, knobs)
        self.assembler = ObservationAssembler(self.buffer, knobs.sync_slop_ms, knobs.state_max_age_ms)
        self.states = StateInput(state_reader(knobs.state_type, knobs.state_joint_names, knobs.state_joint_velocities),
                                 self._state_read)
        self._settled_by_state: list[Settled] = []
        self._pending: TimedAction | None = None  # the newest chunk, until its ready time
        self._ready: TimedAction | None = None  # the newest chunk that is ready
        self.timeline.reset()

    def camera(self, image: np.ndarray, stamp_ns: int, arrival_ns: int, camera: int = 0) -> list[Settled]:
        """A decoded frame of ``camera`` (0: the primary) arrives; the sets of frames it settled (none while it
        waits for the other cameras or its state), each written to the buffer or refused."""
        return self.assembler.frame(camera, image, stamp_ns, arrival_ns)

    def state(self, msg: object, stamp_ns: int, arrival_ns: int) -> list[Settled]:
        """A state message (JointState or Odometry, as ``camera_subscriber.state_type`` says) arrives: read, it is
        kept for pairing and may settle the set waiting for it (returned); refused, it is counted by reason."""
        self.states.receive(msg, stamp_ns, arrival_ns)
        settled, self._settled_by_state = self._settled_by_state, []
        return settled

    def _state_read(self, values: np.ndarray, stamp_ns: int) -> None:
        self._settled_by_state.extend(self.assembler.state(values, stamp_ns))

    def horizon(self) -> Horizon | None:
        """What the gate plans on: the timeline's horizon with the newest chunk handed over, ready or not yet
        commanded (None: the chunks are executed in sync, or H = 1: the fixed deadline)."""
        newest = self._pending if self._pending is not None else self._ready
        return self.timeline.horizon(newest, self.engine.config.action.chunk, self.knobs, self.period_ns)

    def start_at_ns(self) -> int:
        """When the reasoner should start its next cycle: the clock's now, or later while the commands held last
        beyond the predicted cycle (``AdmissionGate.start_at_ns``)."""
        return self.gate.start_at_ns(self.horizon())

    def reason_at(self, now_ns: int, next_ns: int) -> Cycle | None:
        """The reasoner's turn at ``now_ns``, when an observation arrived, the next one due at ``next_ns``: if it is
        free by then, it waits for ``start_at_ns`` and reasons on the newest observation, unless that wait lasts
        until the next one arrives (it is asked again then). None when busy, waiting, or no observation waits."""
        if self.clock() > now_ns:
            return None
        self.clock.wait_until(now_ns)
        start = self.start_at_ns()
        if start >= next_ns:
            return None
        self.clock.wait_until(start)
        return self.reason()

    def reason(self) -> Cycle | None:
        """One reasoning cycle on the newest observation, now; None when no unread one waits."""
        frame = self.buffer.read_latest()
        if frame is None:
            return None
        self.feed.before_cycle(self.engine.policy)
        result = self.reasoner.cycle(frame, self.horizon())
        if result.chunk is not None:
            if self._pending is not None:
                self._ready = self._pending  # it was ready before this cycle could start
            self._pending = TimedAction(frozen_chunk(result.chunk), result.ready_ns, frame.stamp_ns, frame.receive_ns)
        self.feed.after_cycle(frame, result)
        return Cycle(frame, result)

    def command(self, now_ns: int) -> Command:
        """What the action publisher sends at ``now_ns``: the action the timeline holds for it (sync: the newest
        ready action while it is fresh), clipped and mapped; a safe stop otherwise."""
        if self._pending is not None and self._pending.ready_ns <= now_ns:
            self._ready, self._pending = self._pending, None
        return self.timeline.command(self._ready, now_ns, self.knobs, self.period_ns)
