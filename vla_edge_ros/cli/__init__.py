"""``vla-edge``: the package's command line (works without a ROS install)."""

from __future__ import annotations

from ..runtime.stop_signals import StopSignals, run_until_interrupted


def main(argv: list[str] | None = None) -> int:
    """Entry point: SIGINT/SIGTERM handled from the first instant (a signal while starting is one line and
    exit code 2), then the command."""

    def command(stop: StopSignals) -> int:
        from .commands import run_command

        return run_command(argv, stop)

    return run_until_interrupted("vla-edge", command)


__all__ = ["main"]
