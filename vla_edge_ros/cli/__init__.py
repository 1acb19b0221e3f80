"""``vla-edge``: the package's command line (works without a ROS install)."""

from __future__ import annotations

import sys

from ..runtime.stop_signals import Interrupted, StopSignals


def main(argv: list[str] | None = None) -> int:
    """Entry point: SIGINT/SIGTERM handled from the first instant (a signal while starting is one line and
    exit code 2), then the command."""
    with StopSignals.installed() as stop:
        try:
            from .commands import run_command

            return run_command(argv, stop)
        except Interrupted as exc:
            print(f"vla-edge: {exc}", file=sys.stderr)
            return 2


__all__ = ["main"]
