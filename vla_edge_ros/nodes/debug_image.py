"""The reasoning node's ``vla/debug_image``: what the model saw, what it commanded, what its memory holds.

Off by default (``debug_image.enabled``); every ``debug_image.*`` parameter is live, so
``ros2 param set /reasoning debug_image.enabled true`` turns it on while the robot runs. While on:

- the camera callback hands each frame it wrote to the buffer to ``add_frame``, which keeps small copies by
  frame id (``runtime/debug_image.FrameCopies``);
- the reasoning thread hands over one ``CycleView`` per cycle by reference (``runtime/cycle_view.DebugFeed``):
  ids, counters, no pixels;
- a steady-clock timer on the executor, at ``debug_image.rate_hz``, draws the newest view that was not drawn
  yet with ``runtime/debug_image.draw_debug_image`` and publishes it (rgb8, stamped with the frame's own
  header stamp, reliable depth 1 so that rviz2's and Foxglove's default subscriptions match). With no new
  cycle there is no new image, so the rate is also at most the cycle rate; with no subscriber nothing is
  drawn (a picture costs the executor several milliseconds, and the process's cores are the reasoner's).

Off, there is no publisher, no timer and no copy; the reasoning thread's part is a flag test. Nothing here
can stop the node: a view whose frame copy is gone is skipped, a drawing or copy that fails is dropped;
both are counted in the reasoning node's diagnostics (``figures``) and logged at most every LOG_EVERY_S.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from rclpy.clock import Clock, ClockType
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.timer import Timer
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
        self._timer: Timer | None = None
        self._rate_hz = 0.0
        self._drawn: CycleView | None = None
        self._steady = Clock(clock_type=ClockType.STEADY_TIME)
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
        """Make the publisher, the timer and the feed what ``knobs`` say (executor thread)."""
        node = self._node
        if not knobs.enabled:
            self.feed.enabled = False
            self.feed.clear()
            self.copies.clear()
            if self._timer is not None:
                node.destroy_timer(self._timer)
            if self._publisher is not None:
                node.destroy_publisher(self._publisher)
            self._timer = self._publisher = None
            return
        if self._publisher is None:
            self._publisher = node.create_publisher(Image, TOPIC, QOS)
        if self._timer is None or knobs.rate_hz != self._rate_hz:
            if self._timer is not None:
                node.destroy_timer(self._timer)
            self._timer = node.create_timer(1.0 / knobs.rate_hz, self._tick, clock=self._steady)
            self._rate_hz = knobs.rate_hz
        if not self.feed.enabled:
            self.feed.clear()  # a view left by a cycle that ran as it was last switched off: its copies are gone
            self.feed.enabled = True

    def _tick(self) -> None:
        view = self.feed.latest()
        if view is None or view is self._drawn or self._publisher.get_subscription_count() == 0:
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
        self._publisher.publish(image_message(image, header))
        self.published += 1

    def _error(self, line: str) -> None:
        self.errors += 1
        self._node.get_logger().warning(f"debug image: {line}", throttle_duration_sec=LOG_EVERY_S)
