"""rclpy's process-wide start and stop around a command: the one place the command line touches rclpy."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import rclpy


@contextmanager
def ros_session(args: Sequence[str] | None = None) -> Iterator[None]:
    """rclpy initialised for the block (with ``args``' --ros-args), shut down after it, Ctrl-C included."""
    rclpy.init(args=args)
    try:
        yield
    finally:
        if rclpy.ok():
            rclpy.shutdown()
