"""The package as its users get it: commands run from any directory with no --config, from the checkout and
from a colcon-style install prefix, and the launch file brings the nodes up from that prefix (and ends
when bringup cannot start)."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_MISSING = next((name for name in ("launch", "launch_ros", "ament_index_python")
                       if importlib.util.find_spec(name) is None), None)
needs_launch = pytest.mark.skipif(LAUNCH_MISSING is not None, reason=(
    f"{LAUNCH_MISSING} is not installed: the launch libraries are not on the package index; .ci/run installs "
    "them from ../shared/wheels/ros2-launch when that folder exists"))


def vla_edge(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vla_edge_ros", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def bag(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bag") / "cue.mcap"
    done = vla_edge("make-bag", "--scenario", "cue-recall", "--out", str(out), "--seconds", "2", cwd=out.parent)
    assert done.returncode == 0, done.stderr
    return out


def test_replay_evaluate_and_run_need_no_config_and_no_particular_directory(tmp_path, bag):
    """The defaults are config/default.yaml's, and models/sim is found in the package share, wherever the
    command starts."""
    replay = vla_edge("replay", str(bag), "--policy", "fifo", "--cost", "fixed:encode=8ms,decode=1ms", "--out", "r",
                      cwd=tmp_path)
    assert replay.returncode == 0, replay.stderr
    assert (tmp_path / "r" / "decisions_fifo.txt").is_file()
    evaluate = vla_edge("evaluate", "--policy", "fifo", "--budgets", "4", "--episodes", "1", "--time-limit-s", "2",
                        "--cost", "fixed:encode=8ms,decode=1ms", "--out", "e", cwd=tmp_path)
    assert evaluate.returncode == 0, evaluate.stderr
    assert (tmp_path / "e" / "evaluate.json").is_file()
    run = vla_edge("run", "--duration", "2", "--sim", "reach", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"vla-edge run: {ROOT / 'models' / 'sim'} on numpy" in run.stdout and "summary:" in run.stdout


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> dict[str, str]:
    """A colcon-style install (``setup.py install --prefix``, as colcon's ament_python build does) and the
    environment a sourced workspace gives: the prefix's site-packages first, AMENT_PREFIX_PATH naming it."""
    root = tmp_path_factory.mktemp("install")
    done = subprocess.run([sys.executable, "setup.py", "-q", "build", "--build-base", str(root / "build"), "install",
                           "--prefix", str(root / "prefix"), "--single-version-externally-managed", "--record",
                           str(root / "record.txt")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    site = Path(sysconfig.get_path("purelib", vars={"base": str(root / "prefix")}))
    assert (site / "vla_edge_ros" / "__init__.py").is_file()
    return {**os.environ, "PYTHONPATH": str(site), "PYTHONSAFEPATH": "1", "ROS_DOMAIN_ID": str(100 + os.getpid() % 100),
            "AMENT_PREFIX_PATH": os.pathsep.join([str(root / "prefix"), sys.prefix]), "prefix": str(root / "prefix")}


def test_an_installed_package_runs_from_its_prefix_and_finds_its_share(prefix, tmp_path, bag):
    share = Path(prefix["prefix"]) / "share" / "vla_edge_ros"
    located = subprocess.run([sys.executable, "-c", "import vla_edge_ros.config as c; print(c.__file__); "
                              "print(c.package_share())"], cwd=tmp_path, env=prefix, capture_output=True, text=True)
    module, found = located.stdout.split()
    assert module.startswith(prefix["prefix"]) and Path(found) == share  # the installed copy, not the checkout
    plan = vla_edge("plan", "--config", str(_robot_config(tmp_path)), cwd=tmp_path, env=prefix)
    assert plan.returncode == 0, plan.stderr
    assert f"model      {share / 'models' / 'sim'}" in plan.stdout
    replay = vla_edge("replay", str(bag), "--policy", "dms", "--cost", "fixed:encode=8ms,decode=1ms", "--out", "r",
                      cwd=tmp_path, env=prefix)
    assert replay.returncode == 0, replay.stderr


def _launch(prefix: dict[str, str], cwd: Path, *arguments: str) -> subprocess.Popen:
    """``vla-edge launch ARGS`` from the prefix: what README's ROS section tells a user to run, in a process
    group of its own, as a terminal's foreground job is (``os.killpg`` is that terminal's Ctrl-C)."""
    return subprocess.Popen([str(Path(prefix["prefix"]) / "lib" / "vla_edge_ros" / "vla-edge"), "launch", *arguments],
                            cwd=cwd, env=prefix, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


class Output:
    """A child's merged output, read on a thread so that waiting on the child never blocks on a full pipe."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=lambda: self.lines.extend(iter(process.stdout.readline, "")),
                                        daemon=True)
        self._thread.start()

    def text(self) -> str:
        return "".join(self.lines)

    def pid_of(self, name: str) -> int | None:
        found = re.search(rf"\[{name}-\d+\]: process started with pid \[(\d+)\]", self.text())
        return int(found.group(1)) if found else None


@pytest.fixture
def graph(prefix):
    """A listener on the launch's DDS domain, with an executor to spin it."""
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node

    context = Context()
    rclpy.init(context=context, domain_id=int(prefix["ROS_DOMAIN_ID"]))
    node = Node("listener", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    yield node, executor
    executor.shutdown()
    node.destroy_node()
    rclpy.shutdown(context=context)


def _spin_until(executor, condition, timeout_s: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        executor.spin_once(timeout_sec=0.1)
    return condition()


@pytest.mark.ros
@needs_launch
def test_the_launch_file_brings_a_namespaced_robot_up_from_an_install_prefix(prefix, graph, tmp_path):
    """From a prefix and a directory that is not the checkout: commands arrive on robot1/vla/command, every
    topic of ours is in the namespace, a parameter set through the real service takes effect and a bad one
    is refused with the reason, and SIGINT ends it all with exit 0."""
    from diagnostic_msgs.msg import DiagnosticArray
    from geometry_msgs.msg import Twist
    from rcl_interfaces.msg import Parameter as ParameterMsg
    from rcl_interfaces.msg import ParameterType, ParameterValue
    from rcl_interfaces.srv import GetParameters, SetParameters

    from ros_graph import call

    listener, executor = graph
    heard: dict[str, list] = {"command": [], "diagnostics": []}
    listener.create_subscription(Twist, "/robot1/vla/command", heard["command"].append, 10)
    listener.create_subscription(DiagnosticArray, "/diagnostics", lambda m: heard["diagnostics"].extend(
        s.name for s in m.status), 10)
    process = _launch(prefix, tmp_path, "namespace:=robot1", f"config:={_robot_config(tmp_path)}")
    output = Output(process)
    try:
        assert _spin_until(executor, lambda: (heard["command"] and "vla_edge_ros: reasoning" in heard["diagnostics"])
                           or process.poll() is not None), output.text()[-3000:]
        assert process.poll() is None, output.text()[-3000:]
        assert all(not m.linear.x for m in heard["command"])  # no camera: safe stops
        ours = {"camera/image_raw", "camera/image_raw/compressed", "vla/command"}
        topics = {name for name, _ in listener.get_topic_names_and_types()}
        assert {f"/robot1/{name}" for name in ours} <= topics and not {f"/{name}" for name in ours} & topics
        nodes = set(listener.get_node_names_and_namespaces())
        assert {("camera_subscriber", "/robot1"), ("reasoning", "/robot1"), ("action_publisher", "/robot1")} <= nodes

        def set_deadline(value: float):
            client = listener.create_client(SetParameters, "/robot1/reasoning/set_parameters")
            value = ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=value)
            return call(executor, client, SetParameters.Request(
                parameters=[ParameterMsg(name="deadline_ms", value=value)]), 60).results[0]

        assert set_deadline(25.0).successful
        refused = set_deadline(-1.0)
        assert not refused.successful and "deadline_ms" in refused.reason
        client = listener.create_client(GetParameters, "/robot1/reasoning/get_parameters")
        got = call(executor, client, GetParameters.Request(names=["deadline_ms"]), 60)
        assert got.values[0].double_value == 25.0
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, output.text()[-3000:]
    assert "Traceback" not in output.text() and "process has finished cleanly" in output.text()


@pytest.mark.ros
@needs_launch
def test_the_launch_ends_with_an_error_when_bringup_is_killed(prefix, tmp_path):
    process = _launch(prefix, tmp_path)
    output = Output(process)
    try:
        deadline = time.monotonic() + 120
        while output.pid_of("bringup") is None and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = output.pid_of("bringup")
        assert pid is not None, output.text()[-3000:]
        os.kill(pid, signal.SIGKILL)
        process.wait(timeout=60)  # ends by itself
    finally:
        process.kill()
    assert process.returncode != 0 and "bringup exited with code -9" in output.text(), output.text()[-3000:]


@pytest.mark.ros
@needs_launch
def test_the_launch_ends_when_bringup_cannot_start(prefix, tmp_path):
    config = tmp_path / "robot.yaml"
    config.write_text("reasoning:\n  ros__parameters:\n    model_dir: no_such_model\n")
    process = _launch(prefix, Path("/"), f"config:={config}")
    try:
        out, _ = process.communicate(timeout=120)  # ends by itself: it does not idle until someone stops it
    finally:
        process.kill()
    assert f"bringup: error: model directory {tmp_path / 'no_such_model'} does not exist" in out, out[-3000:]
    assert process.returncode != 0 and "Traceback" not in out


def _moving(message) -> bool:
    return any((message.linear.x, message.linear.y, message.linear.z,
                message.angular.x, message.angular.y, message.angular.z))


def _patient_config(tmp_path: Path) -> Path:
    """The shipped defaults with the longest deadline and action timeout: on a busy machine a 33 ms gate refuses
    every cycle and the robot, rightly, never moves; these tests are about who commands it when."""
    config = _robot_config(tmp_path)
    config.write_text(config.read_text() + "reasoning:\n  ros__parameters:\n    deadline_ms: 1000.0\n"
                      "action_publisher:\n  ros__parameters:\n    action_timeout_ms: 60000.0\n")
    return config


def _robot_config(tmp_path: Path) -> Path:
    """A robot's configuration for the shipped model, which reads the robot's odometry: on ``odom``."""
    config = tmp_path / "robot.yaml"
    config.write_text("camera_subscriber:\n  ros__parameters:\n    state_topic: odom\n    state_type: odometry\n")
    return config


def _standing_still(node, topic: str):
    """The odometry of a robot standing still, 30 times a second, stamped now (as a base driver's)."""
    from nav_msgs.msg import Odometry

    publisher = node.create_publisher(Odometry, topic, 10)

    def publish() -> None:
        message = Odometry()
        message.header.stamp = node.get_clock().now().to_msg()
        message.header.frame_id = "odom"
        message.pose.pose.orientation.w = 1.0
        publisher.publish(message)

    return node.create_timer(1 / 30, publish)


@pytest.mark.ros
@needs_launch
@pytest.mark.parametrize("interrupted", ["the launch alone", "the terminal's process group"])
def test_ctrl_c_stops_the_robot_first_and_ends_the_launch_within_its_sigterm_timeout(prefix, graph, tmp_path,
                                                                                       interrupted):
    """The robot's explicit stop, then a clean exit, before launch's own 5 s clock escalates to SIGTERM. A SIGINT
    to the launch alone once reached nobody else: launch held it back from bringup, taking the terminal to have
    sent it to every process, and the robot kept moving until SIGTERM (stop ~6 s after the interrupt). A
    terminal's Ctrl-C reaches bringup twice (the terminal's and the forwarded one), which must not cut the
    stop short either."""
    from geometry_msgs.msg import Twist

    from vla_edge_ros.nodes.synthetic_camera import SyntheticCameraPublisher

    listener, executor = graph
    commands: list = []
    listener.create_subscription(Twist, "/robot1/vla/command", commands.append, 100)
    camera = SyntheticCameraPublisher("/robot1/camera/image_raw", rate_hz=15.0, height=96, width=96,
                                      context=listener.context)
    executor.add_node(camera)
    odometry = _standing_still(camera, "/robot1/odom")
    process = _launch(prefix, tmp_path, "namespace:=robot1", f"config:={_patient_config(tmp_path)}")
    output = Output(process)
    try:
        assert _spin_until(executor, lambda: any(map(_moving, commands)) or process.poll() is not None), \
            output.text()[-3000:]
        assert process.poll() is None, output.text()[-3000:]
        interrupted_at, before = time.monotonic(), len(commands)
        if interrupted == "the launch alone":
            process.send_signal(signal.SIGINT)
        else:
            os.killpg(process.pid, signal.SIGINT)
        assert _spin_until(executor, lambda: process.poll() is not None, 60.0), output.text()[-3000:]
        exit_s = time.monotonic() - interrupted_at
        assert _spin_until(executor, lambda: not _moving(commands[-1]), 10.0)  # what was sent last is a stop
    finally:
        process.kill()
        camera.destroy_timer(odometry)
        executor.remove_node(camera)
        camera.destroy_node()
    text = output.text()
    assert process.returncode == 0, text[-3000:]
    assert "escalating to 'SIGTERM'" not in text, f"exit {exit_s:.1f} s after SIGINT\n{text[-3000:]}"
    stop_line = text.find("deactivated: sent an explicit stop (twist)")
    assert 0 <= stop_line < text.find("process has finished cleanly"), text[-3000:]
    after = commands[before:]
    first_stop = next(i for i, message in enumerate(after) if not _moving(message))
    assert not any(map(_moving, after[first_stop:])), "the robot was told to move after its stop"


@pytest.mark.ros
@needs_launch
def test_the_launch_can_leave_the_managed_nodes_inactive_until_ros2_lifecycle_activates_them(prefix, graph, tmp_path):
    """``start_state:=inactive``: the model is loaded and checked, nothing is commanded; `ros2 lifecycle set ...
    activate` on both nodes (here the ChangeState calls it makes) starts the commands."""
    from diagnostic_msgs.msg import DiagnosticArray
    from geometry_msgs.msg import Twist
    from lifecycle_msgs.msg import Transition
    from lifecycle_msgs.srv import ChangeState, GetState

    from ros_graph import call

    listener, executor = graph
    commands: list = []
    statuses: dict[str, str] = {}
    listener.create_subscription(Twist, "/robot1/vla/command", commands.append, 10)
    listener.create_subscription(DiagnosticArray, "/diagnostics",
                                 lambda m: statuses.update((s.name, s.message) for s in m.status), 10)
    process = _launch(prefix, tmp_path, "namespace:=robot1", "start_state:=inactive",
                      f"config:={_patient_config(tmp_path)}")
    output = Output(process)
    try:
        for node in ("reasoning", "action_publisher"):
            client = listener.create_client(GetState, f"/robot1/{node}/get_state")
            assert call(executor, client, GetState.Request(), 120.0).current_state.label == "inactive", \
                output.text()[-3000:]
        assert _spin_until(executor, lambda: statuses.get("vla_edge_ros: action_publisher", "").startswith(
            "inactive: publishing no commands") or process.poll() is not None), output.text()[-3000:]
        assert not commands  # a second of diagnostics, and not one command
        for node in ("reasoning", "action_publisher"):
            client = listener.create_client(ChangeState, f"/robot1/{node}/change_state")
            request = ChangeState.Request(transition=Transition(label="activate"))
            assert call(executor, client, request, 60.0).success, output.text()[-3000:]
        assert _spin_until(executor, lambda: commands or process.poll() is not None), output.text()[-3000:]
        assert process.poll() is None, output.text()[-3000:]
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, output.text()[-3000:]
