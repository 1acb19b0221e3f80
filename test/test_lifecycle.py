"""The managed nodes over DDS, driven the way `ros2 lifecycle` and a lifecycle manager drive them: through the
lifecycle services (ChangeState, GetState, GetAvailableTransitions) from a separate client node."""

from __future__ import annotations

import time

import pytest

rclpy = pytest.importorskip("rclpy")

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus  # noqa: E402
from geometry_msgs.msg import Twist  # noqa: E402
from lifecycle_msgs.msg import Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState, GetAvailableTransitions, GetState  # noqa: E402
from rcl_interfaces.msg import Log  # noqa: E402
from rcl_interfaces.msg import Parameter as ParameterMsg  # noqa: E402
from rcl_interfaces.msg import ParameterType, ParameterValue  # noqa: E402
from rcl_interfaces.srv import SetParameters  # noqa: E402
from rclpy.lifecycle import TransitionCallbackReturn  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402

from ros_graph import WAIT_S, call, private_graph  # noqa: E402
from vla_edge_ros.config import parse_settings  # noqa: E402
from vla_edge_ros.nodes.bringup import Pipeline  # noqa: E402

pytestmark = pytest.mark.ros

MANAGED = ("reasoning", "action_publisher")


def _settings(model_dir, **reasoning):
    # The longest deadline and action timeout: on a busy machine a 33 ms gate refuses every cycle and a short
    # timeout turns actions stale; what is under test is who may command the robot when, not the timing.
    return parse_settings({
        "reasoning": {"ros__parameters": {"model_dir": str(model_dir), "backend": "numpy", "kv_capacity_tokens": 128,
                                          "deadline_ms": 1000.0, **reasoning}},
        "camera_subscriber": {"ros__parameters": {"frame_height": 48, "frame_width": 64}},
        "action_publisher": {"ros__parameters": {"twist_dims": [0, 1, 2, 3, 4, 5], "action_timeout_ms": 60000.0}},
    }, "lifecycle.yaml")


def _moving(message: Twist) -> bool:
    return any((message.linear.x, message.linear.y, message.linear.z,
                message.angular.x, message.angular.y, message.angular.z))


