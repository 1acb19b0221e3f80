"""vla-edge play: a bag's frames and commands over real DDS with their recorded timing, and /clock
carrying the bag time so that a node with use_sim_time lives on the bag's timeline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")

from rclpy.node import Node  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402
from rosgraph_msgs.msg import Clock  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from std_msgs.msg import Float32MultiArray  # noqa: E402

from ros_graph import WAIT_S, private_graph  # noqa: E402
from vla_edge_ros.bags import Bag, BagError  # noqa: E402
from vla_edge_ros.bags.scenarios import BagSpec, write_bag  # noqa: E402
from vla_edge_ros.cli import main  # noqa: E402
from vla_edge_ros.nodes.bag_player import LINGER_S, BagPlayer, StartWhen  # noqa: E402

pytestmark = pytest.mark.ros
CAMERA, COMMAND = "/camera/image_raw", "/vla/command"
KEEP_ALL = QoSProfile(depth=1000, reliability=ReliabilityPolicy.BEST_EFFORT)  # matches every publisher


def _ns(stamp) -> int:
    return stamp.sec * 1_000_000_000 + stamp.nanosec


def _wait(executor, done, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        executor.spin_once(timeout_sec=0.05)
    assert done(), "timed out"


@pytest.fixture(scope="module")
def tiny_bag(tmp_path_factory):
    return write_bag(BagSpec(seconds=1.0, size=(32, 24)), tmp_path_factory.mktemp("play") / "tiny.mcap")


@pytest.fixture(scope="module")
def one_frame_bag(tmp_path_factory):
    """One camera frame and one command, at the same time."""
    return write_bag(BagSpec(seconds=0.01, size=(32, 24)), tmp_path_factory.mktemp("play") / "one.mcap")


def _play(bag, *options: str, domain: int) -> subprocess.Popen:
    """``vla-edge play`` in its own process on ``domain``."""
    return subprocess.Popen([sys.executable, "-m", "vla_edge_ros", "play", str(bag), *options], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "ROS_DOMAIN_ID": str(domain)})


def test_play_publishes_frames_in_order_with_their_stamps_and_clock_follows_the_bag(tiny_bag):
    with Bag(tiny_bag) as bag, private_graph() as (context, executor):
        recorded = [_ns(m.msg.header.stamp) for m in bag.messages([CAMERA])]
        listener = Node("listener", context=context, parameter_overrides=[Parameter("use_sim_time", value=True)])
        frames, commands, clock = [], [], []
        listener.create_subscription(Image, CAMERA, lambda m: frames.append(_ns(m.header.stamp)), KEEP_ALL)
        listener.create_subscription(Float32MultiArray, COMMAND, commands.append, KEEP_ALL)
        listener.create_subscription(Clock, "/clock", lambda m: clock.append(_ns(m.clock)), KEEP_ALL)
        executor.add_node(listener)
        player = BagPlayer(bag, rate=4.0, clock_hz=200.0, context=context)
        # Both sides must have discovered each other (the listener's time source also listens to /clock).
        _wait(executor, lambda: player.count_subscribers(CAMERA) and player.count_subscribers(COMMAND)
              and player.count_subscribers("/clock") >= 2 and listener.count_publishers(CAMERA))
        spinner = threading.Thread(target=executor.spin)
        spinner.start()
        began = time.monotonic()
        player.play()
        elapsed = time.monotonic() - began
        deadline = time.monotonic() + WAIT_S
        while (len(frames) < len(recorded) or len(commands) < len(recorded)
               or listener.get_clock().now().nanoseconds != bag.end_ns) and time.monotonic() < deadline:
            time.sleep(0.02)
        sim_now = listener.get_clock().now().nanoseconds
        executor.shutdown()
        spinner.join()
        assert frames == recorded  # every frame, in order, with the header stamp it was recorded with
        assert len(commands) == 30 and player.published == 60 and player.passes == 1
        # no sooner than the recorded timing at 4x allows (a busy machine can only make it later); the pacing
        # itself is checked on a virtual clock below
        assert elapsed >= bag.duration_s / 4 * 0.95
        assert clock[0] == bag.start_ns and clock[-1] == bag.end_ns and clock == sorted(clock)
        assert len(clock) > 10  # ticks in between, not only per message
        assert sim_now == bag.end_ns  # use_sim_time: the listener's clock is the bag's


class VirtualTime:
    """Stands in for the ``time`` module in bag_player: monotonic() is virtual, sleep() advances it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0.0
        self.now += seconds


