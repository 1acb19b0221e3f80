"""The simulated robot closes the loop over DDS: the shipped model sees the world and drives it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

rclpy = pytest.importorskip("rclpy")

from ros_graph import WAIT_S, private_graph  # noqa: E402
from vla_edge_ros.config import parse_settings  # noqa: E402
from vla_edge_ros.nodes.bringup import Pipeline  # noqa: E402
from vla_edge_ros.nodes.sim_world import SimWorldNode  # noqa: E402

pytestmark = pytest.mark.ros
SHIPPED_MODEL = Path(__file__).resolve().parent.parent / "models" / "sim"


def test_the_shipped_model_drives_the_simulated_robot(tmp_path):
    settings = parse_settings({
        # the longest deadline the schema allows: closing the loop is under test here, not the deadline, which
        # the gate would (rightly) refuse cycles for on a loaded machine
        "reasoning": {"ros__parameters": {"model_dir": str(SHIPPED_MODEL), "backend": "numpy", "deadline_ms": 1000.0}},
        "camera_subscriber": {"ros__parameters": {"frame_height": 96, "frame_width": 96}},
        "action_publisher": {"ros__parameters": {"command_type": "twist", "twist_dims": [0, 1, -1, -1, -1, -1]}},
    }, "test.yaml")
    with private_graph() as (context, _):
        pipeline = Pipeline(settings, context=context, sim_task="reach")
        try:
            def moved() -> bool:
                return bool(pipeline.sim.episodes or pipeline.sim.env.path_length > 0.2)

            deadline = time.monotonic() + WAIT_S
            while not (moved() and pipeline.reasoning.actions > 10 and pipeline.sim.commands > 10):
                assert time.monotonic() < deadline, "the robot did not move on the model's commands"
                pipeline.run(duration_s=0.5)
            assert pipeline.camera.written > 10 and pipeline.reasoning.actions > 10
            assert pipeline.sim.commands > 10  # the world heard the publisher's twists
            assert moved()  # and the robot moved on them
        finally:
            pipeline.shutdown()


def test_the_simulated_robot_refuses_commands_that_are_not_velocities():
    with private_graph() as (context, _):
        with pytest.raises(ValueError, match="velocity commands"):
            SimWorldNode("reach", image_topic="/camera/image_raw", command_topic="/vla/command",
                         command_type="joint_trajectory", context=context)


def test_a_command_without_two_values_is_dropped_and_counted():
    from std_msgs.msg import Float32MultiArray

    with private_graph() as (context, _):
        node = SimWorldNode("reach", image_topic="/camera/image_raw", command_topic="/vla/command",
                            command_type="float32_multi_array", context=context)
        try:
            node._take_array(Float32MultiArray(data=[0.5]))
            assert node.malformed_commands == 1 and node.commands == 0
            node._take_array(Float32MultiArray(data=[0.5, -0.5, 9.0]))
            assert node.commands == 1 and node._command.tolist() == [0.5, -0.5]
        finally:
            node.destroy_node()
