"""Recorded command messages as vectors in the action space, so replay can score actions against them.

It inverts the mapping the action publisher applies on the way out (action_output.py): arrays are
the action itself, a Twist's six components go back to the action dimensions ``twist_dims`` took
them from, joints are matched by name. A dimension the message says nothing about is NaN, so a
comparison can leave it out rather than count a made-up zero.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..runtime.action_output import TWIST_FIELDS
from .reader import COMMAND_MSGTYPES


def command_vector(msg: object, msgtype: str, *, twist_dims: Sequence[int], joint_names: Sequence[str]) -> np.ndarray:
    """The float64 action vector a recorded ``msgtype`` message stands for.

    - Float32MultiArray / Float64MultiArray: ``data`` as is.
    - Twist: length ``max(twist_dims) + 1``; dimension ``twist_dims[i]`` holds component i of
      (linear.x, linear.y, linear.z, angular.x, angular.y, angular.z), -1 leaves a component out.
    - JointState: ``position`` ordered by ``joint_names``.
    - JointTrajectory: its first point's ``positions`` ordered by ``joint_names`` (all NaN without points).
    """
    if msgtype in ("std_msgs/msg/Float32MultiArray", "std_msgs/msg/Float64MultiArray"):
        return np.array(msg.data, dtype=np.float64)
    if msgtype == "geometry_msgs/msg/Twist":
        return _twist(msg, twist_dims)
    if msgtype == "sensor_msgs/msg/JointState":
        return _by_name(msg.name, msg.position, joint_names)
    if msgtype == "trajectory_msgs/msg/JointTrajectory":
        positions = msg.points[0].positions if len(msg.points) else ()
        return _by_name(msg.joint_names, positions, joint_names)
    raise ValueError(f"{msgtype} is not a command type ({', '.join(COMMAND_MSGTYPES)})")


def _twist(msg: object, twist_dims: Sequence[int]) -> np.ndarray:
    if len(twist_dims) != len(TWIST_FIELDS) or min(twist_dims) < -1:
        raise ValueError(f"twist_dims must give an action dimension or -1 for each of {', '.join(TWIST_FIELDS)}, "
                         f"got {list(twist_dims)}")
    mapped = [dim for dim in twist_dims if dim >= 0]
    if len(set(mapped)) != len(mapped):
        raise ValueError(f"twist_dims {list(twist_dims)} feeds one action dimension from two twist components, "
                         "so a recorded twist cannot be mapped back")
    components = (msg.linear.x, msg.linear.y, msg.linear.z, msg.angular.x, msg.angular.y, msg.angular.z)
    vector = np.full(max(twist_dims) + 1, np.nan)
    for dim, value in zip(twist_dims, components):
        if dim >= 0:
            vector[dim] = value
    return vector


def _by_name(names: Sequence[str], positions: Sequence[float], joint_names: Sequence[str]) -> np.ndarray:
    """Positions ordered by ``joint_names``; NaN for a joint the message does not name or give a position for."""
    given = {name: positions[i] for i, name in enumerate(names) if i < len(positions)}
    return np.array([given.get(name, np.nan) for name in joint_names], dtype=np.float64)
