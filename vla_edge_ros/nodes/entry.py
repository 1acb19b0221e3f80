"""The ROS executables' entry points (`ros2 run vla_edge_ros bringup | synthetic_camera`).

Each installs the stop-signal handler before it imports rclpy, NumPy or the model code, so a SIGINT or
SIGTERM at any moment of start-up ends the process with one line and exit code 2, and one while it runs
stops it the way that leaves the robot stopped (runtime/stop_signals.py). This module imports nothing
heavy itself.
"""

from __future__ import annotations

import sys

from ..runtime.stop_signals import StopSignals, run_until_interrupted


def bringup(argv: list[str] | None = None) -> int:
    """`bringup --config FILE [--ros-args ...]`: the three nodes in one process."""
    return _run("bringup", argv)


def synthetic_camera(argv: list[str] | None = None) -> int:
    """`synthetic_camera [--topic T] [--rate-hz R] ... [--ros-args ...]`: a stand-in camera driver."""
    return _run("synthetic_camera", argv)


def _run(program: str, argv: list[str] | None) -> int:
    args = sys.argv if argv is None else argv

    def node(stop: StopSignals) -> int:
        if program == "bringup":
            from .bringup import run
        else:
            from .synthetic_camera import run
        return run(args, stop)

    return run_until_interrupted(program, node)
