"""The simulated robot closes the loop over DDS: the shipped model sees the world and drives it."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")

from ros_graph import WAIT_S, private_graph  # noqa: E402
from vla_edge_ros.config import parse_settings  # noqa: E402
from vla_edge_ros.nodes.bringup import Pipeline  # noqa: E402
from vla_edge_ros.nodes.sim_world import SimWorldNode  # noqa: E402
from vla_edge_ros.worlds.sim.world import CueReachEnv  # noqa: E402

pytestmark = pytest.mark.ros
SHIPPED_MODEL = Path(__file__).resolve().parent.parent / "models" / "sim"


def _shipped_settings():
    return parse_settings({
        # the longest deadline the schema allows: closing the loop is under test here, not the deadline, which
        # the gate would (rightly) refuse cycles for on a loaded machine
        "reasoning": {"ros__parameters": {"model_dir": str(SHIPPED_MODEL), "backend": "numpy", "deadline_ms": 1000.0}},
        "camera_subscriber": {"ros__parameters": {"frame_height": 96, "frame_width": 96}},
        "action_publisher": {"ros__parameters": {"command_type": "twist", "twist_dims": [0, 1, -1, -1, -1, -1]}},
    }, "test.yaml")


def test_the_shipped_model_drives_the_simulated_robot(tmp_path):
    with private_graph() as (context, _):
        pipeline = Pipeline(_shipped_settings(), context=context, sim_task="reach")
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


def test_each_new_episode_is_announced_and_starts_the_reasoning_nodes_memory_afresh():
    """Before each new layout the world calls ``~/reset_episode`` and holds the layout back until the answer, so
    the reasoning node starts a new episode (its memory from the prompt, the slot's chunks withdrawn) as evaluate
    starts one; none goes unannounced."""
    with private_graph() as (context, _):
        pipeline = Pipeline(_shipped_settings(), context=context, sim_task="reach")
        try:
            sim, reasoning = pipeline.sim, pipeline.reasoning
            started = reasoning.episodes
            deadline = time.monotonic() + 2 * WAIT_S
            while sim.episodes < 2:
                assert time.monotonic() < deadline, f"episodes do not end: {sim.status()}"
                pipeline.run(duration_s=0.2)
            assert sim.unannounced == 0 and sim.summary()["unannounced_episodes"] == 0
            assert reasoning.episodes - started >= sim.episodes - 1  # each announced one applied by now, or next
            assert pipeline.slot.episode >= 1
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


def test_the_simulated_robot_publishes_its_odometry_stamped_as_its_frame():
    """nav_msgs/Odometry on the relative odom topic: frame odom, child base_link, the world's odometry, and the
    header stamp of the camera frame seen in that state."""
    from nav_msgs.msg import Odometry
    from sensor_msgs.msg import Image

    from vla_edge_ros.runtime.robot_state import OdometryReader

    with private_graph() as (context, executor):
        sim = SimWorldNode("reach", image_topic="camera/image_raw", command_topic="vla/command", command_type="twist",
                           instruction_topic="vla/instruction", odometry_topic="odom", context=context)
        listener = rclpy.create_node("listener", context=context)
        odometry, images = [], []
        qos = rclpy.qos.qos_profile_sensor_data
        listener.create_subscription(Odometry, "/odom", odometry.append, qos)
        listener.create_subscription(Image, "/camera/image_raw", images.append, qos)
        executor.add_node(sim)
        executor.add_node(listener)
        try:
            deadline = time.monotonic() + WAIT_S
            while not {(m.header.stamp.sec, m.header.stamp.nanosec) for m in odometry} & {
                    (m.header.stamp.sec, m.header.stamp.nanosec) for m in images}:
                assert time.monotonic() < deadline, "no odometry with a frame's stamp"
                executor.spin_once(timeout_sec=0.05)
            msg = odometry[-1]
            assert (msg.header.frame_id, msg.child_frame_id) == ("odom", "base_link")
            # no command: the robot stays where it started, still
            assert OdometryReader().vector(msg).tolist() == pytest.approx([*sim.env.start, 0.0, 0.0, 0.0, 0.0])
            sim.env.step(np.array([1.0, -0.5]))  # moving: position and velocity as the world has them
            moved = sim.odometry_message(msg.header.stamp)
            assert OdometryReader().vector(moved).tolist() == pytest.approx(sim.env.odometry().tolist(), abs=1e-6)
            assert moved.twist.twist.linear.x > 0 > moved.twist.twist.linear.y
        finally:
            executor.remove_node(sim)
            executor.remove_node(listener)
            sim.destroy_node()
            listener.destroy_node()


def test_a_checkpoint_that_reads_a_state_gets_the_robot_s_odometry_unasked(tmp_path):
    """No state_topic or state_type in the configuration: the reasoning side subscribes to the simulated robot's
    odometry and every frame it writes carries a state."""
    from vla_edge_ros.model.init_model import preset, write_random_model

    model = write_random_model(tmp_path / "odom", preset("tiny", state_dim=6), seed=0)
    settings = parse_settings({
        "reasoning": {"ros__parameters": {"model_dir": str(model), "backend": "numpy", "deadline_ms": 1000.0}},
        "camera_subscriber": {"ros__parameters": {"frame_height": 96, "frame_width": 96}}}, "test.yaml")
    with private_graph() as (context, _):
        pipeline = Pipeline(settings, context=context, sim_task="reach")
        try:
            deadline = time.monotonic() + WAIT_S
            while pipeline.reasoning.actions < 3:
                assert time.monotonic() < deadline, "no action from a state-reading model on the simulated robot"
                pipeline.run(duration_s=0.2)
            camera = pipeline.camera
            assert camera.state_topic == "/odom" and camera.states.received > 0
            assert camera.written > 0 and pipeline.buffer.state_dim == 6
        finally:
            pipeline.shutdown()
    four = write_random_model(tmp_path / "four", preset("tiny", state_dim=4), seed=0)
    with private_graph() as (context, _):
        with pytest.raises(ValueError, match="reads a robot state of 4 values"):
            Pipeline(settings.replace("reasoning", {"model_dir": str(four)}), context=context, sim_task="reach")


def test_lang_reach_words_each_episode_with_the_template_its_seed_draws():
    from vla_edge_ros.nodes.sim_world import INSTRUCTION
    from vla_edge_ros.tools.lang_reach import instruction_of

    templates = ("drive to the {color} disc", "{color} one, please", "Head for the {color} marker.")
    with private_graph() as (context, _):
        default = SimWorldNode("lang-reach", image_topic="camera/image_raw", command_topic="vla/command",
                               command_type="twist", instruction_topic="vla/instruction", context=context)
        worded = SimWorldNode("lang-reach", image_topic="camera/image_raw", command_topic="vla/command",
                              command_type="twist", instruction_topic="vla/instruction", instructions=templates,
                              seed=7, context=context)
        try:
            assert default.instruction == INSTRUCTION.format(color=default.env.goal_colour)  # today's phrasing
            assert worded.instruction == instruction_of(templates, worded.env, 7)
            told = set()
            for seed in range(7, 17):  # the next episodes: the next seeds, each its own draw
                worded.seed, worded.env = seed, CueReachEnv(worded.spec, seed)
                worded._new_instruction()
                assert worded.instruction == instruction_of(templates, worded.env, seed)
                told.add(next(t for t in templates if worded.instruction == t.format(color=worded.env.goal_colour)))
            assert len(told) > 1
        finally:
            default.destroy_node()
            worded.destroy_node()


def test_in_chase_the_simulated_robot_s_frames_show_the_goal_moving():
    """The world node steps chase like any task: each camera period the goal slides on, and the frame shows it."""
    from sensor_msgs.msg import Image

    with private_graph() as (context, executor):
        sim = SimWorldNode("chase", image_topic="camera/image_raw", command_topic="vla/command", command_type="twist",
                           instruction_topic="vla/instruction", context=context)
        listener = rclpy.create_node("listener", context=context)
        images = []
        listener.create_subscription(Image, "/camera/image_raw", images.append, rclpy.qos.qos_profile_sensor_data)
        executor.add_node(sim)
        executor.add_node(listener)
        try:
            start = sim.env.layout[sim.env.goal].copy()
            deadline = time.monotonic() + WAIT_S
            while len(images) < 3:
                assert time.monotonic() < deadline, "no frames from the chase world"
                executor.spin_once(timeout_sec=0.05)
            moved = sim.env.targets[sim.env.goal]
            assert sim.env.time_s > 0 and not np.array_equal(moved, start)
            assert np.array_equal(moved, sim.env.goal_position(round(sim.env.time_s * sim.spec.rate_hz)))
        finally:
            executor.remove_node(sim)
            executor.remove_node(listener)
            sim.destroy_node()
            listener.destroy_node()