class Operator:
    """A separate node on the graph calling the lifecycle and parameter services, listening to what we command."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.node = Node("operator", context=pipeline.executor.context)
        pipeline.executor.add_node(self.node)
        self.commands: list[Twist] = []
        self.diagnostics: list[DiagnosticStatus] = []
        self.node.create_subscription(Twist, "/vla/command", self.commands.append, 100)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", lambda m: self.diagnostics.extend(m.status), 10)
        self.log: list[str] = []
        self.rosout = self.node.create_subscription(Log, "/rosout", lambda m: self.log.append(f"{m.name}: {m.msg}"),
                                                    QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE,
                                                               durability=DurabilityPolicy.TRANSIENT_LOCAL))
        self._clients = {}

    def _call(self, service_type, name: str, request):
        if name not in self._clients:
            self._clients[name] = self.node.create_client(service_type, name)
        return call(self.pipeline.executor, self._clients[name], request)

    def state(self, node: str) -> str:
        return self._call(GetState, f"/{node}/get_state", GetState.Request()).current_state.label

    def offered(self, node: str) -> set[str]:
        answer = self._call(GetAvailableTransitions, f"/{node}/get_available_transitions",
                            GetAvailableTransitions.Request())
        return {t.transition.label for t in answer.available_transitions}

    def change(self, node: str, label: str = "", transition_id: int = 0) -> bool:
        """`ros2 lifecycle set NODE LABEL`; a raw client may name the transition by id instead."""
        request = ChangeState.Request(transition=Transition(id=transition_id, label=label))
        return self._call(ChangeState, f"/{node}/change_state", request).success

    def set_string(self, node: str, name: str, value: str):
        value = ParameterValue(type=ParameterType.PARAMETER_STRING, string_value=value)
        parameter = ParameterMsg(name=name, value=value)
        return self._call(SetParameters, f"/{node}/set_parameters",
                          SetParameters.Request(parameters=[parameter])).results[0]

    def spin_until(self, done, timeout_s: float = WAIT_S) -> bool:
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                return False
            self.pipeline.executor.spin_once(timeout_sec=0.02)
        return True

    def spin_frames(self, count: int) -> None:
        """Spin while the synthetic camera publishes ``count`` more frames: time for a node to show itself."""
        camera = self.pipeline.nodes[3]
        target = camera.published + count
        assert self.spin_until(lambda: camera.published >= target)


@pytest.fixture
def operator(tiny_model):
    with private_graph() as (context, _):
        pipeline = Pipeline(_settings(tiny_model), context=context, synthetic_camera=True, start_state="unconfigured")
        operator = Operator(pipeline)
        try:
            # /rosout keeps a node's lines for 10 s (its lifespan): on a loaded machine discovery can take longer,
            # so the log is read only once the reasoning node's /rosout publisher has matched
            assert operator.spin_until(lambda: "reasoning" in {info.node_name for info in
                                                               operator.node.get_publishers_info_by_topic("/rosout")})
            yield operator
        finally:
            pipeline.executor.remove_node(operator.node)
            operator.node.destroy_node()
            pipeline.shutdown()


def test_configure_activate_deactivate_reactivate_cleanup_and_configure_again(operator):
    pipeline, commands = operator.pipeline, operator.commands
    publisher = pipeline.publisher
    for node in MANAGED:
        assert operator.state(node) == "unconfigured"
        assert operator.offered(node) == {"configure", "shutdown"}
    assert not operator.change("reasoning", "activate")  # not offered: refused, and the process lives on
    assert not operator.change("reasoning", transition_id=Transition.TRANSITION_ACTIVATE)  # Humble raised here
    assert operator.state("reasoning") == "unconfigured"
    assert operator.spin_until(lambda: "reasoning: refused transition 3: /reasoning is unconfigured and offers "
                                       "configure, shutdown" in operator.log)

    assert all(operator.change(node, "configure") for node in MANAGED)
    assert {operator.state(node) for node in MANAGED} == {"inactive"}
    assert operator.offered("reasoning") == {"activate", "cleanup", "shutdown"}
    operator.spin_frames(15)  # frames arrive, nobody reasons, nothing is commanded
    assert pipeline.reasoning.cycles == 0 and publisher.figures()["published"] == 0 and not commands

    for _ in range(2):  # the second time round: re-activated after deactivate, in the same process
        assert operator.change("reasoning", "activate") and operator.change("action_publisher", "activate")
        assert operator.state("action_publisher") == "active"
        assert operator.spin_until(lambda: any(_moving(m) for m in commands)), "no command moved the robot"
        stops = publisher.figures()["shutdown_stops"]
        assert operator.change("action_publisher", "deactivate")
        assert publisher.figures()["shutdown_stops"] == stops + 1
        assert operator.spin_until(lambda: not _moving(commands[-1]))  # the explicit stop, last on the wire ...
        heard = len(commands)
        operator.spin_frames(15)
        assert len(commands) == heard  # ... and nothing after it: an inactive publisher commands nothing
        assert operator.change("reasoning", "deactivate")
        assert pipeline.slot.latest() is None
        commands.clear()

    assert all(operator.change(node, "cleanup") for node in MANAGED)
    assert {operator.state(node) for node in MANAGED} == {"unconfigured"}
    assert pipeline.reasoning.engine is None
    assert all(operator.change(node, "configure") for node in MANAGED)
    assert {operator.state(node) for node in MANAGED} == {"inactive"}


def test_deactivating_reasoning_alone_stops_the_robot_instead_of_holding_the_last_action(operator):
    """The last action would stay fresh for the whole 60 s action timeout; deactivating reasoning withdraws it,
    so the publisher, still active, commands the stop from its next tick on."""
    commands = operator.commands
    for label in ("configure", "activate"):
        assert all(operator.change(node, label) for node in MANAGED)
    assert operator.spin_until(lambda: any(_moving(m) for m in commands))
    assert operator.change("reasoning", "deactivate")
    heard = len(commands)
    operator.spin_frames(15)
    after = commands[heard:]
    assert len(after) >= 5 and not any(_moving(m) for m in after), [_moving(m) for m in after]
    assert operator.state("action_publisher") == "active"


def test_a_failed_configure_ends_unconfigured_with_the_reason_and_is_fixed_without_a_restart(tiny_model, tmp_path):
    missing = tmp_path / "no_such_model"
    with private_graph() as (context, _):
        pipeline = Pipeline(_settings(missing), context=context, synthetic_camera=True, start_state="unconfigured")
        operator = Operator(pipeline)
        try:
            assert not operator.change("reasoning", "configure")
            assert operator.state("reasoning") == "unconfigured"
            reason = f"configure failed: model directory {missing} does not exist"
            assert pipeline.reasoning.failure == reason
            assert operator.spin_until(lambda: any(s.name == "vla_edge_ros: reasoning" and reason in s.message
                                                   and s.level == DiagnosticStatus.ERROR for s in operator.diagnostics))
            refused = operator.set_string("reasoning", "model_dir", "relative/model")
            assert not refused.successful and "must be an absolute path" in refused.reason
            assert operator.set_string("reasoning", "model_dir", str(tiny_model)).successful
            assert operator.change("reasoning", "configure")
            assert operator.state("reasoning") == "inactive" and pipeline.reasoning.failure is None
            refused = operator.set_string("reasoning", "model_dir", str(missing))  # read at configure: not now
            assert not refused.successful and "read-only while the node is inactive" in refused.reason
            assert "(ros2 lifecycle set /reasoning cleanup)" in refused.reason
        finally:
            pipeline.executor.remove_node(operator.node)
            operator.node.destroy_node()
            pipeline.shutdown()


def test_a_plan_over_budget_fails_configure_and_a_start_in_one_line(tiny_model):
    settings = _settings(tiny_model, budget_bytes=1 << 20)  # the tiny model's weights alone take more
    with private_graph() as (context, _):
        pipeline = Pipeline(settings, context=context, start_state="unconfigured")
        try:
            assert pipeline.reasoning.trigger_configure() == TransitionCallbackReturn.ERROR
            assert pipeline.reasoning.state == "unconfigured"
            assert pipeline.reasoning.failure.startswith(
                "configure failed: configuration does not fit the memory budget")
        finally:
            pipeline.shutdown()
        with pytest.raises(ValueError, match="^configuration does not fit the memory budget"):
            Pipeline(settings, context=context)  # vla-edge run, bringup: the reason, then exit 2
