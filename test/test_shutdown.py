"""Stopping leaves the robot stopped: an explicit stop command on every way down, and clean exits on signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

rclpy = pytest.importorskip("rclpy")

from geometry_msgs.msg import Twist  # noqa: E402
from rclpy.context import Context  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.node import Node  # noqa: E402

from ros_graph import private_graph  # noqa: E402
from vla_edge_ros.config import parse_settings  # noqa: E402
from vla_edge_ros.nodes.bringup import Pipeline  # noqa: E402

pytestmark = pytest.mark.ros

TWIST_ALL = [0, 1, 2, 3, 4, 5]  # the tiny model has 7 action dimensions: every twist field gets one


def _moving(message: Twist) -> bool:
    return any(v != 0.0 for v in (message.linear.x, message.linear.y, message.linear.z, message.angular.x,
                                  message.angular.y, message.angular.z))


def _config(tiny_model: Path) -> dict:
    # The longest deadline: on a loaded machine a 33 ms gate refuses every cycle and the robot, rightly, never
    # moves; these tests are about the stop after motion, not about meeting a deadline.
    return {"reasoning": {"ros__parameters": {"model_dir": str(tiny_model), "backend": "numpy",
                                              "kv_capacity_tokens": 128, "deadline_ms": 1000.0}},
            "camera_subscriber": {"ros__parameters": {"frame_height": 48, "frame_width": 64}},
            "action_publisher": {"ros__parameters": {"twist_dims": TWIST_ALL, "action_timeout_ms": 60000.0}}}


def test_shutdown_sends_one_explicit_stop_after_the_last_command(tiny_model):
    settings = parse_settings(_config(tiny_model), "test.yaml")
    with private_graph() as (context, _):
        pipeline = Pipeline(settings, context=context, synthetic_camera=True, camera_rate_hz=30.0)
        heard: list[Twist] = []
        listener = Node("listener", context=context)
        listener.create_subscription(Twist, "/vla/command", heard.append, 10)
        listening = SingleThreadedExecutor(context=context)
        listening.add_node(listener)
        try:
            deadline = time.monotonic() + 120
            while not any(_moving(m) for m in heard) and time.monotonic() < deadline:
                pipeline.run(duration_s=0.2)
                listening.spin_once(timeout_sec=0.05)
            assert any(_moving(m) for m in heard), "no command ever moved the robot"
        finally:
            pipeline.shutdown()
        deadline = time.monotonic() + 10
        while (not heard or _moving(heard[-1])) and time.monotonic() < deadline:
            listening.spin_once(timeout_sec=0.1)
        assert not _moving(heard[-1])  # the last word on the topic is a stop
        assert pipeline.publisher.figures()["shutdown_stops"] == 1
        listening.shutdown()
        listener.destroy_node()


def _caught(pid: int, number: int) -> bool:
    """Whether process ``pid`` has a handler for signal ``number`` (Linux: SigCgt in /proc/PID/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(mask >> (number - 1) & 1)


def _start(config: Path, cwd: Path, domain: int) -> subprocess.Popen:
    env = {**os.environ, "ROS_DOMAIN_ID": str(domain)}
    process = subprocess.Popen([sys.executable, "-m", "vla_edge_ros", "run", "--config", str(config), "--duration",
                                "120"], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while process.poll() is None and not _caught(process.pid, signal.SIGTERM) and time.monotonic() < deadline:
        time.sleep(0.002)
    return process


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to know when the handler is in place")
@pytest.mark.parametrize("delay_s", [0.0, 0.3, 1.0, 2.0, 4.0])
def test_a_signal_during_start_up_exits_2_with_one_line(tiny_model, tmp_path, delay_s):
    """SIGTERM at several moments of start-up (importing, loading the model, creating the nodes, or
    already running): one line and exit 2 while starting, a clean exit 0 with its summary once running;
    never a traceback."""
    config = tmp_path / "robot.yaml"
    config.write_text(yaml.safe_dump(_config(tiny_model)))
    process = _start(config, tmp_path, 150 + os.getpid() % 50)
    time.sleep(delay_s)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert "Traceback" not in err, err[-3000:]
    if delay_s == 0.0:  # the handler has just been installed: the package is still being imported
        assert process.returncode == 2, err[-3000:]
    if process.returncode == 2:
        lines = [line for line in err.splitlines() if "interrupted" in line]
        assert lines == ["vla-edge: interrupted by SIGTERM during start-up"], err[-3000:]
        assert "summary:" not in out
    else:
        assert process.returncode == 0 and "summary:" in out, (process.returncode, err[-3000:])


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_signal_while_running_leaves_a_stop_on_the_command_topic(tiny_model, tmp_path, signal_name):
    config = tmp_path / "robot.yaml"
    config.write_text(yaml.safe_dump(_config(tiny_model)))
    domain = 180 + os.getpid() % 40 + (signal_name == "SIGINT")
    context = Context()
    rclpy.init(context=context, domain_id=domain)
    heard: list[Twist] = []
    listener = Node("listener", context=context)
    listener.create_subscription(Twist, "/vla/command", heard.append, 10)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(listener)
    process = _start(config, tmp_path, domain)
    try:
        deadline = time.monotonic() + 120
        while process.poll() is None and not any(_moving(m) for m in heard) and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.05)
        assert any(_moving(m) for m in heard), process.stderr.read()[-3000:] if process.poll() is not None else ""
        process.send_signal(getattr(signal, signal_name))
        while process.poll() is None and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.05)
        end = time.monotonic() + 2  # what was sent just before the exit is still arriving
        while time.monotonic() < end:
            executor.spin_once(timeout_sec=0.05)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
        executor.shutdown()
        listener.destroy_node()
        rclpy.shutdown(context=context)
    assert process.returncode == 0, err[-3000:]
    assert not _moving(heard[-1]), "the last command on the topic moves the robot"
    assert '"shutdown_stops": 1' in out
