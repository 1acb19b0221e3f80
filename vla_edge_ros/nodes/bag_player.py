"""Play a bag over DDS like ``ros2 bag play --clock``, on a machine without rosbag2.

The bag's camera and command topics are published with their recorded timing (scaled by ``rate``)
as the CDR bytes the bag holds, so nothing is deserialized on the way, and /clock carries the bag
time at ``clock_hz``: nodes started with ``use_sim_time:=true`` then live on the bag's timeline, and
a frame's header stamp is never ahead of their clock, because /clock is held at the next message's
time when playback falls behind. With ``loop`` the bag starts over at its end and /clock jumps
back to its start, as ``ros2 bag play --loop`` does.

QoS follows what the live graph expects: sensor-data (best effort) for images, like a camera
driver; reliable for commands and any other topic; /clock best effort, depth 1, like rosbag2's.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from rosgraph_msgs.msg import Clock

from ..bags import COMMAND_MSGTYPES, IMAGE_MSGTYPES, Bag, BagError
from ..runtime.stop_signals import StopSignals

CLOCK_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT)
RELIABLE_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
_MAX_SLEEP_S = 0.05  # how long a wait may go without checking for shutdown


def message_class(msgtype: str) -> type:
    """The installed Python class of a ``pkg/msg/Name`` type."""
    package, _, name = msgtype.partition("/msg/")
    try:
        return getattr(importlib.import_module(f"{package}.msg"), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot publish {msgtype}: its Python message class is not installed ({exc})") from exc


def default_topics(bag: Bag) -> list[str]:
    """Every camera and command topic of ``bag``."""
    topics = [info.name for info in bag.topics.values() if info.msgtype in IMAGE_MSGTYPES + COMMAND_MSGTYPES]
    if not topics:
        raise BagError(f"{bag.path}: no camera or command topic to play; name topics to play with --topics")
    return topics


class BagPlayer(Node):
    """Publishes ``topics`` of ``bag`` (default: its camera and command topics) when ``play`` is called."""

    def __init__(self, bag: Bag, topics: Sequence[str] | None = None, *, rate: float = 1.0,
                 clock_hz: float = 100.0, **node_kwargs: Any) -> None:
        if not rate > 0.0:
            raise ValueError(f"rate must be positive, got {rate}")
        if not clock_hz >= 0.0:
            raise ValueError(f"clock_hz must be >= 0 (0: no /clock), got {clock_hz}")
        self.topics = list(topics) if topics else default_topics(bag)
        if absent := [topic for topic in self.topics if topic not in bag.topics]:
            raise BagError(f"{bag.path}: no topic {', '.join(absent)}; it has {', '.join(bag.topics)}")
        classes = {topic: message_class(bag.topics[topic].msgtype) for topic in self.topics}  # before a node exists
        super().__init__("bag_player", **node_kwargs)
        self.bag, self.rate, self.clock_hz = bag, rate, clock_hz
        self.published = 0
        self.passes = 0  # complete passes through the bag
        self.bag_time_ns = bag.start_ns  # receive time of the message published last
        self._stop: StopSignals | None = None  # the process's signal handler while ``play`` runs
        self._topic_publishers = {topic: self.create_publisher(
            cls, topic, qos_profile_sensor_data if bag.topics[topic].msgtype in IMAGE_MSGTYPES else RELIABLE_QOS)
            for topic, cls in classes.items()}
        self._clock_publisher = self.create_publisher(Clock, "/clock", CLOCK_QOS) if clock_hz > 0 else None

    def play(self, loop: bool = False, every_second: Callable[[], None] | None = None,
             stop: StopSignals | None = None) -> None:
        """Publish the bag once (or until stopped with ``loop``); returns early when ``stop`` reports SIGINT or
        SIGTERM or the context shuts down."""
        last_report = time.monotonic()
        self._stop = stop
        if stop is not None:
            stop.running = True

        def report() -> None:
            nonlocal last_report
            if every_second is not None and time.monotonic() - last_report >= 1.0:
                last_report = time.monotonic()
                every_second()

        while self.context.ok():
            try:
                finished = self._play_once(report)
            except ExternalShutdownException:
                break
            except Exception:
                # The context can shut down between ok() and a publish, which then raises.
                # That is a shutdown, not a failure.
                if self.context.ok():
                    raise
                break
            if not finished:
                break
            self.passes += 1
            if not loop:
                break
        if stop is not None:
            stop.running = False

    def _play_once(self, report: Callable[[], None]) -> bool:
        """One pass through the bag; False if it stopped for a shutdown."""
        start_wall, start_ns = time.monotonic(), self.bag.start_ns
        clock_period = 1.0 / self.clock_hz if self._clock_publisher else float("inf")
        next_tick = start_wall
        for topic, _, time_ns, data in self.bag.raw_messages(self.topics):
            due = start_wall + (time_ns - start_ns) / 1e9 / self.rate
            while True:
                if not self.context.ok() or (self._stop is not None and self._stop.requested):
                    return False
                now = time.monotonic()
                if now >= next_tick:
                    # Bag time runs with the wall clock, but never past the message not yet published.
                    self._tick(min(start_ns + round((now - start_wall) * self.rate * 1e9), time_ns))
                    next_tick += clock_period
                    if next_tick <= now:  # fell behind: skip the missed ticks rather than burst them
                        next_tick = now + clock_period
                report()
                if now >= due:
                    break
                time.sleep(min(due - now, next_tick - now, _MAX_SLEEP_S))
            self._topic_publishers[topic].publish(data)
            self.bag_time_ns = time_ns
            self.published += 1
        self._tick(self.bag.end_ns)
        return True

    def _tick(self, bag_time_ns: int) -> None:
        if self._clock_publisher is not None:
            msg = Clock()
            msg.clock.sec, msg.clock.nanosec = divmod(bag_time_ns, 1_000_000_000)
            self._clock_publisher.publish(msg)
