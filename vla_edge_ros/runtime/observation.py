"""An observation put together where its parts arrive: every camera's frame synced in time, plus the state.

One reasoning cycle acts on one observation: a frame of the primary camera (``image_topic``), a frame of
each extra camera (``extra_image_topics``) whose header stamps lie within ``sync_slop_ms`` of each other,
and the robot's state when the model reads one. The camera node's callbacks (one thread) hand every
decoded frame and every read state to the ``ObservationAssembler``, which writes each complete observation
to the frame buffer (``frame_buffer.py``), the one hand-off to the reasoning thread; offline, the
``Driver`` does the same on its clock. Nothing here reads a clock: only header stamps and the receive
times it is given, so replay decides exactly as live.

Syncing, in the spirit of message_filters' ApproximateTimeSynchronizer (our code): each camera keeps its
last ``SYNC_DEPTH`` frames waiting. A set forms when its last member arrives, so each new frame looks for
partners: the latest window of ``sync_slop_ms`` that holds it and a waiting frame of every other camera
(the newest one of each camera in that window; of equal stamps, the one that arrived last). When one is
found the set is taken, and every waiting frame no newer than the set's member of its camera goes too: it
could only make an older observation than the one just made. Frames that leave without joining a set
(pushed out of a full queue, or passed by a newer set) are counted as ``unsynced``. A silent camera therefore means no observation at all, never one
with a camera missing, and a bounded queue behind the others. One camera alone needs no sync: each frame
is a set.

Pairing the state: a complete set takes the state whose header stamp is nearest the primary frame's, if it
lies within ``state_max_age_ms`` of it (before or after: a state stamped much later than the frames means the
two clocks disagree, or the camera is that late). Over DDS a frame often arrives just before the state
published with it, so a set may wait for the next state: it is *held* when that state is due nearer its stamp
than the newest one and before the next set (due: the newest state's stamp plus the state's period; each
stream's period is the difference of its last two stamps), and settles with the next state that arrives, or
with what has arrived when the next set completes. A set never waits longer than a frame period, nor for a
state topic that fell silent (the next state overdue by half its period), nor before both periods are
known. A set with no state within the age is refused as ``no_state`` (no state yet, stale, or ahead): its
frames are used up and no observation is written, so the reasoner gets nothing new, and the action publisher
keeps the last action while it is fresh and then sends the safe stop. A state is never filled in, and one
that failed to read (``robot_state.py``) never reaches the assembler. The last ``STATE_DEPTH`` good states
are kept for pairing. Pairing against stamps, not arrival times, is what makes a bag replay decide the same.

Every call that hands over a frame or a state returns the sets it settled, oldest first (``Settled``: written,
or refused and why): a frame may settle the held set and its own, a state the held one.

The observation's stamp is the primary frame's; its receive time is the earliest receive time of its
frames, so the admission gate's deadline runs from the moment its oldest part arrived.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..config import ObservationKnobs, Settings
from ..model.config import StateConfig
from .clock import NS_PER_MS
from .frame_buffer import FrameBuffer
from .robot_state import ODOMETRY_STATE, state_reader

SYNC_DEPTH = 4
"""Frames each camera keeps waiting for the others (about 130 ms of a 30 Hz camera)."""

STATE_DEPTH = 16
"""Good states kept for pairing (160 ms of a 100 Hz joint state, 530 ms of a 30 Hz odometry)."""

SIM_ODOMETRY_TOPIC = "odom"
"""Where the simulated robot publishes its nav_msgs/Odometry when ``state_topic`` names no other topic."""


def require_one_camera(settings: Settings, what: str) -> None:
    """ValueError when the configuration's observation has more than one camera or a robot state: ``what``
    (replay, evaluate) feeds one camera and no state, so each of its cycles would make no observation."""
    knobs = ObservationKnobs.of(settings["camera_subscriber"])
    if knobs.extra_image_topics or knobs.state_topic:
        raise ValueError(f"{settings.source}: camera_subscriber: {what} feeds one camera and no robot state, and "
                         f"this configuration's observation has {knobs.cameras} camera(s)"
                         f"{' and a state' if knobs.state_topic else ''} (extra_image_topics, state_topic): not "
                         "supported there yet")


def simulated_robot_observation(settings: Settings, state: StateConfig | None, what: str) -> Settings:
    """``settings`` with the observation the simulated robot (``worlds/sim``) gives ``what`` (evaluate, run --sim):
    its one camera and, when the checkpoint reads a state (``state``, its ``vla.state``), the robot's odometry
    (``state_type`` odometry, on ``state_topic`` or else ``SIM_ODOMETRY_TOPIC``), so that nothing is set by hand.
    ValueError for what it cannot give: more cameras, a state for a checkpoint that reads none, or a state of
    another size than odometry's."""
    if state is None:
        require_one_camera(settings, what)
        return settings
    knobs = ObservationKnobs.of(settings["camera_subscriber"])
    if knobs.extra_image_topics:
        raise ValueError(f"{settings.source}: camera_subscriber: {what} feeds one camera and the robot's odometry, "
                         f"and this configuration's observation has {knobs.cameras} cameras (extra_image_topics): "
                         "not supported there yet")
    if state.dim != len(ODOMETRY_STATE):
        raise ValueError(f"{settings['reasoning']['model_dir']} reads a robot state of {state.dim} values (vla.state), "
                         f"and the simulated robot's state is its odometry, {len(ODOMETRY_STATE)} values "
                         f"({', '.join(ODOMETRY_STATE)}): {what} cannot feed it")
    return settings.replace("camera_subscriber", {"state_topic": knobs.state_topic or SIM_ODOMETRY_TOPIC,
                                                  "state_type": "odometry"})


