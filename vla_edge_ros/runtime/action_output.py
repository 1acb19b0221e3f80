"""What the robot is told at one control tick: the action the timeline holds for it, else a safe stop.

The action publisher asks this module once per tick, through the action timeline (``action_timeline.py``,
which picks the tick's action from the model's chunks); nothing here imports rclpy, so the rule that
keeps a robot safe is tested without a ROS graph. A fresh action is clipped to the configured limits
and mapped to the fields of the command type. Everything else is a safe stop, and so is every case
where the configuration does not fit the action (limit or name counts, a twist dimension the action
does not have): the robot gets a stop, never a guess, and the reason travels with the command.
``decide`` is the ``sync`` rule on one action: fresh while no older than ``action_timeout_ms``.

Safe stop per command type:

- ``twist``: all six components zero.
- ``float32_multi_array``: zeros, as many as the newest action has dimensions (an empty array
  before the first action, when that count is not known yet).
- ``joint_trajectory``: the last commanded positions, held; nothing at all before any position was
  commanded, because zero joint positions are a motion, not a stop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from ..config import ConfigError, OutputKnobs
from .action_slot import TimedAction
from .chunk_safety import check_fits, per_dimension
from .clock import NS_PER_MS

TWIST_FIELDS = ("linear.x", "linear.y", "linear.z", "angular.x", "angular.y", "angular.z")


class Outcome(Enum):
    """Why a tick commands what it commands; everything but FRESH is a safe stop."""

    FRESH = "fresh"
    STALE = "stale"  # the newest action is older than the timeout
    NONE = "none"  # no action has arrived yet
    CONFIG_ERROR = "config_error"  # the configuration does not fit the action
    INVALID = "invalid"  # the action holds NaN or infinity
    STARVED = "starved"  # every chunk ran out: no action is meant for this tick (chunked execution)
    SHUTDOWN = "shutdown"  # the node is going down: one last, explicit stop


@dataclass(frozen=True)
class Command:
    """One tick's decision.

    ``values`` is in the command type's own layout: the six twist components, the array, or one
    position per joint name. ``None`` means publish nothing this tick.
    """

    outcome: Outcome
    values: tuple[float, ...] | None
    age_ms: float | None  # age of the newest action, None before the first one
    error: str | None = None

    @property
    def safe_stop(self) -> bool:
        return self.outcome is not Outcome.FRESH


def age_outcome(action: TimedAction | None, now_ns: int, timeout_ms: float) -> tuple[Outcome, float | None]:
    """FRESH, STALE or NONE, and the action's age in ms; an age equal to the timeout is still fresh."""
    if action is None:
        return Outcome.NONE, None
    age_ms = (now_ns - action.ready_ns) / NS_PER_MS
    return (Outcome.STALE if age_ms > timeout_ms else Outcome.FRESH), age_ms


def clip(values: np.ndarray, action_min: Sequence[float], action_max: Sequence[float]) -> np.ndarray:
    """The action clipped per dimension; limits that do not fit the action raise ConfigError."""
    dof = len(values)
    low, high = per_dimension(action_min, dof, "action_min"), per_dimension(action_max, dof, "action_max")
    crossed = np.flatnonzero(low > high)
    if crossed.size:
        i = int(crossed[0])
        raise ConfigError(f"action_min is above action_max in dimension {i} ({low[i]:g} > {high[i]:g})")
    return np.clip(np.asarray(values, dtype=np.float64), low, high)


def twist_components(values: np.ndarray, twist_dims: Sequence[int]) -> tuple[float, ...]:
    """linear.xyz, angular.xyz taken from the action dimensions named by ``twist_dims`` (-1: zero)."""
    for field, dim in zip(TWIST_FIELDS, twist_dims):
        if dim >= len(values):
            raise ConfigError(f"twist_dims maps {field} to action dimension {dim}, "
                              f"but the action has only {len(values)} dimensions")
    return tuple(0.0 if dim < 0 else float(values[dim]) for dim in twist_dims)


def joint_positions(values: np.ndarray, joint_names: Sequence[str]) -> tuple[float, ...]:
    """One position per joint name, in order; the counts must match exactly."""
    if len(joint_names) != len(values):
        raise ConfigError(f"joint_names has {len(joint_names)} names but the action has {len(values)} dimensions")
    return tuple(float(v) for v in values)


