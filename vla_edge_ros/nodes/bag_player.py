"""Play a bag over DDS like ``ros2 bag play --clock``, on a machine without rosbag2.

The bag's camera and command topics are published with their recorded timing (scaled by ``rate``)
as the CDR bytes the bag holds, so nothing is deserialized on the way, and /clock carries the bag
time at ``clock_hz``: nodes started with ``use_sim_time:=true`` then live on the bag's timeline, and
a frame's header stamp is never ahead of their clock, because /clock is held at the next message's
time when playback falls behind. With ``loop`` the bag starts over at its end and /clock jumps
back to its start, as ``ros2 bag play --loop`` does.

QoS follows what the live graph expects: sensor-data (best effort) for images, like a camera
driver; reliable for commands and any other topic; /clock best effort, depth 1, like rosbag2's.

Discovery takes a while, and nothing published before a subscriber has matched reaches it: playing
at once to a node started with it lost the first 0.3-0.9 s of the bag in 2 of 3 runs, and all of a
one-frame bag. ``StartWhen`` holds the first message back until every played topic has
``subscribers`` matched subscriptions (or fails after ``timeout_s``), then for ``delay_s`` more, which
covers the other half of discovery: a node that has just started may match the player's writers a
little after the player matched its readers. When playback ends (not looping) the player waits (up to
``FLUSH_TIMEOUT_S``) until its reliable topics' last messages are acknowledged, so a short bag is not
cut off by the process exiting.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rclpy.duration import Duration
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from rosgraph_msgs.msg import Clock

from ..bags import COMMAND_MSGTYPES, IMAGE_MSGTYPES, Bag, BagError
from ..runtime.stop_signals import StopSignals

CLOCK_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT)
RELIABLE_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
_MAX_SLEEP_S = 0.05  # how long a wait may go without checking for shutdown
LINGER_S = 0.5
FLUSH_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class StartWhen:
    """When playback may start: once every played topic has ``subscribers`` matched subscriptions (TimeoutError
    after ``timeout_s``), and ``delay_s`` after that."""

    subscribers: int = 0
    timeout_s: float = 30.0
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        if self.subscribers < 0:
            raise ValueError(f"the number of subscribers to wait for must be >= 0, got {self.subscribers}")
        if not self.timeout_s > 0.0:
            raise ValueError(f"the wait for subscribers needs a positive timeout, got {self.timeout_s} s")
        if not 0.0 <= self.delay_s < float("inf"):
            raise ValueError(f"the start delay must be >= 0 s, got {self.delay_s}")


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
             stop: StopSignals | None = None, start: StartWhen = StartWhen()) -> None:
        """Publish the bag once (or until stopped with ``loop``) when ``start`` allows; returns early when ``stop``
        reports SIGINT or SIGTERM or the context shuts down. TimeoutError when the subscribers ``start`` waits
        for do not match in time."""
        self._stop = stop
        if stop is not None:
            stop.running = True
        try:
            if self._wait_to_start(start):
                self._play(loop, every_second)
        finally:
            if stop is not None:
                stop.running = False

    def missing_subscribers(self, count: int) -> dict[str, int]:
        """The played topics with fewer than ``count`` matched subscriptions, and how many they have."""
        matched = {topic: publisher.get_subscription_count() for topic, publisher in self._topic_publishers.items()}
        return {topic: n for topic, n in matched.items() if n < count}

    def _wait_to_start(self, start: StartWhen) -> bool:
        """Block until ``start`` allows the first message; False if stopped first."""
        began = time.monotonic()
        matched_at = None
        while not self._stopped():
            now = time.monotonic()
            if matched_at is None:
                missing = self.missing_subscribers(start.subscribers)
                if not missing:
                    matched_at = now
                elif now - began >= start.timeout_s:
                    counts = ", ".join(f"{topic} has {n}" for topic, n in missing.items())
                    raise TimeoutError(f"no start after {start.timeout_s:g} s waiting for {start.subscribers} "
                                       f"subscriber(s) on each played topic: {counts}")
            if matched_at is not None and now - matched_at >= start.delay_s:
                return True
            time.sleep(_MAX_SLEEP_S)
        return False

    def _stopped(self) -> bool:
        return not self.context.ok() or (self._stop is not None and self._stop.requested is not None)

    def _play(self, loop: bool, every_second: Callable[[], None] | None) -> None:
        last_report = time.monotonic()

        def report() -> None:
            nonlocal last_report
            if every_second is not None and time.monotonic() - last_report >= 1.0:
                last_report = time.monotonic()
                every_second()

        while self.context.ok():
            try:
                finished = self._play_once(report)
                if finished and not loop:
                    self._flush()
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

    def _flush(self) -> None:
        """Wait until every reliable topic's messages are acknowledged by its matched subscribers, then keep
        the participant up LINGER_S more: best-effort frames have no acknowledgement, and a frame still in
        this process's shared-memory segment is lost if the segment goes before a subscriber has read it
        (a one-frame bag lost its frame in about 1 run of 3 without this)."""
        for topic, publisher in self._topic_publishers.items():
            if self.bag.topics[topic].msgtype not in IMAGE_MSGTYPES:
                publisher.wait_for_all_acked(Duration(seconds=FLUSH_TIMEOUT_S))
        time.sleep(LINGER_S)

    def _play_once(self, report: Callable[[], None]) -> bool:
        """One pass through the bag; False if it stopped for a shutdown."""
        start_wall, start_ns = time.monotonic(), self.bag.start_ns
        clock_period = 1.0 / self.clock_hz if self._clock_publisher else float("inf")
        next_tick = start_wall
        for topic, _, time_ns, data in self.bag.raw_messages(self.topics):
            due = start_wall + (time_ns - start_ns) / 1e9 / self.rate
            while True:
                if self._stopped():
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
