"""Argument types every ``vla-edge`` command shares: one parser per kind of value, one error wording."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from ..runtime.block_costs import CostModel, parse_cost


def count(text: str, minimum: int = 1) -> int:
    """An integer >= ``minimum``."""
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from exc
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
    return value


def counts(text: str) -> tuple[int, ...]:
    """Comma-separated positive integers."""
    values = tuple(count(part) for part in text.split(",") if part.strip())
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def seed(text: str) -> int:
    return count(text, minimum=0)


IMAGE_SLOT = "img"


def token_ids(text: str) -> list[int | None]:
    """Comma-separated token ids (at least one); ``img`` marks where an image goes (None, VL models)."""
    try:
        ids = [None if part.strip() == IMAGE_SLOT else int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"token ids must be comma-separated integers (or {IMAGE_SLOT!r} for an image): {text!r}") from exc
    if not ids:
        raise argparse.ArgumentTypeError("at least one token id is needed")
    return ids


def image_size(text: str) -> tuple[int, int]:
    """``HEIGHTxWIDTH`` in pixels, both positive."""
    height, _, width = text.lower().partition("x")
    try:
        size = int(height), int(width)
    except ValueError:
        size = 0, 0
    if min(size) < 1:
        raise argparse.ArgumentTypeError(f"expected HEIGHTxWIDTH in pixels (e.g. 56x84), got {text!r}")
    return size


def subset_of(choices: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    """A non-empty comma-separated subset of ``choices`` (the error names them all)."""

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(name.strip() for name in text.split(",") if name.strip())
        if not names or any(name not in choices for name in names):
            raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(choices)}, "
                                             f"got {text!r}")
        return names

    return parse


def frame_budgets(text: str) -> list[int | None]:
    """Comma-separated frame budgets; ``all`` is an arena that holds every frame of an episode (None)."""
    budgets: list[int | None] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if part == "all":
            budgets.append(None)
            continue
        try:
            value = int(part)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"budgets are positive frame counts or 'all', got {part!r}")
        budgets.append(value)
    if not budgets:
        raise argparse.ArgumentTypeError("at least one budget is needed")
    return budgets


def cost_model(text: str) -> CostModel:
    """``measured`` or ``fixed:encode=4ms,decode=1ms``."""
    try:
        return parse_cost(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def workers(text: str) -> int:
    return count(text, minimum=1)


def add_parallel_arguments(parser: argparse.ArgumentParser) -> None:
    """--workers, --ray and --resume, the same on every command that runs units of work (tools/parallel.py)."""
    parser.add_argument("--workers", type=workers, default=None,
                        help="worker processes, each loading the model once (default: 1, in this process; with "
                             "--ray, one per CPU of the cluster)")
    parser.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                        help="run the units as Ray tasks on the cluster at ADDRESS (no address: a local Ray "
                             "instance of --workers CPUs, all when not given); inputs must be on paths every node "
                             "sees")
    parser.add_argument("--resume", action="store_true",
                        help="keep the units an earlier run of the same job left in --out/units; run the rest")
