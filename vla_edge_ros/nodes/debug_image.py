"""The reasoning node's ``vla/debug_image``: what the model saw, what it commanded, what its memory holds.

Off by default (``debug_image.enabled``); every ``debug_image.*`` parameter is live, so
``ros2 param set /reasoning debug_image.enabled true`` turns it on while the robot runs. While on:

- the camera callback hands each frame it wrote to the buffer to ``add_frame``, which keeps small copies by
  frame id (``runtime/debug_image.FrameCopies``);
- the reasoning thread hands over one ``CycleView`` per cycle by reference (``runtime/cycle_view.DebugFeed``):
  ids, counters, no pixels;
- a drawing thread of its own, at most ``debug_image.rate_hz`` times a second, draws the newest view that was
  not drawn yet with ``runtime/debug_image.draw_debug_image`` and publishes it (rgb8, stamped with the
  frame's own header stamp, reliable depth 1 so that rviz2's and Foxglove's default subscriptions match).
  Not on the executor: a picture takes several milliseconds (7-14 ms measured at 640 px), which would
  delay the action publisher's control tick and the camera callback that share the executor's thread.
  With no new cycle there is no new image, so the rate is also at most the cycle rate; with no subscriber
  nothing is drawn (the process's cores are the reasoner's).

Off, there is no publisher, no thread and no copy; the reasoning thread's part is a flag test. Nothing here
can stop the node: a view whose frame copy is gone is skipped, a drawing or copy that fails is dropped;
both are counted in the reasoning node's diagnostics (``figures``) and logged at most every LOG_EVERY_S.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image
from std_msgs.msg import Header

from ..config import DebugImageKnobs, OutputKnobs
from ..runtime.cycle_view import CycleView, DebugFeed
from ..runtime.debug_image import FrameCopies, draw_debug_image, layout_for
from .parameters import NodeParameters
from .synthetic_camera import image_message

TOPIC = "vla/debug_image"
QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, reliability=ReliabilityPolicy.RELIABLE,
                 durability=DurabilityPolicy.VOLATILE)
LOG_EVERY_S = 5.0
_JOIN_S = 2.0  # how long switching off waits for the picture being drawn (7-14 ms measured)
_NS = 1_000_000_000


class DebugImage:
    """``vla/debug_image`` of ``node`` (the reasoning node), from its ``debug_image.*`` parameters; see the module doc."""

    def __init__(self, node: Node, params: NodeParameters, output: OutputKnobs) -> None:
        """``output``: the action publisher's knobs, so the action is drawn as it is commanded."""
        self._node = node
        self._params = params
        self._output = output
        self.feed = DebugFeed()
        self.copies = FrameCopies()
        self.published = 0
        self.skipped = 0  # views whose frame had no copy left (the reasoner lagged the camera by MAIN_KEEP frames)
        self.errors = 0  # frames not copied and images not drawn, for any reason
        self._publisher = None
        self._stop: threading.Event | None = None  # set to end the drawing thread; None while off
        self._thread: threading.Thread | None = None
        self._drawn: CycleView | None = None
        params.on_change(self._on_change)
        self._apply(DebugImageKnobs.of(params.snapshot()))

    def add_frame(self, frame_id: int, image: np.ndarray) -> None:
        """A frame the camera node wrote to the buffer as ``frame_id`` (executor thread); never raises."""
        if not self.feed.enabled:
            return
        try:
            layout = layout_for(image.shape, self._params["debug_image.width"], self._output.command_type)
            self.copies.add(frame_id, image, layout, self.feed.latest())
        except Exception as exc:  # a debug picture must not cost the camera a frame
            self._error(f"frame {frame_id} not copied: {exc!r}")

    def figures(self) -> dict[str, Any]:
        """What the reasoning node's diagnostics show of the debug image."""
        return {"debug_image": "on" if self.feed.enabled else "off", "debug_images_published": self.published,
                "debug_images_skipped": self.skipped, "debug_image_errors": self.errors + self.feed.errors}

    def _on_change(self, changed: dict[str, Any]) -> None:
        if any(name.startswith(DebugImageKnobs.PREFIX) for name in changed):
            self._apply(DebugImageKnobs.of(self._params.snapshot()))

    def _apply(self, knobs: DebugImageKnobs) -> None:
        """Make the publisher, the drawing thread and the feed what ``knobs`` say (executor thread); the thread
        reads ``rate_hz`` afresh for every wait."""
        if not knobs.enabled:
            self.close()
            return
        if self._publisher is None:
            self._publisher = self._node.create_publisher(Image, TOPIC, QOS)
        if self._stop is None:
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._draw_loop, args=(self._stop, self._publisher),
                                            name="debug_image", daemon=True)
            self._thread.start()
        if not self.feed.enabled:
            self.feed.clear()  # a view left by a cycle that ran as it was last switched off: its copies are gone
            self.feed.enabled = True

    def close(self) -> None:
        """Off: the feed stops, the copies go, the drawing thread ends, then the publisher goes. The thread is
        joined first: destroying a publisher while another thread is inside its publish aborts the process."""
        self.feed.enabled = False
        self.feed.clear()
        self.copies.clear()
        if self._stop is not None:
            self._stop.set()  # the thread ends after at most the picture it is drawing
            self._thread.join(timeout=_JOIN_S)
        if self._publisher is not None and (self._thread is None or not self._thread.is_alive()):
            self._node.destroy_publisher(self._publisher)  # a thread still drawing keeps it (the node's goes with it)
        self._stop = self._thread = self._publisher = None

    def _draw_loop(self, stop: threading.Event, publisher: Any) -> None:
        """The drawing thread: at most ``rate_hz`` pictures a second, steady clock, until ``stop``."""
        due = time.monotonic()
        while not stop.wait(max(0.0, due - time.monotonic())):
            due = max(due + 1.0 / self._params["debug_image.rate_hz"], time.monotonic())
            try:
                self._draw(publisher, stop)
            except Exception as exc:  # a publisher destroyed under it at shutdown, or worse: counted, never fatal
                if not stop.is_set():
                    self._error(f"not published: {exc!r}")

    def _draw(self, publisher: Any, stop: threading.Event) -> None:
        view = self.feed.latest()
        if view is None or view is self._drawn or publisher.get_subscription_count() == 0:
            return
        self._drawn = view
        frame = self.copies.main(view.frame_id)
        if frame is None:
            self.skipped += 1
            return
        try:
            layout = layout_for(frame.shape, self._params["debug_image.width"], self._output.command_type)
            image = draw_debug_image(frame, view, self.copies.thumbnails(view.strip), layout, self._output,
                                     self._params["deadline_ms"])
        except Exception as exc:  # one bad picture is dropped; the node goes on
            self._error(f"frame {view.frame_id} not drawn: {exc!r}")
            return
        header = Header()  # the camera's stamp: a viewer lines the picture up with the camera topic
        header.stamp.sec, header.stamp.nanosec = divmod(view.stamp_ns, _NS)
        if not stop.is_set():
            publisher.publish(image_message(image, header))
            self.published += 1

    def _error(self, line: str) -> None:
        self.errors += 1
        self._node.get_logger().warning(f"debug image: {line}", throttle_duration_sec=LOG_EVERY_S)
