"""SIGINT and SIGTERM as requests to stop, so a process never dies half-way with a robot still moving.

A process goes through two phases. While it starts (imports, config, loading the model, creating
nodes) a signal aborts the start-up: ``Interrupted`` is raised where the process is, unwinds it, and
the entry point prints one line and exits 2, with no traceback. Once it runs, a signal only sets
``requested``: the spin loop sees it within one iteration and returns, and shutdown then sends the
robot an explicit stop command before the nodes go down, which an exception thrown into the middle of
a callback could not guarantee. The same signal again is the same request and is ignored: Ctrl-C in a
terminal reaches every process of the foreground group, and a launch that forwards it to its
processes (ours does, so a SIGINT sent to the launch alone still stops the robot at once) delivers
it a second time while the first is being served. The other signal while stopping is an escalation,
like launch's SIGTERM after its sigterm_timeout: it raises ``Interrupted``, as during start-up.

Entry points install the handlers first thing (``run_until_interrupted``), before the heavy imports,
so that even a signal during ``import numpy`` ends cleanly; the previous handlers come back when the
block ends. A library may catch ``Interrupted`` and raise its own error instead (rclpy's C-extension
loader turns it into an ``ImportError``): the handler remembers what it raised, so whatever escapes
after it is still reported as the interruption it is, never as a traceback, and if nothing escapes (an
optional import took that ``ImportError`` for a missing module and went on), the start-up still ends
where the loop would start running. rclpy's own handlers are not installed
(``nodes/ros_session.py``): they would shut the ROS context down under the running nodes before the
stop command could be published. Standard library only: this module loads in milliseconds.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator
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
        self._running = False
        self.requested: str | None = None  # the name of the signal that asked the running loop to stop
        self.phase = "during start-up"  # how an interruption is described (a batch job says where it stopped)
        self.interruption: Interrupted | None = None  # what this handler raised, if it did

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

    @property
    def running(self) -> bool:
        """Set by the spin loop once the nodes run; cleared when it returns."""
        return self._running

    @running.setter
    def running(self, value: bool) -> None:
        if value and self.interruption is not None:
            # The start-up was interrupted, but something swallowed the raise (an optional import caught
            # it as an ImportError and fell back, for instance): start-up ends here, before the nodes run.
            raise self.interruption
        self._running = value

    def __call__(self, number: int, frame: FrameType | None) -> None:
        name = signal.Signals(number).name
        # Python may run the handler for a second signal between any two lines of this one (both SIGINTs of a
        # Ctrl-C under launch arrive together), so the request is made first and the test for "already being
        # served" comes after it: a nested call that made the same request leaves this one nothing to raise.
        if self.running and self.requested is None:
            self.requested = name
        if name == self.requested:  # asked now, or delivered again (terminal and launch): being served
            return
        self.interruption = Interrupted(f"interrupted by {name} {'while stopping' if self.requested else self.phase}")
        raise self.interruption


def run_until_interrupted(program: str, body: Callable[[StopSignals], int]) -> int:
    """``body(stop)`` under the stop-signal handler; an interruption is one line on stderr and exit code 2.

    Anything that escapes ``body`` after the handler raised is the interruption's doing, whatever a library
    in between made of it (wrapped, re-raised as its own type), so it is reported as the interruption."""
    with StopSignals.installed() as stop:
        try:
            return body(stop)
        except BaseException:
            if stop.interruption is None:
                raise
            print(f"{program}: {stop.interruption}", file=sys.stderr)
            return 2

