"""The robot's odometry in the bags we write: nav_msgs/Odometry messages, and the odometry of a robot that
executes a bag's own commanded velocity.

A model that reads the robot's state needs it in every bag it replays (``tools/replay/bag_state.py``), so
``make-bag`` and ``evaluate --record`` write one. A message holds the planar state in the order of
``robot_state.ODOMETRY_STATE``, as ``robot_state.OdometryReader`` reads it back (x, y, yaw from the
quaternion, vx, vy, wz), in the frames REP 105 names: pose in ``odom``, twist in ``base_link``. Its topic is
added before the camera's, and each message written before its frame: at one receive time every storage
then yields the state first (ROS 1 orders the messages of one time by connection), as the simulated robot
publishes them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..runtime.robot_state import yaw_quaternion
from .writer import BagWriter

ODOMETRY_MSGTYPE = "nav_msgs/msg/Odometry"
ODOMETRY_FRAME = "odom"
BASE_FRAME = "base_link"
STATE_TOPIC = "/odom"
"""Where the bags we write hold the odometry: the simulated robot's ``odom`` as a recorder names it."""


def bag_odometry(writer: BagWriter, time_ns: int, values: Sequence[float]) -> object:
    """A nav_msgs/Odometry for ``writer``'s bag, stamped ``time_ns``, holding the planar state ``values``
    (``robot_state.ODOMETRY_STATE``'s order)."""
    types = writer.types
    x, y, yaw, vx, vy, wz = (float(v) for v in values)
    qx, qy, qz, qw = yaw_quaternion(yaw)
    vector = types["geometry_msgs/msg/Vector3"]
    pose = types["geometry_msgs/msg/Pose"](position=types["geometry_msgs/msg/Point"](x=x, y=y, z=0.0),
                                           orientation=types["geometry_msgs/msg/Quaternion"](x=qx, y=qy, z=qz, w=qw))
    twist = types["geometry_msgs/msg/Twist"](linear=vector(x=vx, y=vy, z=0.0), angular=vector(x=0.0, y=0.0, z=wz))
    return types[ODOMETRY_MSGTYPE](
        header=writer.header(time_ns, ODOMETRY_FRAME), child_frame_id=BASE_FRAME,
        pose=types["geometry_msgs/msg/PoseWithCovariance"](pose=pose, covariance=np.zeros(36)),
        twist=types["geometry_msgs/msg/TwistWithCovariance"](twist=twist, covariance=np.zeros(36)))


class CommandedOdometry:
    """A planar robot that executes each commanded velocity (vx, vy) for one period of ``rate_hz``: from the
    origin at rest, heading 0, never turning. ``state()`` is what its odometry reads when a frame is seen: the
    position after the commands executed so far, and the velocity of the last one (zero before any), as the
    simulated robot's ``CueReachEnv.odometry`` reports its own."""

    def __init__(self, rate_hz: float) -> None:
        self.period_s = 1.0 / rate_hz
        self.position = np.zeros(2)
        self.velocity = np.zeros(2)

    def state(self) -> np.ndarray:
        """(x, y, yaw, vx, vy, wz), ``robot_state.ODOMETRY_STATE``'s order."""
        return np.array([*self.position, 0.0, *self.velocity, 0.0])

    def execute(self, velocity: Sequence[float]) -> None:
        """Move at ``velocity`` for one period; ValueError for a velocity that is not finite (no robot can)."""
        commanded = np.asarray(velocity, dtype=np.float64)
        if not all(math.isfinite(v) for v in commanded):
            raise ValueError(f"the commanded velocity {commanded.tolist()} is not finite: no odometry follows from it")
        self.position = self.position + commanded * self.period_s
        self.velocity = commanded

