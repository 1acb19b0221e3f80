"""A bag played with /clock drives the live pipeline in sim time: its commands carry bag time."""

from __future__ import annotations

import threading
import time

import pytest

rclpy = pytest.importorskip("rclpy")

from rclpy.node import Node  # noqa: E402
from trajectory_msgs.msg import JointTrajectory  # noqa: E402

from ros_graph import WAIT_S, private_graph  # noqa: E402
from vla_edge_ros.bags import Bag  # noqa: E402
from vla_edge_ros.bags.scenarios import BagSpec, write_bag  # noqa: E402
from vla_edge_ros.config import parse_settings  # noqa: E402
from vla_edge_ros.nodes.bag_player import BagPlayer  # noqa: E402
from vla_edge_ros.nodes.bringup import Pipeline  # noqa: E402

pytestmark = pytest.mark.ros


def test_commands_are_stamped_in_the_bag_time_of_a_played_bag(tiny_model, tmp_path):
    path = write_bag(BagSpec(seconds=2.0, size=(64, 48)), tmp_path / "moving.mcap")
    settings = parse_settings({
        "camera_subscriber": {"ros__parameters": {"frame_height": 48, "frame_width": 64}},
        # the longest deadline the schema allows: on a loaded 2-core machine the gate would refuse every cycle
        # of a 33 ms deadline, and the deadline is not what this test is about
        "reasoning": {"ros__parameters": {"model_dir": str(tiny_model), "backend": "numpy",
                                          "kv_capacity_tokens": 128, "deadline_ms": 1000.0}},
        "action_publisher": {"ros__parameters": {"command_type": "joint_trajectory"}}}, "test.yaml")
    with Bag(path) as bag, private_graph() as (context, _):
        pipeline = Pipeline(settings, context=context, use_sim_time=True)
        stamps: list[int] = []
        listener = Node("listener", context=context)
        listener.create_subscription(JointTrajectory, "/vla/command",
                                     lambda m: stamps.append(m.header.stamp.sec * 10**9 + m.header.stamp.nanosec), 10)
        pipeline.executor.add_node(listener)
        player = BagPlayer(bag, ["/camera/image_raw"], rate=1.0, clock_hz=100.0, context=context)
        playing = threading.Thread(target=player.play)
        fresh = lambda: [s for s in stamps if s > 0]  # noqa: E731 (before the first /clock message sim time reads 0)
        try:
            # Frames played before the pipeline has discovered the player would be lost: wait for discovery
            # (the camera subscriber, and /clock for the three pipeline nodes' time sources).
            discovered = lambda: (player.count_subscribers("/camera/image_raw") >= 1  # noqa: E731
                                  and player.count_subscribers("/clock") >= 3
                                  and listener.count_publishers("/vla/command") >= 1)
            deadline = time.monotonic() + WAIT_S
            while not discovered():
                assert time.monotonic() < deadline, "the pipeline never discovered the bag player"
                pipeline.executor.spin_once(timeout_sec=0.05)
            playing.start()
            deadline = time.monotonic() + WAIT_S
            while playing.is_alive() or not (pipeline.reasoning.actions > 0 and fresh()):
                assert time.monotonic() < deadline, "no command stamped in bag time"
                pipeline.run(duration_s=0.1)
        finally:
            if playing.ident is not None:  # started
                playing.join(timeout=WAIT_S)
            listener.destroy_node()
            player.destroy_node()
            pipeline.shutdown()
        assert pipeline.reasoning.actions > 0 and fresh()
        assert all(bag.start_ns <= s <= bag.end_ns for s in fresh())  # 2025 bag time, not the wall clock
