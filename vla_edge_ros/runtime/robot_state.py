"""The robot's state from its ROS message: a vector in the order the checkpoint reads it, or a reason why not.

Two message types, chosen by ``camera_subscriber.state_type``; both are read duck-typed (the fields by
name, as ``image_codec`` reads images), so rclpy's messages and a bag's read the same way:

- ``joint_state`` (sensor_msgs/JointState): the positions of ``state_joint_names``, in that order, picked
  out by name wherever the message lists them; then, with ``state_joint_velocities``, their velocities
  in the same order. Every message must name every configured joint (a driver that splits its joints
  over several messages needs a merger: a state is never assembled from messages of different times).
- ``odometry`` (nav_msgs/Odometry): x, y (``pose.pose.position``, in the message's ``header.frame_id``),
  yaw (from ``pose.pose.orientation``, about z, in radians), vx, vy (``twist.twist.linear``) and wz
  (``twist.twist.angular.z``), the twist in ``child_frame_id`` (REP 105: the robot's own frame). A planar
  robot's state: z, roll and pitch are not read.

A message that cannot give the vector is refused with ``StateInputError``, whose ``reason`` is one of
``REASONS`` and whose text says what is wrong; nothing is filled in, and no NaN or Inf gets through.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

ODOMETRY_STATE = ("x", "y", "yaw", "vx", "vy", "wz")
"""What an odometry state holds, in order."""

REASONS = ("missing_joint", "duplicate_joint", "wrong_length", "not_finite", "bad_orientation", "unstamped")
"""Why a state message was refused: a configured joint it does not name, a joint it names twice, position or
velocity arrays that do not match its names, a value that is NaN or Inf, an orientation that is no rotation, a
header stamp of zero (its age could not be judged: two unstamped sources would always look fresh together)."""


class StateInputError(ValueError):
    """A state message that cannot become the model's state vector; ``reason`` is one of REASONS."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _finite(values: np.ndarray, labels: Sequence[str]) -> np.ndarray:
    """``values`` as float32, or StateInputError naming those that are NaN or Inf (or beyond float32's range)."""
    with np.errstate(over="ignore"):
        narrow = values.astype(np.float32)
    bad = [label for label, value in zip(labels, narrow) if not math.isfinite(value)]
    if bad:
        raise StateInputError("not_finite", f"state values are NaN or Inf: {', '.join(bad[:6])}")
    return narrow


class JointStateReader:
    """sensor_msgs/JointState -> positions of ``names`` in order (then their velocities, with ``velocities``)."""

    def __init__(self, names: Sequence[str], velocities: bool) -> None:
        self.names = tuple(names)
        self.velocities = velocities
        self.labels = self.names + tuple(f"{name} velocity" for name in self.names if velocities)

    @property
    def dim(self) -> int:
        return len(self.labels)

    def vector(self, msg: Any) -> np.ndarray:
        names = list(msg.name)
        index = {name: i for i, name in enumerate(names)}
        if len(index) != len(names):
            twice = sorted({name for name in names if names.count(name) > 1})
            raise StateInputError("duplicate_joint", f"the message names {', '.join(map(repr, twice))} twice")
        missing = [name for name in self.names if name not in index]
        if missing:
            raise StateInputError("missing_joint", f"joint {', '.join(map(repr, missing[:4]))} is not in the message "
                                  f"(it names {', '.join(map(repr, names[:8])) or 'no joint'})")
        fields = ("position", "velocity") if self.velocities else ("position",)
        rows = []
        for field in fields:
            values = np.asarray(getattr(msg, field), dtype=np.float64)
            if values.shape != (len(names),):
                raise StateInputError("wrong_length", f"{field} has {values.size} values for {len(names)} joint names")
            rows.append(values[[index[name] for name in self.names]])
        return _finite(np.concatenate(rows), self.labels)


