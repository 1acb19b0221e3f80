"""The bag's recorded commands in the action space, and which one an action is compared with.

One rule serves the action error, the per-frame predictions and the plot, so that a number in the
report and a row of the CSV always refer to the same recorded command: the command whose receive
time is nearest to when the action was ready, within ``MAX_GAP_MS`` (ties: the earlier one).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...bags.commands import command_vector
from ...bags.reader import Bag
from ...config import Settings
from ...runtime.action_output import TWIST_FIELDS
from ...runtime.clock import NS_PER_MS

MAX_GAP_MS = 500.0


class RecordedCommands:
    """A command topic's messages as (receive time ns, float64 vector, NaN where the message says nothing)."""

    def __init__(self, commands: Sequence[tuple[int, np.ndarray]], msgtype: str | None = None,
                 labels: Sequence[str] = ()) -> None:
        self.times = np.array([t for t, _ in commands], dtype=np.int64)
        self.vectors = [np.asarray(v, dtype=np.float64) for _, v in commands]
        self.msgtype = msgtype
        self.labels = tuple(labels)  # what each dimension is, with its unit where the type says (Twist)
        self.width = max((v.size for v in self.vectors), default=0)

    @classmethod
    def read(cls, bag: Bag, topic: str | None, settings: Settings) -> RecordedCommands:
        """The commands on ``topic`` mapped back to the action space (none for no topic)."""
        if topic is None:
            return cls([])
        publisher = settings["action_publisher"]
        msgtype = bag.topics[topic].msgtype
        commands = [(m.time_ns, command_vector(m.msg, m.msgtype, twist_dims=publisher["twist_dims"],
                                               joint_names=publisher["joint_names"]))
                    for m in bag.messages([topic])]
        return cls(commands, msgtype, dimension_labels(msgtype, publisher["twist_dims"], publisher["joint_names"]))

    def nearest(self, t_ns: int) -> int | None:
        """Index of the command nearest to ``t_ns`` within ``MAX_GAP_MS``, or None."""
        if not len(self.times):
            return None
        i = int(np.searchsorted(self.times, t_ns))
        best = min((j for j in (i - 1, i) if 0 <= j < len(self.times)), key=lambda j: abs(self.times[j] - t_ns))
        return best if abs(self.times[best] - t_ns) <= MAX_GAP_MS * NS_PER_MS else None

    def label(self, dim: int) -> str:
        """An axis label for action dimension ``dim``: what it is and in which unit."""
        return self.labels[dim] if dim < len(self.labels) and self.labels[dim] else f"action[{dim}] (action units)"


def dimension_labels(msgtype: str, twist_dims: Sequence[int], joint_names: Sequence[str]) -> list[str]:
    """What each action dimension is on a command of ``msgtype``: a Twist component in m/s or rad/s, a joint
    position, or an array entry in the action's own units."""
    if msgtype == "geometry_msgs/msg/Twist":
        labels = [""] * (max(twist_dims) + 1)
        for field, dim in zip(TWIST_FIELDS, twist_dims):
            if dim >= 0:
                labels[dim] = f"action[{dim}] = {field} ({'m/s' if field.startswith('linear') else 'rad/s'})"
        return labels
    if msgtype in ("sensor_msgs/msg/JointState", "trajectory_msgs/msg/JointTrajectory"):
        return [f"action[{dim}] = {name} position (joint units)" for dim, name in enumerate(joint_names)]
    return []
