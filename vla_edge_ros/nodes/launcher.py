"""`ros2 launch vla_edge_ros vla_edge.launch.py ARGS` without ros2cli, which no pip wheel provides.

The same call `ros2 launch` makes: a LaunchService including the package's launch file from its share
directory, with ``name:=value`` launch arguments; its return code is the process's (non-zero when the
launch ended with an error, e.g. bringup died). The launch needs what `ros2 launch` needs: the package in a
colcon-style prefix named by AMENT_PREFIX_PATH (its executables in ``lib/vla_edge_ros``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from launch import LaunchService
from launch.actions import IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource

LAUNCH_FILE = "vla_edge.launch.py"


def launch(share: Path, arguments: Sequence[str]) -> int:
    """Run ``share/launch/vla_edge.launch.py`` with ``name:=value`` arguments until it ends."""
    pairs = []
    for argument in arguments:
        name, sep, value = argument.partition(":=")
        if not sep or not name:
            raise ValueError(f"launch arguments are name:=value, got {argument!r}")
        pairs.append((name, value))
    service = LaunchService()
    service.include_launch_description(IncludeLaunchDescription(
        PythonLaunchDescriptionSource(str(share / "launch" / LAUNCH_FILE)), launch_arguments=pairs))
    return service.run()