def observation_shape(knobs: ObservationKnobs) -> tuple[int, int]:
    """(extra cameras, state values) of the observations ``knobs`` configure (0 values: no state topic)."""
    state_dim = 0
    if knobs.state_topic:
        state_dim = state_reader(knobs.state_type, knobs.state_joint_names, knobs.state_joint_velocities).dim
    return len(knobs.extra_image_topics), state_dim


def observation_buffer(height: int, width: int, knobs: ObservationKnobs) -> FrameBuffer:
    """The frame buffer of the observations ``knobs`` configure."""
    return FrameBuffer(height, width, *observation_shape(knobs))


@dataclass(frozen=True)
class _Waiting:
    image: np.ndarray
    stamp_ns: int
    receive_ns: int


@dataclass(frozen=True)
class Written:
    """An observation that went to the buffer: its sequence number and its primary frame."""

    seq: int
    image: np.ndarray


@dataclass(frozen=True)
class Settled:
    """What became of a complete set of frames: written to the buffer, or (``written`` None) refused for want of
    a state, ``reason`` saying why. ``stamp_ns``: its primary frame's stamp."""

    stamp_ns: int
    written: Written | None
    reason: str = ""


class ObservationAssembler:
    """Syncs the cameras' frames, pairs the state, writes whole observations to ``buffer`` (one writer thread)."""

    def __init__(self, buffer: FrameBuffer, sync_slop_ms: float, state_max_age_ms: float,
                 names: Sequence[str] = ()) -> None:
        """``names``: what the reasons call each camera (the node: its topics); default camera 0, 1, ..."""
        self.buffer = buffer
        self.cameras = 1 + buffer.extra_cameras
        self.names = tuple(names) or tuple(f"camera {c}" for c in range(self.cameras))
        self.sync_slop_ns = round(sync_slop_ms * NS_PER_MS)
        self.state_max_age_ns = round(state_max_age_ms * NS_PER_MS)
        self._waiting: list[deque[_Waiting]] = [deque() for _ in range(self.cameras)]
        self._states: deque[tuple[np.ndarray, int]] = deque(maxlen=STATE_DEPTH)  # good states and their stamps
        self._held: list[_Waiting] | None = None  # a complete set waiting for the next state
        self._last_set_ns: int | None = None  # the primary stamp of the last complete set
        self._frame_period_ns: int | None = None  # between the last two complete sets' stamps
        self.observations = 0  # written to the buffer
        self.unsynced = [0] * self.cameras  # frames per camera that left without joining an observation
        self.no_state = 0  # complete sets refused for want of a fresh state
        self.last_refusal = ""  # why the latest set was refused, or the latest frames were left unsynced

    def state(self, values: np.ndarray, stamp_ns: int) -> list[Settled]:
        """A good state (read and checked by ``robot_state``) arrived; the held set, which it settles."""
        self._states.append((values, int(stamp_ns)))
        if self._held is None:
            return []
        held, self._held = self._held, None
        return [self._settle(held)]

    def frame(self, camera: int, image: np.ndarray, stamp_ns: int, receive_ns: int) -> list[Settled]:
        """A decoded frame of ``camera`` (0: the primary) arrived; the sets it settled, oldest first."""
        new = _Waiting(image, int(stamp_ns), int(receive_ns))
        if self.cameras == 1:
            members = [new]
        else:
            queue = self._waiting[camera]
            queue.append(new)
            if len(queue) > SYNC_DEPTH:
                queue.popleft()
                self._unsynced(camera, 1)
            found = self._match(camera, new)
            if found is None:
                return []
            members = found
            for index, member in enumerate(members):
                self._take(index, member)
        settled = []
        if self._held is not None:  # a newer set is complete: the held one takes what has arrived
            held, self._held = self._held, None
            settled.append(self._settle(held))
        stamp = members[0].stamp_ns
        if self._last_set_ns is not None and stamp > self._last_set_ns:
            self._frame_period_ns = stamp - self._last_set_ns
        self._last_set_ns = stamp
        if self.buffer.state_dim and self._next_state_is_worth_waiting_for(stamp):
            self._held = members
        else:
            settled.append(self._settle(members))
        return settled

    def _next_state_is_worth_waiting_for(self, stamp_ns: int) -> bool:
        """Whether the next state is due nearer ``stamp_ns`` than the newest one, not overdue by half its period,
        and before the next set (see the module doc)."""
        if len(self._states) < 2 or self._frame_period_ns is None:
            return False
        newest = self._states[-1][1]
        period = newest - self._states[-2][1]
        if period <= 0:
            return False
        behind = stamp_ns - newest  # how far the frames are past the newest state
        return period / 2 < behind < 1.5 * period and newest + period < stamp_ns + self._frame_period_ns

    @property
    def holding(self) -> bool:
        """Whether a complete set waits for its state."""
        return self._held is not None

    def _match(self, camera: int, new: _Waiting) -> list[_Waiting] | None:
        """The newest set holding ``new``: one waiting frame per camera, all within the slop (see the module doc)."""
        slop = self.sync_slop_ns
        near = [[f for f in queue if abs(f.stamp_ns - new.stamp_ns) <= slop] for queue in self._waiting]
        near[camera] = [new]
        if not all(near):
            return None
        starts = sorted({f.stamp_ns for frames in near for f in frames if f.stamp_ns <= new.stamp_ns}, reverse=True)
        for start in starts:  # the window [start, start + slop] holds new: start >= new - slop
            members = []
            for frames in near:
                inside = [f for f in frames if start <= f.stamp_ns <= start + slop]
                if not inside:
                    break
                members.append(max(reversed(inside), key=lambda f: f.stamp_ns))  # equal stamps: the latest arrival
            else:
                return members
        self.last_refusal = (f"camera frames out of sync: no set within sync_slop_ms "
                             f"{slop / NS_PER_MS:g} of each other")
        return None

    def _take(self, camera: int, member: _Waiting) -> None:
        """Take ``member`` out of its camera's queue, with every waiting frame no newer (those count as unsynced)."""
        queue = self._waiting[camera]
        left = [f for f in queue if f.stamp_ns > member.stamp_ns]
        passed = len(queue) - len(left) - 1
        queue.clear()
        queue.extend(left)
        if passed:
            self._unsynced(camera, passed)

    def _unsynced(self, camera: int, count: int) -> None:
        self.unsynced[camera] += count
        silent = [self.names[c] for c, queue in enumerate(self._waiting) if not queue and c != camera]
        self.last_refusal = (f"{self.names[camera]}: frames found no partner within sync_slop_ms "
                             f"{self.sync_slop_ns / NS_PER_MS:g}" + (f" (nothing waiting from "
                                                                      f"{', '.join(silent)})" if silent else ""))

    def _settle(self, members: list[_Waiting]) -> Settled:
        """Write ``members`` as an observation with its state, or refuse them for want of one."""
        primary = members[0]
        state = None
        if self.buffer.state_dim:
            state = self._paired_state(primary.stamp_ns)
            if state is None:
                self.no_state += 1
                return Settled(primary.stamp_ns, None, self.last_refusal)
        seq = self.buffer.write(primary.image, primary.stamp_ns, min(m.receive_ns for m in members),
                                tuple(m.image for m in members[1:]), state)
        self.observations += 1
        return Settled(primary.stamp_ns, Written(seq, primary.image))

    def _paired_state(self, stamp_ns: int) -> np.ndarray | None:
        """The state stamped nearest ``stamp_ns`` (of equal distances, the earlier: the robot was in it when the
        frames were taken) if within ``state_max_age_ms``; else None, and why."""
        limit = f"(state_max_age_ms {self.state_max_age_ns / NS_PER_MS:g})"
        if not self._states:
            self.last_refusal = "no robot state: none has arrived yet"
            return None
        values, state_ns = min(self._states, key=lambda kept: (abs(kept[1] - stamp_ns), kept[1]))
        if abs(stamp_ns - state_ns) <= self.state_max_age_ns:
            return values
        age_ms = (stamp_ns - state_ns) / NS_PER_MS
        self.last_refusal = (f"no robot state: the nearest is {age_ms:.1f} ms older than the frames {limit}"
                             if age_ms > 0 else
                             f"no robot state: the nearest is stamped {-age_ms:.1f} ms after the frames {limit}; "
                             "do the camera and the state share a clock?")
        return None
