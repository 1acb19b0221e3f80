"""A bag played with /clock drives the live pipeline in sim time: its commands carry bag time."""

from __future__ import annotations

import threading

import pytest

rclpy = pytest.importorskip("rclpy")

from rclpy.node import Node  # noqa: E402
from trajectory_msgs.msg import JointTrajectory  # noqa: E402

from ros_graph import private_graph  # noqa: E402
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
        "reasoning": {"ros__parameters": {"model_dir": str(tiny_model), "backend": "numpy",
                                          "kv_capacity_tokens": 128}},
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
        try:
            playing.start()
            pipeline.run(duration_s=bag.duration_s + 1.0)
        finally:
            playing.join(timeout=30)
            listener.destroy_node()
            player.destroy_node()
            pipeline.shutdown()
        fresh = [s for s in stamps if s > 0]  # before the first /clock message sim time reads 0
        assert pipeline.reasoning.actions > 0 and fresh
        assert all(bag.start_ns <= s <= bag.end_ns + 10**9 for s in fresh)  # 2025 bag time, not the wall clock
