"""Bags without rosbag2: read any bag rosbags opens (reader.py), command messages as action vectors
(commands.py), write deterministic sample bags (writer.py, scenarios.py)."""

from .commands import command_vector
from .reader import COMMAND_MSGTYPES, IMAGE_MSGTYPES, Bag, BagError, BagMessage, TopicInfo

__all__ = ["COMMAND_MSGTYPES", "IMAGE_MSGTYPES", "Bag", "BagError", "BagMessage", "TopicInfo", "command_vector"]
