"""rclpy's process-wide start and stop around a command: the one place the command line touches rclpy."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import rclpy

try:  # Humble and later; a distribution without it installs rclpy's handlers, which stop the same way
    from rclpy.signals import SignalHandlerOptions
except ImportError:  # pragma: no cover
    SignalHandlerOptions = None


@contextmanager
def ros_session(args: Sequence[str] | None = None) -> Iterator[None]:
    """rclpy initialised for the block (with ``args``' --ros-args), shut down after it. rclpy's own SIGINT /
    SIGTERM handlers are not installed: the process's ``StopSignals`` handles them (runtime/stop_signals.py),
    so that a signal lets the nodes publish a stop command before the context goes down."""
    options = {} if SignalHandlerOptions is None else {"signal_handler_options": SignalHandlerOptions.NO}
    rclpy.init(args=args, **options)
    try:
        yield
    finally:
        if rclpy.ok():
            rclpy.shutdown()