def check_fits_action(knobs: OutputKnobs, dof: int) -> None:
    """ConfigError when these command knobs cannot serve an action of ``dof`` dimensions (clip or chunk-safety
    limits of another length, a twist field mapped past the action, a joint name count that differs). Checked
    at start and on every live change, so that no control tick is the first to find out."""
    clip(np.zeros(dof), knobs.action_min, knobs.action_max)
    check_fits(knobs.chunk_safety, dof)
    if knobs.command_type == "twist":
        twist_components(np.zeros(dof), knobs.twist_dims)
    elif knobs.command_type == "joint_trajectory":
        joint_positions(np.zeros(dof), knobs.joint_names)


def array_values(values: np.ndarray) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


class ActionOutput:
    """Decides each tick's command for one command type, remembering the positions a hold needs."""

    def __init__(self, knobs: OutputKnobs, dof: int | None = None) -> None:
        """``dof``: the action's dimensions when known (the engine's), so a bad file fails at start-up."""
        if dof is not None:
            check_fits_action(knobs, dof)
        if knobs.command_type == "joint_trajectory":
            if not knobs.joint_names:
                raise ConfigError("joint_names must name at least one joint")
            if len(set(knobs.joint_names)) != len(knobs.joint_names):
                raise ConfigError(f"joint_names must be unique, got {list(knobs.joint_names)}")
        self.command_type = knobs.command_type
        self._twist_dims = knobs.twist_dims
        self._joint_names = knobs.joint_names
        self._held: tuple[float, ...] | None = None  # last commanded joint positions

    def decide(self, action: TimedAction | None, now_ns: int, knobs: OutputKnobs) -> Command:
        """The ``sync`` command for a tick at monotonic ``now_ns``: ``action``'s (first) values while fresh under
        the live knobs (timeout, clip limits); never raises for a bad configuration."""
        outcome, age_ms = age_outcome(action, now_ns, knobs.action_timeout_ms)
        return self.command(outcome, None if action is None else action.values, age_ms, knobs)

    def command(self, outcome: Outcome, values: np.ndarray | None, age_ms: float | None, knobs: OutputKnobs,
                dof: int | None = None) -> Command:
        """The command for a tick whose action is ``values`` [dof] when ``outcome`` is FRESH (else the safe stop
        for that outcome; ``dof``, when ``values`` is None, sizes an array stop): clipped and mapped, or a stop
        when it is not finite or the configuration does not fit it. Never raises for a bad configuration."""
        dof = len(values) if values is not None else dof
        if outcome is not Outcome.FRESH:
            return self._stop(outcome, dof, age_ms)
        if not all(math.isfinite(v) for v in values):
            return self._stop(Outcome.INVALID, dof, age_ms, f"action has non-finite values {list(values)}")
        try:
            mapped = self._map(clip(values, knobs.action_min, knobs.action_max))
        except ConfigError as exc:
            return self._stop(Outcome.CONFIG_ERROR, dof, age_ms, str(exc))
        if self.command_type == "joint_trajectory":
            self._held = mapped
        return Command(Outcome.FRESH, mapped, age_ms)

    def stop(self, dof: int | None) -> Command:
        """The explicit stop a node sends as it goes down: the safe stop of this command type (``dof``: the
        action's dimensions, which size an array stop; None before any action)."""
        return self._stop(Outcome.SHUTDOWN, dof, None)

    def _map(self, clipped: np.ndarray) -> tuple[float, ...]:
        if self.command_type == "twist":
            return twist_components(clipped, self._twist_dims)
        if self.command_type == "joint_trajectory":
            return joint_positions(clipped, self._joint_names)
        return array_values(clipped)

    def _stop(self, outcome: Outcome, dof: int | None, age_ms: float | None, error: str | None = None) -> Command:
        if self.command_type == "twist":
            values = (0.0,) * len(TWIST_FIELDS)
        elif self.command_type == "joint_trajectory":
            values = self._held
        else:
            values = (0.0,) * (dof or 0)
        return Command(outcome, values, age_ms, error)