def test_play_paces_messages_by_their_recorded_time_and_ticks_the_clock_between(tiny_bag, monkeypatch):
    """The player's pacing on a virtual clock: each message goes out exactly at its recorded offset / rate,
    /clock ticks at clock_hz between them carrying the bag time of that moment, never ahead of the next
    message, and the pass ends at the bag's end time. On the wall clock this would be as exact as the
    machine is idle."""
    import vla_edge_ros.nodes.bag_player as bag_player

    virtual = VirtualTime()
    monkeypatch.setattr(bag_player, "time", virtual)
    with Bag(tiny_bag) as bag, private_graph() as (context, _):
        player = BagPlayer(bag, rate=4.0, clock_hz=200.0, context=context)
        sent, ticks = [], []
        for topic, publisher in player._topic_publishers.items():
            monkeypatch.setattr(publisher, "publish", lambda data, topic=topic: sent.append((virtual.now, topic)))
        monkeypatch.setattr(player._clock_publisher, "publish",
                            lambda msg: ticks.append((virtual.now, _ns(msg.clock))))
        began = virtual.now
        player.play()
        recorded = [(topic, time_ns) for topic, _, time_ns, _ in bag.raw_messages(player.topics)]
        assert [topic for _, topic in sent] == [topic for topic, _ in recorded] and player.passes == 1
        for (at, _), (_, time_ns) in zip(sent, recorded):
            assert at - began == pytest.approx((time_ns - bag.start_ns) / 1e9 / 4.0, abs=1e-9)
        # the last message at the bag's end, then the linger that lets best-effort subscribers read it
        assert virtual.now - began == pytest.approx(bag.duration_s / 4.0 + LINGER_S, abs=1e-9)
        player.destroy_node()
    assert ticks[0] == (began, bag.start_ns) and ticks[-1][1] == bag.end_ns
    assert [t for _, t in ticks] == sorted(t for _, t in ticks)
    for at, bag_ns in ticks[:-1]:  # bag time runs 4x the (virtual) wall clock, held at the next message
        assert bag_ns == pytest.approx(min(bag.start_ns + (at - began) * 4e9,
                                           min(t for _, t in recorded if t >= bag_ns)), abs=1)
    gaps = np.diff([at for at, _ in ticks[:-1]])
    assert len(ticks) > 45 and np.allclose(gaps, 1 / 200.0, rtol=0, atol=1e-9)  # 200 Hz, none skipped or burst


def test_player_refuses_bad_arguments(tiny_bag):
    with Bag(tiny_bag) as bag, private_graph() as (context, _):
        with pytest.raises(ValueError, match="rate must be positive"):
            BagPlayer(bag, rate=0.0, context=context)
        with pytest.raises(BagError, match="no topic /tf"):
            BagPlayer(bag, ["/tf"], context=context)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_play_command_loops_until_a_signal_and_exits_cleanly(tiny_bag, sig):
    with private_graph() as (context, executor):
        process = _play(tiny_bag, "--loop", "--rate", "3", domain=context.get_domain_id())
        try:
            listener = Node("listener", context=context)
            frames = []
            listener.create_subscription(Image, CAMERA, lambda m: frames.append(_ns(m.header.stamp)), KEEP_ALL)
            executor.add_node(listener)
            _wait(executor, lambda: len(frames) > 45)  # more than the bag holds: it looped
            assert any(later < earlier for earlier, later in zip(frames, frames[1:]))  # the stamps started over
        finally:
            process.send_signal(sig)
            out, err = process.communicate(timeout=WAIT_S)
    assert process.returncode == 0, err[-2000:]
    assert "Traceback" not in err and "playing " in out and "played " in out


