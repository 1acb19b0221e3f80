"""The package as its users get it: commands run from any directory with no --config, from the checkout and
from a colcon-style install prefix, and the launch file brings the nodes up from that prefix (and ends
when bringup cannot start)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import sysconfig
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
    return {**os.environ, "PYTHONPATH": str(site), "PYTHONSAFEPATH": "1",
            "AMENT_PREFIX_PATH": os.pathsep.join([str(root / "prefix"), sys.prefix]), "prefix": str(root / "prefix")}


def test_an_installed_package_runs_from_its_prefix_and_finds_its_share(prefix, tmp_path, bag):
    share = Path(prefix["prefix"]) / "share" / "vla_edge_ros"
    located = subprocess.run([sys.executable, "-c", "import vla_edge_ros.config as c; print(c.__file__); "
                              "print(c.package_share())"], cwd=tmp_path, env=prefix, capture_output=True, text=True)
    module, found = located.stdout.split()
    assert module.startswith(prefix["prefix"]) and Path(found) == share  # the installed copy, not the checkout
    plan = vla_edge("plan", cwd=tmp_path, env=prefix)
    assert plan.returncode == 0, plan.stderr
    assert f"model      {share / 'models' / 'sim'}" in plan.stdout
    replay = vla_edge("replay", str(bag), "--policy", "dms", "--cost", "fixed:encode=8ms,decode=1ms", "--out", "r",
                      cwd=tmp_path, env=prefix)
    assert replay.returncode == 0, replay.stderr


def _launch(prefix: dict[str, str], cwd: Path, *arguments: str) -> subprocess.Popen:
    """``ros2 launch vla_edge_ros vla_edge.launch.py ARGS`` without ros2cli: the same LaunchService call."""
    script = ("import sys\n"
              "from ament_index_python.packages import get_package_share_directory\n"
              "from launch import LaunchService\n"
              "from launch.actions import IncludeLaunchDescription\n"
              "from launch.launch_description_sources import PythonLaunchDescriptionSource\n"
              "path = get_package_share_directory('vla_edge_ros') + '/launch/vla_edge.launch.py'\n"
              "service = LaunchService()\n"
              "service.include_launch_description(IncludeLaunchDescription(PythonLaunchDescriptionSource(path),\n"
              "    launch_arguments=[tuple(a.split(':=', 1)) for a in sys.argv[1:]]))\n"
              "sys.exit(service.run())\n")
    env = {**prefix, "ROS_DOMAIN_ID": str(100 + os.getpid() % 100)}
    return subprocess.Popen([sys.executable, "-c", script, *arguments], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.mark.ros
@needs_launch
def test_the_launch_file_brings_the_nodes_up_from_an_install_prefix_and_stops_on_sigint(prefix, tmp_path):
    import rclpy
    from diagnostic_msgs.msg import DiagnosticArray
    from geometry_msgs.msg import Twist
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node

    context = Context()
    rclpy.init(context=context, domain_id=100 + os.getpid() % 100)
    heard: dict[str, list] = {"command": [], "diagnostics": []}
    listener = Node("listener", context=context)
    listener.create_subscription(Twist, "/vla/command", heard["command"].append, 10)
    listener.create_subscription(DiagnosticArray, "/diagnostics", lambda m: heard["diagnostics"].extend(
        s.name for s in m.status), 10)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(listener)
    process = _launch(prefix, tmp_path)  # the default config, from the share; cwd is not the checkout
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None and not (
                heard["command"] and "vla_edge_ros: reasoning" in heard["diagnostics"]):
            executor.spin_once(timeout_sec=0.1)
        assert process.poll() is None, process.stdout.read()
        assert heard["command"] and all(m.linear.x == 0.0 for m in heard["command"])  # no camera: safe stop
        assert "vla_edge_ros: reasoning" in heard["diagnostics"]
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=60)
    finally:
        process.kill()
        executor.shutdown()
        listener.destroy_node()
        rclpy.shutdown(context=context)
    assert process.returncode == 0, out[-3000:]
    assert "Traceback" not in out and "process has finished cleanly" in out, out[-3000:]


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
    assert "Traceback" not in out
