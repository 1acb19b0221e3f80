"""``vla-edge launch [name:=value ...]``: the package's launch file, as `ros2 launch` would run it."""

from __future__ import annotations

import argparse
import signal

from ..config import package_share


def cmd_launch(args: argparse.Namespace) -> int:
    share = package_share()
    if share is None:
        raise ValueError("the package's share directory (launch/, config/, models/) is not found: install the "
                         "package into a colcon-style prefix and name it in AMENT_PREFIX_PATH (see README)")
    try:
        from ..nodes.launcher import launch
    except ImportError as exc:
        raise ValueError(f"the ROS 2 launch libraries are not installed ({exc.name}): see README, 'On a robot'") from None
    # launch handles SIGINT and SIGTERM itself (it forwards them to the processes it started and waits for
    # them), chaining to the handlers it finds: give it Python's defaults, as under `ros2 launch`
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return launch(share, args.arguments)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("launch", help="run launch/vla_edge.launch.py like `ros2 launch` (no ros2cli needed)")
    p.add_argument("arguments", nargs="*", metavar="NAME:=VALUE",
                   help="launch arguments: config, namespace, image_topic, use_sim_time")
    p.set_defaults(func=cmd_launch)