def test_a_subscriber_that_joins_late_gets_a_one_frame_bag(one_frame_bag):
    """The player waits for a subscriber on each topic; the listener subscribes only once it has seen the
    player's publishers (so the player was up, and could have published into nothing, before anyone listened)."""
    with Bag(one_frame_bag) as bag:
        (recorded,) = [_ns(m.msg.header.stamp) for m in bag.messages([CAMERA])]
    with private_graph() as (context, executor):
        # --delay as the README says: the player sees the subscription match before the subscriber has matched
        # the player's writer (discovery is asymmetric), and a best-effort frame sent in between is lost
        process = _play(one_frame_bag, "--wait-subscribers", "1", "--wait-timeout", "300", "--delay", "1",
                        domain=context.get_domain_id())
        try:
            listener = Node("listener", context=context)
            executor.add_node(listener)
            _wait(executor, lambda: listener.count_publishers(CAMERA) and listener.count_publishers(COMMAND),
                  timeout_s=60)
            time.sleep(0.5)  # later still
            assert process.poll() is None  # still waiting: nothing was published into the empty graph
            frames, commands = [], []
            listener.create_subscription(Image, CAMERA, lambda m: frames.append(_ns(m.header.stamp)), KEEP_ALL)
            listener.create_subscription(Float32MultiArray, COMMAND, commands.append, KEEP_ALL)
            _wait(executor, lambda: frames and commands, timeout_s=60)
            out, err = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert frames == [recorded] and len(commands) == 1
    assert process.returncode == 0, err[-2000:]
    assert "waiting up to 300 s for 1 subscriber(s) on each of /camera/image_raw, /vla/command" in out
    assert "played 2 messages (passes completed: 1)" in out


def test_waiting_for_subscribers_that_never_come_times_out_clearly(tiny_bag):
    with Bag(tiny_bag) as bag, private_graph() as (context, _):
        player = BagPlayer(bag, rate=4.0, context=context)
        with pytest.raises(TimeoutError, match=r"no start after 0.3 s waiting for 1 subscriber\(s\) on each played "
                                               r"topic: /camera/image_raw has 0, /vla/command has 0"):
            player.play(start=StartWhen(subscribers=1, timeout_s=0.3))
        assert player.published == 0
    with private_graph() as (context, _):
        process = _play(tiny_bag, "--wait-subscribers", "1", "--wait-timeout", "0.3", domain=context.get_domain_id())
        out, err = process.communicate(timeout=60)
    assert process.returncode == 2
    assert err.splitlines() == ["vla-edge play: error: no start after 0.3 s waiting for 1 subscriber(s) on each "
                                "played topic: /camera/image_raw has 0, /vla/command has 0"]


def test_the_start_delay_holds_the_first_message_back(tiny_bag):
    """A lower bound only: load can make playback slower, never faster."""
    with Bag(tiny_bag) as bag, private_graph() as (context, executor):
        listener = Node("listener", context=context)
        listener.create_subscription(Image, CAMERA, lambda m: None, KEEP_ALL)
        listener.create_subscription(Float32MultiArray, COMMAND, lambda m: None, KEEP_ALL)
        executor.add_node(listener)
        player = BagPlayer(bag, rate=4.0, context=context)
        _wait(executor, lambda: not player.missing_subscribers(1))
        began = time.monotonic()
        player.play(start=StartWhen(subscribers=1, delay_s=1.0))
        assert time.monotonic() - began >= 1.0 + bag.duration_s / 4
        assert player.published == 60


@pytest.mark.parametrize("options, message", [
    (["--wait-subscribers", "-1"], "expected an integer >= 0, got -1"),
    (["--delay", "-1"], "the start delay must be >= 0 s, got -1.0"),
    (["--wait-timeout", "0"], "the wait for subscribers needs a positive timeout, got 0.0 s"),
])
def test_bad_start_options_are_one_line_and_exit_2(tiny_bag, capsys, options, message):
    try:
        code = main(["play", str(tiny_bag), *options])
    except SystemExit as exc:  # argparse's own error
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_signal_while_waiting_for_subscribers_exits_cleanly(tiny_bag):
    with private_graph() as (context, _):
        process = _play(tiny_bag, "--wait-subscribers", "1", domain=context.get_domain_id())
        try:
            lines = iter(process.stdout.readline, "")
            assert any(line.startswith("waiting up to") for line in lines)
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=20)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 0, err[-2000:]
    assert "played 0 messages" in out and "Traceback" not in err
