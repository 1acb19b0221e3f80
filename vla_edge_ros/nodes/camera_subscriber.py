"""The camera subscriber: sensor_msgs/Image or CompressedImage in, newest frame into the FrameBuffer.

It subscribes to ``image_topic`` (raw) and ``image_topic + '/compressed'`` (image_transport's name
for JPEG/PNG), decodes with ``image_codec``, resizes to the buffer's size when the camera's differs,
and writes the frame with its header stamp and its receive time. The callback never waits for
reasoning and never raises: a malformed or unsupported message is dropped, counted by reason on
/diagnostics and logged at most once every LOG_EVERY_S per reason, so a broken camera cannot flood
the log or take the node down.

QoS: both choices are depth 1, because the buffer keeps only the newest frame and a queue would only
add latency. ``sensor_data`` is rclpy's ``qos_profile_sensor_data`` (best effort, volatile) at depth 1
and matches every publisher. ``reliable`` only matches reliable publishers; a best-effort driver
(such as the synthetic camera) never reaches it, and rclpy logs the incompatible QoS.

Both subscriptions and the diagnostics timer share the node's default mutually exclusive callback
group, so even under a MultiThreadedExecutor the buffer has one writer at a time and the counters
are never read mid-update.

Diagnostics, once a second (a "valid frame" is one that was decoded and written to the buffer):

- ERROR: no valid frame for more than the stale_error_ms parameter (counted from start until the first).
- WARN: no valid frame for more than stale_warn_ms, or any message dropped in the last DROP_WARN_S.
- OK otherwise. Frames the reasoning thread never read (``buffer_overwritten_unread``) are reported
  but are not a fault: skipping them is what the buffer is for.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CompressedImage, Image

from ..runtime.event_window import EventWindow
from ..runtime.frame_buffer import FrameBuffer
from ..runtime.image_codec import REASONS, ImageDecodeError, frame_from_message
from .diagnostics import ERROR, OK, WARN, DiagnosticsTimer, status
from .parameters import NodeParameters

if TYPE_CHECKING:  # a header stamp; builtin_interfaces comes with std_msgs, so it is not imported at run time
    from builtin_interfaces.msg import Time as TimeMsg

INTERNAL_ERROR = "internal_error"
"""Drop reason for an exception that is not an ImageDecodeError: a bug in this package, not bad input."""

DROP_REASONS: tuple[str, ...] = (*sorted(REASONS), INTERNAL_ERROR)
"""Every drop counter, declared up front so diagnostics always show the same keys."""

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


class CameraSubscriber(Node):
    """Writes every decodable camera message into ``buffer``; counts and logs the rest."""

    def __init__(self, buffer: FrameBuffer, settings: dict[str, Any],
                 on_frame: Callable[[int, np.ndarray], None] | None = None, **node_kwargs: Any) -> None:
        """``on_frame(seq, image)``: told of each frame written to the buffer, after it was (the debug image's
        copies); it must not raise."""
        super().__init__("camera_subscriber", **node_kwargs)
        self.buffer = buffer
        self._on_frame = on_frame
        self.params = NodeParameters(self, "camera_subscriber", settings)
        self.size = (self.params["frame_height"], self.params["frame_width"])
        if buffer.shape[:2] != self.size:
            self.destroy_node()
            raise ValueError(f"frame buffer is {buffer.shape[0]}x{buffer.shape[1]} but camera_subscriber is "
                             f"configured for {self.size[0]}x{self.size[1]} (frame_height x frame_width)")
        self.received = 0  # every message, valid or not
        self.written = 0  # valid frames written to the buffer
        self._dropped = dict.fromkeys(DROP_REASONS, 0)
        self._arrivals = EventWindow(RATE_WINDOW_S)  # messages received, for the input rate
        self._start_ns = time.monotonic_ns()
        self._last_frame_ns: int | None = None
        self._last_drop_ns: int | None = None
        self._log_gate: dict[str, tuple[int, int]] = {}  # reason -> (last log line ns, drops not logged)
        topic, qos = self.params["image_topic"], subscription_qos(self.params["qos"])
        raw = self.create_subscription(Image, topic, self._on_image, qos)
        compressed = self.create_subscription(CompressedImage, topic + "/compressed", self._on_compressed, qos)
        self.topic, self._compressed_topic = raw.topic_name, compressed.topic_name  # resolved: namespace, ~
        self._diagnostics = DiagnosticsTimer(self, self.report)

    @property
    def dropped(self) -> dict[str, int]:
        """Dropped messages per reason (a copy; every reason in DROP_REASONS is present)."""
        return dict(self._dropped)

    def _on_image(self, msg: Image) -> None:
        self._receive(msg, self.topic, compressed=False)

    def _on_compressed(self, msg: CompressedImage) -> None:
        self._receive(msg, self._compressed_topic, compressed=True)

    def _receive(self, msg: Image | CompressedImage, topic: str, compressed: bool) -> None:
        receive_ns = time.monotonic_ns()
        self.received += 1
        self._arrivals.add("message", receive_ns)
        try:
            image = frame_from_message(msg, compressed, self.size)
            seq = self.buffer.write(image, stamp_ns(msg.header.stamp), receive_ns)
        except ImageDecodeError as exc:
            self._drop(exc.reason, receive_ns, f"{topic}: {exc}")
            return
        except Exception:  # a bug, not bad input: count it, show where, and keep the camera running
            self._drop(INTERNAL_ERROR, receive_ns, f"{topic}: {traceback.format_exc().rstrip()}")
            return
        self.written += 1
        self._last_frame_ns = receive_ns
        if self._on_frame is not None:
            self._on_frame(seq, image)

    def _drop(self, reason: str, now_ns: int, detail: str) -> None:
        self._dropped[reason] += 1
        self._last_drop_ns = now_ns
        last_ns, unlogged = self._log_gate.get(reason, (None, 0))
        if last_ns is not None and now_ns - last_ns < LOG_EVERY_S * _NS:
            self._log_gate[reason] = (last_ns, unlogged + 1)
            return
        self._log_gate[reason] = (now_ns, 0)
        since = f"; {unlogged} more since the last such line" if unlogged else ""
        line = f"dropped a message ({reason}{since}): {detail}"
        if reason == INTERNAL_ERROR:  # two call sites: rclpy keys a log call's severity by its line
            self.get_logger().error(line)
        else:
            self.get_logger().warning(line)

    def report(self, now_ns: int | None = None) -> DiagnosticStatus:
        """This node's status at ``now_ns`` (time.monotonic_ns(); default: now)."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        figures = self.figures(now_ns)
        silent_s = (now_ns - (self._start_ns if self._last_frame_ns is None else self._last_frame_ns)) / _NS
        level, problems = OK, []
        if silent_s * 1e3 > self.params["stale_warn_ms"]:
            level = ERROR if silent_s * 1e3 > self.params["stale_error_ms"] else WARN
            when = f"since start ({silent_s:.1f} s)" if self._last_frame_ns is None else f"for {silent_s:.1f} s"
            problems.append(f"no valid frame on {self.topic} {when}")
        if self._last_drop_ns is not None and now_ns - self._last_drop_ns <= DROP_WARN_S * _NS:
            level = WARN if level == OK else level
            reasons = ", ".join(f"{reason}: {n}" for reason, n in self._dropped.items() if n)
            problems.append(f"dropping messages (totals: {reasons})")
        if not problems:
            problems.append(f"receiving {figures['input_fps']:.1f} fps" if self._last_frame_ns is not None
                            else "waiting for the first frame")
        return status(self, level, "; ".join(problems), figures)

    def figures(self, now_ns: int | None = None) -> dict[str, object]:
        """The node's counters and measurements at ``now_ns`` as plain values."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        fps = self._arrivals.rate_hz("message", now_ns)
        return {
            "topic": self.topic,
            "qos": self.params["qos"],
            "frame_size": f"{self.size[1]}x{self.size[0]}",
            "received": self.received,
            "written": self.written,
            "dropped": sum(self._dropped.values()),
            **{f"dropped_{reason}": n for reason, n in self._dropped.items()},
            "buffer_overwritten_unread": self.buffer.stats().dropped,
            "input_fps": fps,
            "last_frame_age_s": "never" if self._last_frame_ns is None else (now_ns - self._last_frame_ns) / _NS,
        }
