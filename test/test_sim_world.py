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
                         command_type="joint_trajectory", instruction_topic="/vla/instruction", context=context)


def test_a_command_without_two_values_is_dropped_and_counted():
    from std_msgs.msg import Float32MultiArray

    with private_graph() as (context, _):
        node = SimWorldNode("reach", image_topic="/camera/image_raw", command_topic="/vla/command",
                            command_type="float32_multi_array", instruction_topic="/vla/instruction",
                            context=context)
        try:
            node._take_array(Float32MultiArray(data=[0.5]))
            assert node.malformed_commands == 1 and node.commands == 0
            node._take_array(Float32MultiArray(data=[0.5, -0.5, 9.0]))
            assert node.commands == 1 and node._command.tolist() == [0.5, -0.5]
        finally:
            node.destroy_node()


def test_in_lang_reach_the_world_tells_the_robot_each_episode_s_goal_in_words(tmp_path):
    """The instruction names the goal's colour, reaches the reasoning node once it listens, and becomes the
    prompt (a model with a tokenizer): over DDS, as an operator's would."""
    from vla_edge_ros.model.init_model import preset, write_random_model
    from vla_edge_ros.model.instruction import InstructionTokenizer
    from vla_edge_ros.model.tokenizer_files import write_tokenizer
    from vla_edge_ros.nodes.sim_world import INSTRUCTION
    from vla_edge_ros.worlds.sim.render import COLOUR_NAMES

    model = write_tokenizer(write_random_model(tmp_path / "tiny", preset("tiny"), seed=0),
                            [INSTRUCTION.format(color=c) for c in COLOUR_NAMES] + ["user", "assistant"], 2048)
    settings = parse_settings({
        "reasoning": {"ros__parameters": {"model_dir": str(model), "backend": "numpy", "kv_capacity_tokens": 256,
                                          "deadline_ms": 1000.0}},
        "camera_subscriber": {"ros__parameters": {"frame_height": 96, "frame_width": 96}}}, "test.yaml")
    with private_graph() as (context, _):
        pipeline = Pipeline(settings, context=context, sim_task="lang-reach")
        try:
            deadline = time.monotonic() + WAIT_S
            desk = pipeline.reasoning.instructions.desk
            while desk.applied_count < 1 and time.monotonic() < deadline:
                pipeline.run(duration_s=0.1)
            told = pipeline.sim.instruction
            assert told == INSTRUCTION.format(color=pipeline.sim.env.goal_colour) and desk.current == told
            expected = InstructionTokenizer.load(model, 2048).prompt_ids(told, 64)
            assert pipeline.reasoning.engine.prompt_ids.tolist() == expected.tolist()
        finally:
            pipeline.shutdown()
