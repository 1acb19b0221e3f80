"""The checks a chunk of actions passes before any of it is used (``action_publisher.chunk_safety.*``).

A chunk is judged on what would be commanded of it (``action_timeline.py`` decides that: the actions from
the tick it takes over to the end of what the timeline holds of it, the execution horizon in ``chunk``, the
whole chunk in ``rtc`` and ``ensemble``, and in those two as blended with the chunks before it: a blend of
sequences that each pass need not pass), in this order, and the first check that fails names the chunk's
rejection:

- ``nonfinite``: any NaN or infinity anywhere in the chunk, executed part or not: a head that produced one
  is broken, and no other value of its output is trusted;
- ``jump``: the first executed action against the command being executed, per dimension (no command is
  being executed before the first chunk or during a safe stop: then there is nothing to jump from);
- ``step``: consecutive executed actions, per dimension;
- ``velocity`` and ``acceleration``, per dimension, over the control period dt: for actions that are
  positions, (a[i] - a[i-1]) / dt and (a[i] - 2 a[i-1] + a[i-2]) / dt^2; for velocities, a[i] and
  (a[i] - a[i-1]) / dt (``values_are``; auto: positions for ``joint_trajectory``).

A limit of 0 is no limit. Limits hold one value for every dimension or one per dimension; a count that
fits neither raises ConfigError (checked at configure and on every live change, as the clip limits are).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..config import ChunkSafetyKnobs, ConfigError

REASONS = ("nonfinite", "jump", "step", "velocity", "acceleration")


def per_dimension(limit: Sequence[float], dof: int, name: str) -> np.ndarray:
    """One value per action dimension from a limit list of one value (for all) or ``dof`` values."""
    if len(limit) == 1:
        return np.full(dof, float(limit[0]))
    if len(limit) != dof:
        raise ConfigError(f"{name} has {len(limit)} values but the action has {dof} dimensions "
                          f"(give one value for all, or one per dimension)")
    return np.asarray(limit, dtype=np.float64)


def values_are(knobs: ChunkSafetyKnobs, command_type: str) -> str:
    """``positions`` or ``velocities``: what the limits take the action values to be."""
    if knobs.values_are != "auto":
        return knobs.values_are
    return "positions" if command_type == "joint_trajectory" else "velocities"


def check_fits(knobs: ChunkSafetyKnobs, dof: int) -> None:
    """ConfigError when a limit list cannot serve an action of ``dof`` dimensions."""
    for name in ChunkSafetyKnobs.LIMITS:
        per_dimension(getattr(knobs, name), dof, f"chunk_safety.{name}")


def _beyond(values: np.ndarray, limit: np.ndarray) -> tuple[int, int] | None:
    """(row, dimension) of the first |value| above its dimension's limit (0: none), or None."""
    over = (limit > 0) & (np.abs(values) > limit)
    if not over.any():
        return None
    row, dim = np.argwhere(over)[0]
    return int(row), int(dim)


def rejection(chunk: np.ndarray, executed: np.ndarray, executing: np.ndarray | None, knobs: ChunkSafetyKnobs,
              command_type: str, period_s: float) -> tuple[str, str] | None:
    """Why ``chunk`` [H, dof] must not be used, as (reason, words), or None when it passes: ``executed`` [n, dof]
    is what of it would be executed, ``executing`` [dof] the command being executed (None: none)."""
    if not np.isfinite(chunk).all():
        row, dim = np.argwhere(~np.isfinite(chunk))[0]
        return "nonfinite", f"action {row} holds {chunk[row, dim]} in dimension {dim}"
    if executed.shape[0] == 0:
        return None
    dof = chunk.shape[1]
    limits = {name: per_dimension(getattr(knobs, name), dof, f"chunk_safety.{name}") for name in knobs.LIMITS}
    positions = values_are(knobs, command_type) == "positions"
    steps = np.diff(executed, axis=0)
    rates = steps / period_s
    series = (
        ("jump", None if executing is None else (executed[0] - executing)[None], "max_jump", ""),
        ("step", steps, "max_step", ""),
        ("velocity", rates if positions else executed, "max_velocity", "/s"),
        ("acceleration", np.diff(rates, axis=0) / period_s if positions else rates, "max_acceleration", "/s^2"),
    )
    for reason, values, name, unit in series:
        if values is None:
            continue
        found = _beyond(values, limits[name])
        if found is not None:
            row, dim = found
            return reason, (f"{reason} {abs(values[row, dim]):.4g}{unit} in dimension {dim} (at executed action "
                            f"{row}) is above chunk_safety.{name} {limits[name][dim]:g}")
    return None
