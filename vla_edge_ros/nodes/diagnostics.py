"""Each node's health on /diagnostics (diagnostic_msgs/DiagnosticArray), once a second."""

from __future__ import annotations

from collections.abc import Callable

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.node import Node

OK, WARN, ERROR = DiagnosticStatus.OK, DiagnosticStatus.WARN, DiagnosticStatus.ERROR


def status(node: Node, level: bytes, message: str, values: dict[str, object]) -> DiagnosticStatus:
    """One node's status: ``vla_edge_ros: <node name>`` with its figures as key/value strings (a node keeps the
    figures themselves in its ``figures()``, for the status line and the run summary)."""
    return DiagnosticStatus(
        level=level, name=f"vla_edge_ros: {node.get_name()}", message=message, hardware_id=node.get_name(),
        values=[KeyValue(key=key, value=f"{value:.3f}" if isinstance(value, float) else str(value))
                for key, value in values.items()],
    )


class DiagnosticsTimer:
    """Publishes ``report()`` on /diagnostics every ``period_s`` of the node's clock."""

    def __init__(self, node: Node, report: Callable[[], DiagnosticStatus], period_s: float = 1.0) -> None:
        self._node = node
        self._report = report
        self._publisher = node.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._timer = node.create_timer(period_s, self._publish)

    def _publish(self) -> None:
        array = DiagnosticArray(status=[self._report()])
        array.header.stamp = self._node.get_clock().now().to_msg()
        self._publisher.publish(array)
