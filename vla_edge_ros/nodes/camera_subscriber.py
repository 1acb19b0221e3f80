"""The camera subscriber: camera frames (and the robot's state) in, the newest observation into the FrameBuffer.

It subscribes to ``image_topic`` (raw) and ``image_topic + '/compressed'`` (image_transport's name
for JPEG/PNG), and the same pair for each of ``extra_image_topics``, decodes with ``image_codec``,
resizes to the buffer's size when a camera's differs, and hands each frame with its header stamp and
its receive time to the observation assembler (``runtime/observation.py``), which syncs the cameras,
pairs the state and writes whole observations to the buffer. With ``state_topic`` set it also reads
the robot's state there (sensor_msgs/JointState or nav_msgs/Odometry, ``state_type``;
``runtime/robot_state.py``), best effort at depth 1; the assembler keeps the last good states and pairs
each set of frames with the one stamped nearest it, waiting for it when the frame came first. The
callbacks never wait for reasoning and never raise: a malformed or unsupported message is dropped,
counted by reason on /diagnostics and logged at most once every LOG_EVERY_S per reason, so a broken
camera or state publisher cannot flood the log or take the node down.

QoS: both choices are depth 1, because the buffer keeps only the newest frame and a queue would only
add latency. ``sensor_data`` is rclpy's ``qos_profile_sensor_data`` (best effort, volatile) at depth 1
and matches every publisher. ``reliable`` only matches reliable publishers; a best-effort driver
(such as the synthetic camera) never reaches it, and rclpy logs the incompatible QoS.

Every subscription and the diagnostics timer share the node's default mutually exclusive callback
group, so even under a MultiThreadedExecutor the assembler and the buffer have one writer at a time
and the counters are never read mid-update.

Diagnostics, once a second (a "valid frame" is one that was decoded; ``written`` counts the
observations written to the buffer, which with one camera and no state are the valid frames):

- ERROR: no valid frame on a camera's topic for more than the stale_error_ms parameter (counted from
  start until the first); with every camera alive, no observation for that long (frames out of sync, or
  no fresh state: the assembler's reason is given); with a state topic, no valid state for that long.
- WARN: the same for stale_warn_ms, or any camera or state message dropped in the last DROP_WARN_S.
- OK otherwise. Observations the reasoning thread never read (``buffer_overwritten_unread``) are reported
  but are not a fault: skipping them is what the buffer is for. ``unsynced_frames`` (frames that found no
  partner within sync_slop_ms) and ``no_state`` (complete sets without a fresh state) count what never
  became an observation.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus
from nav_msgs.msg import Odometry
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CompressedImage, Image, JointState

from ..config import ObservationKnobs
from ..runtime.event_window import EventWindow
from ..runtime.frame_buffer import FrameBuffer
from ..runtime.image_codec import REASONS, ImageDecodeError, frame_from_message
from ..runtime.observation import ObservationAssembler, Settled, observation_shape
from ..runtime.robot_state import REASONS as STATE_REASONS
from ..runtime.robot_state import StateInput, state_reader
from .diagnostics import ERROR, OK, WARN, DiagnosticsTimer, status
from .parameters import NodeParameters

if TYPE_CHECKING:  # a header stamp; builtin_interfaces comes with std_msgs, so it is not imported at run time
    from builtin_interfaces.msg import Time as TimeMsg

INTERNAL_ERROR = "internal_error"
"""Drop reason for an exception that is not an ImageDecodeError: a bug in this package, not bad input."""

DROP_REASONS: tuple[str, ...] = (*sorted(REASONS), INTERNAL_ERROR)
"""Every drop counter, declared up front so diagnostics always show the same keys."""

STATE_DROP_REASONS: tuple[str, ...] = (*STATE_REASONS, INTERNAL_ERROR)
"""Why a state message was dropped (with a state topic): ``robot_state.REASONS``, or a bug of ours."""

STATE_MESSAGES = {"joint_state": JointState, "odometry": Odometry}

DROP_WARN_S = 1.0
RATE_WINDOW_S = 1.0
LOG_EVERY_S = 5.0

_NS = 1_000_000_000


def subscription_qos(name: str) -> QoSProfile:
    """The subscription profile for the ``qos`` parameter: sensor_data or reliable, both depth 1."""
    reliability = ReliabilityPolicy.BEST_EFFORT if name == "sensor_data" else ReliabilityPolicy.RELIABLE
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, reliability=reliability,
                      durability=DurabilityPolicy.VOLATILE)


def stamp_ns(stamp: TimeMsg) -> int:
    """A builtin_interfaces/Time as integer nanoseconds."""
    return stamp.sec * _NS + stamp.nanosec


@dataclass
class _Camera:
    """One camera's subscriptions (resolved names) and what it delivered."""

    topic: str
    compressed_topic: str
    frames: int = 0  # valid frames
    last_frame_ns: int | None = None


