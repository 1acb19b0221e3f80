"""A robot's state as sensor_msgs/JointState in the bags we write (``evaluate --record`` on Meta-World's arm).

Replay reads it back by name (``robot_state.JointStateReader`` through ``camera_subscriber.state_joint_names``),
so the message names every joint and gives its position, no velocities. Like the odometry of ``odometry.py``,
its topic is added before the camera's and each message is written before its frame, with the frame's stamp.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .writer import BagWriter

JOINT_STATE_MSGTYPE = "sensor_msgs/msg/JointState"


def bag_joint_state(writer: BagWriter, time_ns: int, names: Sequence[str], positions: Sequence[float],
                    frame_id: str = "world") -> object:
    """A sensor_msgs/JointState for ``writer``'s bag, stamped ``time_ns``: ``names`` at ``positions``."""
    return writer.types[JOINT_STATE_MSGTYPE](
        header=writer.header(time_ns, frame_id), name=list(names),
        position=np.asarray(positions, dtype=np.float64), velocity=np.zeros(0), effort=np.zeros(0))
