"""Two robots in two namespaces on one graph: each hears its own camera and commands only its own base."""

from __future__ import annotations

import time

import pytest

rclpy = pytest.importorskip("rclpy")

from geometry_msgs.msg import Twist  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.node import Node  # noqa: E402

from ros_graph import private_graph  # noqa: E402
from vla_edge_ros.config import parse_settings  # noqa: E402
from vla_edge_ros.nodes.bringup import Pipeline  # noqa: E402

pytestmark = pytest.mark.ros


def test_two_bringups_in_two_namespaces_run_side_by_side_without_crosstalk(tiny_model):
    # The longest deadline the schema allows: on a busy machine the tiny model's cycle outgrows 33 ms and the
    # gate (rightly) refuses every frame; what is under test is where the topics go, not the deadline.
    settings = parse_settings({
        "reasoning": {"ros__parameters": {"model_dir": str(tiny_model), "backend": "numpy", "kv_capacity_tokens": 128,
                                          "deadline_ms": 1000.0}},
        "camera_subscriber": {"ros__parameters": {"frame_height": 48, "frame_width": 64}},
        "action_publisher": {"ros__parameters": {"twist_dims": [0, 1, 2, 3, 4, 5]}}}, "robots.yaml")
    with private_graph() as (context, _):
        robots = {name: Pipeline(settings, context=context, namespace=name, synthetic_camera=True,
                                 camera_rate_hz=rate) for name, rate in (("robot1", 20.0), ("robot2", 10.0))}
        listener = Node("listener", context=context)
        heard = {name: [] for name in robots}
        for name in robots:
            listener.create_subscription(Twist, f"/{name}/vla/command", heard[name].append, 10)
        listening = SingleThreadedExecutor(context=context)
        listening.add_node(listener)
        try:
            deadline = time.monotonic() + 120
            while not all(p.reasoning.actions >= 3 and heard[n] for n, p in robots.items()) \
                    and time.monotonic() < deadline:
                for pipeline in robots.values():
                    pipeline.run(duration_s=0.1)
                listening.spin_once(timeout_sec=0.01)
            for name, pipeline in robots.items():
                camera = pipeline.nodes[3]  # the robot's own synthetic camera
                assert pipeline.camera.topic == f"/{name}/camera/image_raw"
                assert pipeline.publisher.figures()["published"] > 0 and heard[name]
                # each subscriber heard its own camera and nothing else: never more than that camera sent
                assert 0 < pipeline.camera.received <= camera.published
                assert pipeline.reasoning.actions >= 3
            topics = {topic for topic, _ in listener.get_topic_names_and_types()}
            assert {"/robot1/vla/command", "/robot2/vla/command"} <= topics and "/vla/command" not in topics
        finally:
            for pipeline in robots.values():
                pipeline.shutdown()
            listening.shutdown()
            listener.destroy_node()
