"""Which topic of a bag holds the robot's state, for a checkpoint that reads one (its ``vla.state``).

Replay feeds the state as the live camera node does (``session.py``: ``Driver.state``, the same reader and
the same pairing), so only the topic is replay's to find. ``camera_subscriber.state_topic`` names it, of the
type ``state_type`` says; a relative name is the root namespace's, as a recorder names topics (``odom`` is
``/odom``). With ``state_topic`` empty, a bag with exactly one nav_msgs/Odometry topic gives it, read as
odometry: what ``make-bag`` and ``evaluate --record`` write, so their bags replay with the default config.
Anything else is a clear error: a BagError for what this bag lacks, a ValueError for what no bag could
give (a state of another size than odometry's with ``state_topic`` empty).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...bags.reader import Bag, BagError
from ...config import ObservationKnobs, Settings
from ...model.config import StateConfig
from ...runtime.robot_state import ODOMETRY_STATE

STATE_MSGTYPES = {"joint_state": "sensor_msgs/msg/JointState", "odometry": "nav_msgs/msg/Odometry"}
"""The message type of each ``state_type``."""


@dataclass(frozen=True)
class StateSource:
    """The bag's topic holding the robot's state, and how to read it."""

    topic: str
    state_type: str  # a key of STATE_MSGTYPES
    found: bool = False  # picked as the bag's only odometry topic, state_topic being empty

    def describe(self) -> str:
        """For the log and the report: the topic, its type, and why it was chosen when nobody named it."""
        why = ", the bag's only odometry topic, as state_topic is empty" if self.found else ""
        return f"{self.topic} ({STATE_MSGTYPES[self.state_type]}{why})"


def with_state(settings: Settings, source: StateSource | None) -> Settings:
    """``settings`` reading the state from ``source``'s topic (the rest of camera_subscriber as configured);
    unchanged for a model that reads none."""
    if source is None:
        return settings
    return settings.replace("camera_subscriber", {"state_topic": source.topic, "state_type": source.state_type})


def state_source(bag: Bag, knobs: ObservationKnobs, state: StateConfig | None) -> StateSource | None:
    """Where ``bag`` holds the state a checkpoint reading ``state`` needs (None: it reads none; a state_topic
    set for it is refused with the observation, by ``runtime.loader.check_observation``)."""
    if state is None:
        return None
    if knobs.state_topic:
        topic = _recorded_name(bag, knobs.state_topic)
        wanted = STATE_MSGTYPES[knobs.state_type]
        if bag.topics[topic].msgtype != wanted:
            raise BagError(f"{bag.path}: the state topic {topic} carries {bag.topics[topic].msgtype}, and "
                           f"camera_subscriber.state_type {knobs.state_type} reads {wanted}")
        return StateSource(topic, knobs.state_type)
    if state.dim != len(ODOMETRY_STATE):
        raise ValueError(f"camera_subscriber.state_topic is empty, so replay would read a bag's odometry "
                         f"({len(ODOMETRY_STATE)} values: {', '.join(ODOMETRY_STATE)}), and the model reads a state of "
                         f"{state.dim} values: set state_topic, state_type and state_joint_names to the bag's topic "
                         "holding the robot's state")
    odometry = [name for name, info in bag.topics.items() if info.msgtype == STATE_MSGTYPES["odometry"]]
    if len(odometry) != 1:
        raise BagError(f"{bag.path}: the model reads the robot's state and camera_subscriber.state_topic is empty, "
                       f"and the bag has {len(odometry)} nav_msgs/Odometry topics, not one: set state_topic (and "
                       f"state_type) to the bag's state topic (its state topics: {_state_topics(bag)})")
    return StateSource(odometry[0], "odometry", found=True)


def _recorded_name(bag: Bag, configured: str) -> str:
    """The bag's topic that is ``configured`` once both are absolute names; BagError when there is none."""
    absolute = "/" + configured.lstrip("/")
    for name in bag.topics:
        if "/" + name.lstrip("/") == absolute:
            return name
    raise BagError(f"{bag.path}: no topic {configured} (camera_subscriber.state_topic), and the model reads the "
                   f"robot's state: its state topics are {_state_topics(bag)}")


def _state_topics(bag: Bag) -> str:
    """The bag's topics of a state type, with their types, or "none"."""
    return ", ".join(f"{name} ({info.msgtype})" for name, info in bag.topics.items()
                     if info.msgtype in STATE_MSGTYPES.values()) or "none"
