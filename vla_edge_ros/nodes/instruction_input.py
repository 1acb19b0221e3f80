"""Where new instructions enter the reasoning node: ``instruction_topic`` and the live ``instruction`` parameter.

Both run on the executor thread and hand the text to the configured engine's ``InstructionDesk``
(``runtime/instructions.py``), which checks it in full there and keeps the newest for the reasoning thread.
A refused message is logged (throttled: a flood of bad ones is one line every few seconds) and counted on
diagnostics; a refused parameter value is refused by ``ros2 param set`` itself, with the reason. Either way
the robot keeps its current instruction. While the node is unconfigured there is no desk: a message is
dropped and counted, and a parameter value is kept for the next configure, which reads it as the prompt.

The ``instruction`` parameter holds the last value set through parameters; diagnostics (``instruction``,
``instruction_age_s``) show the instruction actually in force, whichever way it came.
"""

from __future__ import annotations

import time
from typing import Any

from rclpy.node import Node
from rclpy.qos import QoSHistoryPolicy, QoSProfile, QoSReliabilityPolicy
from std_msgs.msg import String

from ..model.instruction import InstructionError
from ..runtime.instructions import InstructionDesk
from .parameters import NodeParameters

_QOS = QoSProfile(history=QoSHistoryPolicy.KEEP_LAST, depth=10, reliability=QoSReliabilityPolicy.RELIABLE)
_LOG_EVERY_S = 5.0


class InstructionInput:
    """The instruction topic and parameter of ``node``; ``desk`` is the configured engine's, or None."""

    def __init__(self, node: Node, params: NodeParameters) -> None:
        self._node = node
        self._params = params
        self.desk: InstructionDesk | None = None
        self.dropped_unconfigured = 0
        subscription = node.create_subscription(String, params["instruction_topic"], self._on_message, _QOS)
        self.topic = subscription.topic_name
        params.validate_with(self._check_parameter, prefix="instruction")
        params.on_change(self._on_parameter)

    def _on_message(self, message: String) -> None:
        desk = self.desk
        if desk is None:
            self.dropped_unconfigured += 1
            return
        try:
            desk.offer(message.data, time.monotonic_ns())
        except InstructionError as exc:
            self._node.get_logger().warning(f"instruction on {self.topic} refused, the current one stays: {exc}",
                                            throttle_duration_sec=_LOG_EVERY_S)

    def _check_parameter(self, values: dict[str, Any]) -> None:
        """Refuse a live ``instruction`` the desk would refuse (the parameter service answers with the reason)."""
        desk = self.desk
        if desk is not None and values["instruction"] != desk.current:
            desk.check(values["instruction"])

    def _on_parameter(self, changed: dict[str, Any]) -> None:
        desk = self.desk
        if desk is None or "instruction" not in changed:
            return
        try:
            desk.offer(changed["instruction"], time.monotonic_ns())
        except InstructionError as exc:  # the check passed a moment ago: only a changed tokenizer gets here
            self._node.get_logger().warning(f"instruction parameter refused, the current one stays: {exc}")
