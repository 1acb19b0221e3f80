"""``vla-edge``: the package's command line (works without a ROS install).

Each command lives in its own module with a ``register(subparsers)``; the argument types they share are
in ``args.py``. A user error (bad config, missing checkpoint, a value out of range) is one line on
stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from ..config import USER_ERRORS
from ..runtime.stop_signals import StopSignals
from ..tools.parallel import UNITS_DIR, UnitsFailed
from . import bags, evaluate, kv_store, launch, memory_bench, model, replay, run, train

COMMANDS = (model, run, launch, memory_bench, kv_store, bags, replay, evaluate, train)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vla-edge", description="Vision-Language-Action engine for ROS 2 robots.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return parser


def run_command(argv: list[str] | None, stop: StopSignals) -> int:
    """Parse ``argv`` and run its command; ``stop`` is the process's signal handler (``vla-edge run`` and
    ``play`` let it end their spin loops)."""
    args = build_parser().parse_args(argv)
    args.stop = stop
    if hasattr(args, "resume"):  # a batch of units: an interruption leaves the finished ones for --resume
        stop.phase = f"before the run finished: the finished units are in {args.out / UNITS_DIR}, --resume goes on"
    try:
        return args.func(args)
    except USER_ERRORS as exc:
        print(f"vla-edge {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except UnitsFailed as exc:
        print(f"vla-edge {args.command}: {exc}", file=sys.stderr)
        return 1
