"""SIGINT and SIGTERM as requests to stop, so a process never dies half-way with a robot still moving.

A process goes through two phases. While it starts (imports, config, loading the model, creating
nodes) a signal aborts the start-up: ``Interrupted`` is raised where the process is, unwinds it, and
the entry point prints one line and exits 2, with no traceback. Once it runs, a signal only sets
``requested``: the spin loop sees it within one iteration and returns, and shutdown then sends the
robot an explicit stop command before the nodes go down, which an exception thrown into the middle of
a callback could not guarantee. A second signal while stopping is taken as "stop now": it raises
``Interrupted`` like a signal during start-up.

Entry points install the handlers first thing (``with StopSignals.installed() as stop:``), before
the heavy imports, so that even a signal during ``import numpy`` ends cleanly; the previous handlers
come back when the block ends. rclpy's own handlers are not installed
(``nodes/ros_session.py``): they would shut the ROS context down under the running nodes before the
stop command could be published. Standard library only: this module loads in milliseconds.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """A signal that ended the process before it was running (or a second one while it stopped).

    A BaseException, like KeyboardInterrupt: a handler that reports a failed unit of work and goes on
    (``except Exception``) must not swallow a request to stop the whole process."""


class StopSignals:
    """The process's SIGINT/SIGTERM handler: aborts start-up, or asks a running loop to stop."""

    def __init__(self) -> None:
        self.running = False  # set by the spin loop once the nodes run; cleared when it returns
        self.requested: str | None = None  # the name of the signal that asked the running loop to stop
        self.phase = "during start-up"  # how an interruption is described (a batch job says where it stopped)

    @classmethod
    @contextmanager
    def installed(cls) -> Iterator[StopSignals]:
        """This handler for SIGINT and SIGTERM during the block (main thread only), the previous ones after."""
        handler = cls()
        previous = {number: signal.signal(number, handler) for number in SIGNALS}
        try:
            yield handler
        finally:
            for number, old in previous.items():
                signal.signal(number, old)

    def __call__(self, number: int, frame: FrameType | None) -> None:
        name = signal.Signals(number).name
        if self.running and self.requested is None:
            self.requested = name
            return
        raise Interrupted(f"interrupted by {name} {'while stopping' if self.requested else self.phase}")