class OdometryReader:
    """nav_msgs/Odometry -> (x, y, yaw, vx, vy, wz): see the module doc."""

    labels = ODOMETRY_STATE
    dim = len(ODOMETRY_STATE)

    def vector(self, msg: Any) -> np.ndarray:
        pose, twist = msg.pose.pose, msg.twist.twist
        q = pose.orientation
        raw = np.array([pose.position.x, pose.position.y, q.x, q.y, q.z, q.w,
                        twist.linear.x, twist.linear.y, twist.angular.z], dtype=np.float64)
        _finite(raw, ("x", "y", "orientation.x", "orientation.y", "orientation.z", "orientation.w", "vx", "vy", "wz"))
        if q.x * q.x + q.y * q.y + q.z * q.z + q.w * q.w < 1e-12:
            raise StateInputError("bad_orientation", "the orientation quaternion is zero: no rotation, so no yaw")
        # yaw of the rotation q, unnormalised q alike: atan2(2(wz + xy), w^2 + x^2 - y^2 - z^2)
        yaw = math.atan2(2.0 * (q.w * q.z + q.x * q.y), q.w * q.w + q.x * q.x - q.y * q.y - q.z * q.z)
        return _finite(np.array([raw[0], raw[1], yaw, raw[6], raw[7], raw[8]]), self.labels)


def yaw_quaternion(yaw: float) -> tuple[float, float, float, float]:
    """(x, y, z, w) of the rotation by ``yaw`` radians about z: the orientation whose yaw ``OdometryReader`` reads."""
    return 0.0, 0.0, math.sin(yaw / 2.0), math.cos(yaw / 2.0)


def odometry_message(values: Sequence[float]) -> SimpleNamespace:
    """A nav_msgs/Odometry, duck-typed, holding the planar state ``values`` (``ODOMETRY_STATE``'s order): what
    ``OdometryReader`` reads back as ``values``. Offline harnesses (evaluate) hand it to the same state path
    a robot's message takes; the simulated robot's node fills a real message the same way."""
    x, y, yaw, vx, vy, wz = (float(v) for v in values)
    qx, qy, qz, qw = yaw_quaternion(yaw)
    ns = SimpleNamespace
    return ns(pose=ns(pose=ns(position=ns(x=x, y=y, z=0.0), orientation=ns(x=qx, y=qy, z=qz, w=qw))),
              twist=ns(twist=ns(linear=ns(x=vx, y=vy, z=0.0), angular=ns(x=0.0, y=0.0, z=wz))))


def joint_state_message(names: Sequence[str], positions: Sequence[float]) -> SimpleNamespace:
    """A sensor_msgs/JointState, duck-typed, naming ``names`` at ``positions`` (no velocities): what
    ``JointStateReader`` reads back. Offline harnesses (evaluate's Meta-World arm, whose 4-D state it carries as
    joints x, y, z, gripper) hand it to the state path a robot's message takes."""
    return SimpleNamespace(name=list(names), position=[float(v) for v in positions], velocity=[])


def state_reader(state_type: str, joint_names: Sequence[str], joint_velocities: bool
                 ) -> JointStateReader | OdometryReader:
    """The reader of ``camera_subscriber.state_type`` (``joint_state`` or ``odometry``)."""
    if state_type == "joint_state":
        return JointStateReader(joint_names, joint_velocities)
    if state_type == "odometry":
        return OdometryReader()
    raise ValueError(f"state_type must be joint_state or odometry, got {state_type!r}")


class StateInput:
    """State messages in, good states out to ``on_state(values, stamp_ns)`` (the observation assembler); a
    refused message is counted by reason and remembered, and the last good state stays the newest."""

    def __init__(self, reader: JointStateReader | OdometryReader,
                 on_state: Callable[[np.ndarray, int], None]) -> None:
        self.reader = reader
        self._on_state = on_state
        self.received = 0  # every message, good or not
        self.dropped = dict.fromkeys(REASONS, 0)
        self.last_refusal = ""  # what was wrong with the latest refused message
        self.last_state_ns: int | None = None  # receive time of the newest good state

    def receive(self, msg: Any, stamp_ns: int, receive_ns: int) -> StateInputError | None:
        """Read one message (header stamp ``stamp_ns``); the error that refused it, or None when it was good."""
        self.received += 1
        try:
            if stamp_ns == 0:
                raise StateInputError("unstamped", "the message's header stamp is zero, so its age cannot be judged: "
                                      "the driver must stamp its states")
            values = self.reader.vector(msg)
        except StateInputError as exc:
            self.dropped[exc.reason] += 1
            self.last_refusal = str(exc)
            return exc
        self.last_state_ns = receive_ns
        self._on_state(values, stamp_ns)
        return None