class CameraSubscriber(Node):
    """Hands every decodable camera frame and readable state to the observation assembler, which writes whole
    observations into ``buffer``; counts and logs the rest."""

    def __init__(self, buffer: FrameBuffer, settings: dict[str, Any],
                 on_frame: Callable[[int, np.ndarray], None] | None = None, **node_kwargs: Any) -> None:
        """``buffer``: built for these settings (``observation_buffer``). ``on_frame(seq, image)``: told of each
        observation written to the buffer (its primary frame), after it was (the debug image's copies); it must
        not raise."""
        super().__init__("camera_subscriber", **node_kwargs)
        self.buffer = buffer
        self._on_frame = on_frame
        self.params = NodeParameters(self, "camera_subscriber", settings)
        self.size = (self.params["frame_height"], self.params["frame_width"])
        knobs = ObservationKnobs.of(self.params.snapshot())
        if buffer.shape[:2] != self.size:
            self.destroy_node()
            raise ValueError(f"frame buffer is {buffer.shape[0]}x{buffer.shape[1]} but camera_subscriber is "
                             f"configured for {self.size[0]}x{self.size[1]} (frame_height x frame_width)")
        extra, state_dim = observation_shape(knobs)
        if (buffer.extra_cameras, buffer.state_dim) != (extra, state_dim):
            self.destroy_node()
            raise ValueError(f"frame buffer holds {buffer.extra_cameras} extra cameras and a {buffer.state_dim}-value "
                             f"state, but camera_subscriber is configured for {extra} and {state_dim} "
                             "(extra_image_topics, state_topic): build it with observation_buffer")
        self.received = 0  # every camera message, valid or not
        self.written = 0  # observations written to the buffer
        self._dropped = dict.fromkeys(DROP_REASONS, 0)
        self._arrivals = EventWindow(RATE_WINDOW_S)  # messages received per camera, for the input rates
        self._start_ns = time.monotonic_ns()
        self._last_written_ns: int | None = None
        self._last_drop_ns: int | None = None
        self._last_state_drop_ns: int | None = None
        self._log_gate: dict[str, tuple[int, int]] = {}  # reason -> (last log line ns, drops not logged)
        qos = subscription_qos(self.params["qos"])
        self.cameras: list[_Camera] = []
        for index, topic in enumerate(knobs.topics):
            raw = self.create_subscription(Image, topic, partial(self._receive, index, False), qos)
            compressed = self.create_subscription(CompressedImage, topic + "/compressed",
                                                  partial(self._receive, index, True), qos)
            self.cameras.append(_Camera(raw.topic_name, compressed.topic_name))  # resolved: namespace, ~
        self.topic = self.cameras[0].topic
        self.assembler = ObservationAssembler(buffer, knobs.sync_slop_ms, knobs.state_max_age_ms,
                                              [camera.topic for camera in self.cameras])
        self.states: StateInput | None = None
        self.state_topic = ""
        self._state_internal_errors = 0
        if knobs.state_topic:
            reader = state_reader(knobs.state_type, knobs.state_joint_names, knobs.state_joint_velocities)
            self.states = StateInput(reader, self._state_read)
            self.state_topic = self.create_subscription(STATE_MESSAGES[knobs.state_type], knobs.state_topic,
                                                        self._on_state, subscription_qos("sensor_data")).topic_name
        self._diagnostics = DiagnosticsTimer(self, self.report)

    @property
    def dropped(self) -> dict[str, int]:
        """Dropped camera messages per reason (a copy; every reason in DROP_REASONS is present)."""
        return dict(self._dropped)

    @property
    def state_dropped(self) -> dict[str, int]:
        """Dropped state messages per reason (every reason in STATE_DROP_REASONS; all 0 without a state topic)."""
        counts = dict.fromkeys(STATE_DROP_REASONS, 0)
        if self.states is not None:
            counts.update(self.states.dropped, **{INTERNAL_ERROR: self._state_internal_errors})
        return counts

    def _receive(self, index: int, compressed: bool, msg: Image | CompressedImage) -> None:
        receive_ns = time.monotonic_ns()
        camera = self.cameras[index]
        topic = camera.compressed_topic if compressed else camera.topic
        self.received += 1
        self._arrivals.add(f"camera {index}", receive_ns)
        try:
            image = frame_from_message(msg, compressed, self.size)
            camera.frames += 1
            camera.last_frame_ns = receive_ns
            settled = self.assembler.frame(index, image, stamp_ns(msg.header.stamp), receive_ns)
        except ImageDecodeError as exc:
            self._drop(exc.reason, receive_ns, f"{topic}: {exc}")
            return
        except Exception:  # a bug, not bad input: count it, show where, and keep the camera running
            self._drop(INTERNAL_ERROR, receive_ns, f"{topic}: {traceback.format_exc().rstrip()}")
            return
        self._hand_over(settled, receive_ns)

    def _state_read(self, values: np.ndarray, stamp: int) -> None:
        """A good state: kept for pairing, and the set of frames waiting for it handed over if it settled."""
        self._hand_over(self.assembler.state(values, stamp), time.monotonic_ns())

    def _hand_over(self, settled: list[Settled], now_ns: int) -> None:
        """Tell the reasoning thread of each observation written."""
        for written in (s.written for s in settled if s.written is not None):
            self.written += 1
            self._last_written_ns = now_ns
            if self._on_frame is not None:
                self._on_frame(written.seq, written.image)

    def _on_state(self, msg: JointState | Odometry) -> None:
        receive_ns = time.monotonic_ns()
        try:
            error = self.states.receive(msg, stamp_ns(msg.header.stamp), receive_ns)
        except Exception:  # a bug, not bad input: counted apart, and the node keeps running
            self._state_internal_errors += 1
            self._last_state_drop_ns = receive_ns
            detail = traceback.format_exc().rstrip()
            self._log_drop(f"state {INTERNAL_ERROR}", receive_ns, f"{self.state_topic}: {detail}")
            return
        if error is not None:
            self._last_state_drop_ns = receive_ns
            self._log_drop(f"state {error.reason}", receive_ns, f"{self.state_topic}: {error}")

    def _drop(self, reason: str, now_ns: int, detail: str) -> None:
        self._dropped[reason] += 1
        self._last_drop_ns = now_ns
        self._log_drop(reason, now_ns, detail)

    def _log_drop(self, reason: str, now_ns: int, detail: str) -> None:
        """Log a dropped message, once per LOG_EVERY_S per ``reason``; the next line says how many it skipped."""
        last_ns, unlogged = self._log_gate.get(reason, (None, 0))
        if last_ns is not None and now_ns - last_ns < LOG_EVERY_S * _NS:
            self._log_gate[reason] = (last_ns, unlogged + 1)
            return
        self._log_gate[reason] = (now_ns, 0)
        since = f"; {unlogged} more since the last such line" if unlogged else ""
        line = f"dropped a message ({reason}{since}): {detail}"
        if reason.endswith(INTERNAL_ERROR):  # two call sites: rclpy keys a log call's severity by its line
            self.get_logger().error(line)
        else:
            self.get_logger().warning(line)

    def report(self, now_ns: int | None = None) -> DiagnosticStatus:
        """This node's status at ``now_ns`` (time.monotonic_ns(); default: now)."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        figures = self.figures(now_ns)
        warn_ms, error_ms = self.params["stale_warn_ms"], self.params["stale_error_ms"]
        levels, problems = [OK], []

        def silent(what: str, last_ns: int | None) -> bool:
            """Note ``what`` (WARN, or ERROR) when nothing came for longer than the thresholds; True if so."""
            silent_s = (now_ns - (self._start_ns if last_ns is None else last_ns)) / _NS
            if silent_s * 1e3 <= warn_ms:
                return False
            levels.append(ERROR if silent_s * 1e3 > error_ms else WARN)
            when = f"since start ({silent_s:.1f} s)" if last_ns is None else f"for {silent_s:.1f} s"
            problems.append(f"{what} {when}")
            return True

        cameras_silent = [silent(f"no valid frame on {camera.topic}", camera.last_frame_ns) for camera in self.cameras]
        state_silent = self.states is not None and silent(f"no valid state on {self.state_topic}",
                                                          self.states.last_state_ns)
        if not any(cameras_silent) and not state_silent and silent("no observation", self._last_written_ns):
            problems[-1] += f": {self.assembler.last_refusal}"  # every part arrives: the sync or the pairing failed
        if self._last_drop_ns is not None and now_ns - self._last_drop_ns <= DROP_WARN_S * _NS:
            levels.append(WARN)
            reasons = ", ".join(f"{reason}: {n}" for reason, n in self._dropped.items() if n)
            problems.append(f"dropping messages (totals: {reasons})")
        if self._last_state_drop_ns is not None and now_ns - self._last_state_drop_ns <= DROP_WARN_S * _NS:
            levels.append(WARN)
            reasons = ", ".join(f"{reason}: {n}" for reason, n in self.state_dropped.items() if n)
            problems.append(f"dropping state messages (totals: {reasons}; last: {self.states.last_refusal})")
        if not problems and self._last_written_ns is None:
            waiting = any(camera.frames for camera in self.cameras) and self.assembler.last_refusal
            problems.append(f"waiting for the first observation: {self.assembler.last_refusal}" if waiting
                            else "waiting for the first frame")
        if not problems:
            problems.append(f"receiving {figures['input_fps']:.1f} fps")
        return status(self, max(levels), "; ".join(problems), figures)

    def figures(self, now_ns: int | None = None) -> dict[str, object]:
        """The node's counters and measurements at ``now_ns`` as plain values."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns

        def age(last_ns: int | None) -> float | str:
            return "never" if last_ns is None else (now_ns - last_ns) / _NS

        primary = self.cameras[0]
        figures: dict[str, object] = {
            "topic": self.topic,
            "qos": self.params["qos"],
            "frame_size": f"{self.size[1]}x{self.size[0]}",
            "received": self.received,
            "written": self.written,
            "dropped": sum(self._dropped.values()),
            **{f"dropped_{reason}": n for reason, n in self._dropped.items()},
            "buffer_overwritten_unread": self.buffer.stats().dropped,
            "input_fps": self._arrivals.rate_hz("camera 0", now_ns),
            "last_frame_age_s": age(primary.last_frame_ns),
            "unsynced_frames": sum(self.assembler.unsynced),
            "no_state": self.assembler.no_state,
        }
        if len(self.cameras) > 1:
            extra = self.cameras[1:]
            figures.update({
                "extra_topics": ", ".join(camera.topic for camera in extra),
                "sync_slop_ms": self.params["sync_slop_ms"],
                "camera_frames": ", ".join(str(camera.frames) for camera in self.cameras),
                "camera_fps": ", ".join(f"{self._arrivals.rate_hz(f'camera {i}', now_ns):.1f}"
                                        for i in range(len(self.cameras))),
                "camera_unsynced": ", ".join(str(n) for n in self.assembler.unsynced),
                "camera_last_frame_age_s": ", ".join(str(age(camera.last_frame_ns)) for camera in self.cameras),
            })
        if self.states is not None:
            state_dropped = self.state_dropped
            figures.update({
                "state_topic": self.state_topic,
                "state_type": self.params["state_type"],
                "state_received": self.states.received,
                "state_dropped": sum(state_dropped.values()),
                **{f"state_dropped_{reason}": n for reason, n in state_dropped.items()},
                "last_state_age_s": age(self.states.last_state_ns),
                "state_max_age_ms": self.params["state_max_age_ms"],
            })
        figures["last_refusal"] = self.assembler.last_refusal or "none"
        return figures
