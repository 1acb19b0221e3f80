"""End to end over DDS: a camera stream in, commands out, a safe stop when the camera goes away."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

rclpy = pytest.importorskip("rclpy")

from rclpy.node import Node  # noqa: E402
from rclpy.qos import qos_profile_sensor_data  # noqa: E402
from std_msgs.msg import Float32MultiArray  # noqa: E402

from ros_graph import WAIT_S, leased_domain, private_graph, run_until  # noqa: E402
from vla_edge_ros.config import parse_settings  # noqa: E402
from vla_edge_ros.nodes.bringup import Pipeline  # noqa: E402
from vla_edge_ros.nodes.diagnostics import ERROR  # noqa: E402

pytestmark = pytest.mark.ros


def test_camera_to_commands_and_safe_stop_when_the_camera_stops(tiny_model):
    """Live, on a machine that may be busy: frames flow and become commands, and once the camera is gone the
    robot is told to stop and stays stopped. How soon (one timeout and one control period) is checked on the
    virtual clock: test_driver.py::test_a_camera_that_stops_is_a_safe_stop_within_one_timeout_and_one_period."""
    settings = parse_settings({
        # the longest deadline the schema allows: the gate would (rightly) refuse a 33 ms deadline on a
        # loaded 2-core machine, and the deadline is not what this test is about
        "reasoning": {"ros__parameters": {"model_dir": str(tiny_model), "backend": "numpy",
                                          "kv_capacity_tokens": 256, "deadline_ms": 1000.0}},
        "camera_subscriber": {"ros__parameters": {"frame_height": 120, "frame_width": 160}},
        "action_publisher": {"ros__parameters": {"action_timeout_ms": 300.0, "control_rate_hz": 50.0,
                                                 "command_type": "float32_multi_array"}},
    }, "test.yaml")
    with listening_pipeline(settings) as (pipeline, commands):
        moving = lambda: any(len(c) == 7 and any(v != 0.0 for v in c) for c in commands)  # noqa: E731
        assert run_until(pipeline, lambda: pipeline.reasoning.actions > 10 and moving())
        assert pipeline.camera.written > 10

        camera = pipeline.nodes.pop()  # the synthetic camera: the stream stops
        pipeline.executor.remove_node(camera)
        camera.destroy_node()
        commands.clear()
        stop = [0.0] * 7
        assert run_until(pipeline, lambda: commands.count(stop) >= 3)  # a safe stop, commanded again and again
        first_stop = commands.index(stop)
        assert all(c == stop for c in commands[first_stop:])  # and nothing but stops once it began
        assert pipeline.publisher.report().level == ERROR


@contextmanager
def listening_pipeline(settings) -> Iterator[tuple[Pipeline, list[list[float]]]]:
    """The pipeline with a synthetic camera on a private graph, and every command a listener hears on
    /vla/command (Float32MultiArray) as it arrives."""
    with private_graph() as (context, _):
        pipeline = Pipeline(settings, context=context, synthetic_camera=True)
        listener = Node("listener", context=context)
        commands: list[list[float]] = []
        listener.create_subscription(Float32MultiArray, "/vla/command", lambda m: commands.append(list(m.data)),
                                     qos_profile_sensor_data)
        pipeline.executor.add_node(listener)
        try:
            yield pipeline, commands
        finally:
            pipeline.executor.remove_node(listener)
            listener.destroy_node()
            pipeline.shutdown()



@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_vla_edge_run_shuts_down_cleanly_on_a_signal(tiny_model, tmp_path, signal_name):
    import os
    import signal
    import subprocess
    import sys

    import yaml

    config = tmp_path / "robot.yaml"
    config.write_text(yaml.safe_dump({
        "reasoning": {"ros__parameters": {"model_dir": str(tiny_model), "backend": "numpy", "kv_capacity_tokens": 256}},
        "camera_subscriber": {"ros__parameters": {"frame_height": 120, "frame_width": 160}},
    }))
    summary = tmp_path / "summary.json"
    with leased_domain() as domain:
        process = subprocess.Popen([sys.executable, "-m", "vla_edge_ros", "run", "--config", str(config), "--duration",
                                    "600", "--summary-json", str(summary)], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                                   env={**os.environ, "ROS_DOMAIN_ID": str(domain)})
        try:
            while True:  # until the pipeline is up (its first status line) or it died (end of output)
                line = process.stdout.readline()
                if not line or line.startswith("in "):
                    break
            process.send_signal(getattr(signal, signal_name))
            out, err = process.communicate(timeout=WAIT_S)
        finally:
            process.kill()
    assert process.returncode == 0, err[-2000:]
    assert "summary:" in out and summary.is_file()
    assert "Traceback" not in err and "terminate called" not in err


def test_a_model_whose_output_is_not_finite_never_commands_the_robot(tiny_model, tmp_path):
    """NaN action logits (a corrupt head, loaded with the debugging knob): over DDS, every command is the safe
    stop, and the reasoning node reports the invalid outputs as an error rather than "acting on 100 %"."""
    import numpy as np

    from vla_edge_ros.model.init_model import write_model
    from vla_edge_ros.model.config import load_model_config
    from vla_edge_ros.model.safetensors_io import read_safetensors

    arrays = {name: t.to_float32().copy() for name, t in read_safetensors(tiny_model / "model.safetensors").items()}
    arrays["lm_head.weight"][-256:] = np.nan  # the bins' rows: argmax once read them as bin 0, i.e. -0.996
    corrupt = write_model(tmp_path / "nan-head", load_model_config(tiny_model), arrays, "bfloat16")
    settings = parse_settings({
        "reasoning": {"ros__parameters": {"model_dir": str(corrupt), "backend": "numpy", "kv_capacity_tokens": 256,
                                          "deadline_ms": 1000.0, "allow_nonfinite_weights": True}},
        "camera_subscriber": {"ros__parameters": {"frame_height": 120, "frame_width": 160}},
        "action_publisher": {"ros__parameters": {"control_rate_hz": 50.0, "command_type": "float32_multi_array"}},
    }, "test.yaml")
    with listening_pipeline(settings) as (pipeline, commands):
        assert run_until(pipeline, lambda: pipeline.reasoning.invalid_outputs >= 5 and len(commands) >= 10)
        assert commands and all(v == 0.0 for c in commands for v in c)  # stops only (empty: no action yet)
        assert pipeline.reasoning.actions == 0
        report = pipeline.reasoning.report()
        assert report.level == ERROR and "not finite" in report.message and "acting on" not in report.message
        assert pipeline.reasoning.figures()["invalid_outputs"] >= 5


def test_a_bad_state_or_a_silent_camera_never_reaches_the_command_topic(tmp_path):
    """Two cameras and a joint state over DDS, into a model that reads both: commands flow while every part is
    good; NaN states, then a wrist camera gone silent, each give only safe stops on /vla/command (never a
    non-finite value, never an action from a made-up state or a missing camera), counted and named on the camera
    node's diagnostics; good states again bring the actions back."""
    import math

    import numpy as np
    from sensor_msgs.msg import Image, JointState
    from std_msgs.msg import Header

    from vla_edge_ros.model.init_model import preset, write_random_model
    from vla_edge_ros.nodes.synthetic_camera import image_message

    model = write_random_model(tmp_path / "m", preset("tiny", layers=2, cameras=2, state_dim=2), seed=0)
    settings = parse_settings({
        "reasoning": {"ros__parameters": {"model_dir": str(model), "backend": "numpy", "kv_capacity_tokens": 256,
                                          "deadline_ms": 1000.0}},
        "camera_subscriber": {"ros__parameters": {
            "frame_height": 120, "frame_width": 160, "extra_image_topics": ["wrist/image_raw"], "sync_slop_ms": 40.0,
            "state_topic": "joint_states", "state_joint_names": ["shoulder", "elbow"], "state_max_age_ms": 200.0}},
        "action_publisher": {"ros__parameters": {"action_timeout_ms": 300.0, "control_rate_hz": 50.0,
                                                 "command_type": "float32_multi_array"}},
    }, "test.yaml")
    with listening_pipeline(settings) as (pipeline, commands):
        robot = Node("robot", context=pipeline.executor.context)
        joints = [0.1, -0.3]
        wrist_frame = np.zeros((60, 80, 3), np.uint8)
        wrist = robot.create_publisher(Image, "wrist/image_raw", qos_profile_sensor_data)
        states = robot.create_publisher(JointState, "joint_states", 10)

        def publish() -> None:
            stamp = robot.get_clock().now().to_msg()
            states.publish(JointState(header=Header(stamp=stamp), name=["shoulder", "elbow"], position=list(joints)))
            if wrist_on[0]:
                wrist.publish(image_message(wrist_frame, Header(stamp=stamp)))

        wrist_on = [True]
        robot.create_timer(1 / 30, publish)
        pipeline.executor.add_node(robot)
        camera, stop = pipeline.camera, [0.0] * 7

        def stops_only() -> bool:
            if commands.count(stop) < 3:
                return False
            first = commands.index(stop)
            return all(c == stop for c in commands[first:])

        def acting() -> bool:
            return any(len(c) == 7 and any(v != 0.0 for v in c) for c in commands)

        def next_phase() -> None:
            assert all(math.isfinite(v) for c in commands for v in c)  # whatever the phase, nothing non-finite
            commands.clear()

        try:
            assert run_until(pipeline, lambda: pipeline.reasoning.actions > 3 and acting())
            joints[1] = math.nan  # the state goes bad: refused at the node, so no observation is made
            next_phase()
            assert run_until(pipeline, lambda: stops_only() and camera.state_dropped["not_finite"] > 5)
            assert "dropping state messages (totals: not_finite:" in camera.report().message
            joints[1] = -0.3
            next_phase()
            assert run_until(pipeline, acting)  # good states again: acting again
            wrist_on[0] = False  # the wrist camera goes silent: no observation without it
            next_phase()
            assert run_until(pipeline, lambda: stops_only() and camera.assembler.unsynced[0] > 5)
            next_phase()
        finally:
            pipeline.executor.remove_node(robot)
            robot.destroy_node()
