"""End to end over DDS: a camera stream in, commands out, a safe stop when the camera goes away."""

from __future__ import annotations

import pytest

rclpy = pytest.importorskip("rclpy")

from rclpy.node import Node  # noqa: E402
from rclpy.qos import qos_profile_sensor_data  # noqa: E402
from std_msgs.msg import Float32MultiArray  # noqa: E402

from ros_graph import private_graph  # noqa: E402
from vla_edge_ros.config import parse_settings  # noqa: E402
from vla_edge_ros.nodes.bringup import Pipeline  # noqa: E402
from vla_edge_ros.nodes.diagnostics import ERROR  # noqa: E402

pytestmark = pytest.mark.ros


def test_camera_to_commands_and_safe_stop_when_the_camera_stops(tiny_model):
    settings = parse_settings({
        "reasoning": {"ros__parameters": {"model_dir": str(tiny_model), "backend": "numpy",
                                          "kv_capacity_tokens": 256}},
        "camera_subscriber": {"ros__parameters": {"frame_height": 120, "frame_width": 160}},
        "action_publisher": {"ros__parameters": {"action_timeout_ms": 300.0, "control_rate_hz": 50.0,
                                                 "command_type": "float32_multi_array"}},
    }, "test.yaml")
    with private_graph() as (context, _):
        pipeline = Pipeline(settings, context=context, synthetic_camera=True)
        listener = Node("listener", context=context)
        commands: list[list[float]] = []
        listener.create_subscription(Float32MultiArray, "/vla/command", lambda m: commands.append(list(m.data)),
                                     qos_profile_sensor_data)
        pipeline.executor.add_node(listener)
        try:
            for _ in range(30):  # DDS discovery takes a moment; then 30 frames a second flow
                pipeline.run(duration_s=0.5)
                if pipeline.reasoning.actions > 10:
                    break
            assert pipeline.camera.written > 10 and pipeline.reasoning.actions > 10
            assert any(len(c) == 7 and any(v != 0.0 for v in c) for c in commands)

            camera = pipeline.nodes.pop()  # the synthetic camera: the stream stops
            pipeline.executor.remove_node(camera)
            camera.destroy_node()
            commands.clear()
            pipeline.run(duration_s=1.0)
            assert commands and commands[-1] == [0.0] * 7  # safe stop within timeout + one period
            assert pipeline.publisher.report().level == ERROR
        finally:
            pipeline.executor.remove_node(listener)
            listener.destroy_node()
            pipeline.shutdown()


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_vla_edge_run_shuts_down_cleanly_on_a_signal(tiny_model, tmp_path, signal_name):
    import signal
    import subprocess
    import sys
    import time

    import yaml

    config = tmp_path / "robot.yaml"
    config.write_text(yaml.safe_dump({
        "reasoning": {"ros__parameters": {"model_dir": str(tiny_model), "backend": "numpy", "kv_capacity_tokens": 256}},
        "camera_subscriber": {"ros__parameters": {"frame_height": 120, "frame_width": 160}},
    }))
    summary = tmp_path / "summary.json"
    process = subprocess.Popen([sys.executable, "-m", "vla_edge_ros", "run", "--config", str(config), "--duration",
                                "60", "--summary-json", str(summary)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not summary.exists() and time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line or line.startswith("in "):  # the pipeline is up (first status line), or it died
                break
        process.send_signal(getattr(signal, signal_name))
        out, err = process.communicate(timeout=20)
    finally:
        process.kill()
    assert process.returncode == 0, err[-2000:]
    assert "summary:" in out and summary.is_file()
    assert "Traceback" not in err and "terminate called" not in err
