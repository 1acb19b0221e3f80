"""The action publisher: the tick decision without ROS, then the node on a private DDS graph.

The decision tests are exact: a safe stop that is almost zero, or a clip that is almost the limit,
is a bug. The graph tests check what a robot would see on the wire, through the real services, with
checks that hold however busy the machine is (ticks may come late, never early); how soon a stale
action becomes a stop is checked on the virtual clock in test_driver.py.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import pytest

from vla_edge_ros.config import ConfigError, OutputKnobs, defaults
from vla_edge_ros.runtime.action_output import (
    ActionOutput,
    Outcome,
    age_outcome,
    clip,
    joint_positions,
    twist_components,
)
from vla_edge_ros.runtime.action_slot import ActionSlot, TimedAction, frozen_chunk

try:
    import rclpy
except ImportError:  # the decision tests above the graph still run
    rclpy = None



def needs_ros(test):
    """A graph test: marked ros, skipped where rclpy is not installed."""
    return pytest.mark.ros(pytest.mark.skipif(rclpy is None, reason="rclpy is not installed")(test))


MS = 1_000_000
NOW = 10_000 * MS


def output_for(command_type: str, twist_dims: list[int], joint_names: list[str]) -> ActionOutput:
    """An ActionOutput; an empty list keeps the schema's default (the command type does not read it)."""
    values = {"command_type": command_type, "twist_dims": twist_dims, "joint_names": joint_names}
    return ActionOutput(OutputKnobs.of({name: value for name, value in values.items() if value != []}))


def limits(timeout_ms: float, action_min: list[float], action_max: list[float]) -> OutputKnobs:
    """The live knobs a tick reads: the action timeout and the clip limits."""
    return OutputKnobs.of({"action_timeout_ms": timeout_ms, "action_min": action_min, "action_max": action_max})


def _action(values, age_ms: float = 0.0) -> TimedAction:
    """One action (a chunk of one) that became ready ``age_ms`` before NOW, for an observation at that time."""
    ready = NOW - int(age_ms * MS)
    return TimedAction(frozen_chunk(values), ready, 0, ready)


# --- the decision, without ROS -------------------------------------------------------------------


def test_age_decides_fresh_stale_or_none_and_the_timeout_itself_is_still_fresh():
    assert age_outcome(None, NOW, 200.0) == (Outcome.NONE, None)
    assert age_outcome(_action([0.0], age_ms=200.0), NOW, 200.0) == (Outcome.FRESH, 200.0)
    stale = TimedAction(frozen_chunk(np.zeros(1)), NOW - 200 * MS - 1, 0, NOW - 200 * MS - 1)
    assert age_outcome(stale, NOW, 200.0) == (Outcome.STALE, 200.000001)


def test_one_limit_applies_to_every_dimension_and_a_list_applies_per_dimension():
    values = np.array([-3.0, -0.5, 0.25, 2.0])
    assert clip(values, [-1.0], [1.0]).tolist() == [-1.0, -0.5, 0.25, 1.0]
    assert clip(values, [-4.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.5]).tolist() == [-3.0, 0.0, 0.0, 1.5]


@pytest.mark.parametrize("low, high, message", [
    ([-1.0, -1.0], [1.0], "action_min has 2 values but the action has 3 dimensions"),
    ([-1.0], [1.0, 1.0, 1.0, 1.0], "action_max has 4 values but the action has 3 dimensions"),
    ([], [1.0], "action_min has 0 values"),
    ([0.5, -1.0, -1.0], [0.0], "action_min is above action_max in dimension 0 (0.5 > 0)"),
])
def test_limits_that_do_not_fit_the_action_are_configuration_errors(low, high, message):
    with pytest.raises(ConfigError) as error:
        clip(np.zeros(3), low, high)
    assert message in str(error.value)


def test_twist_takes_the_named_dimensions_and_minus_one_is_zero():
    values = np.array([0.1, 0.2, 0.3])
    assert twist_components(values, [2, -1, 0, -1, 1, -1]) == (0.3, 0.0, 0.1, 0.0, 0.2, 0.0)
    with pytest.raises(ConfigError, match="maps angular.x to action dimension 3, but the action has only 3"):
        twist_components(values, [0, 1, 2, 3, -1, -1])


def test_joint_positions_need_exactly_one_name_per_dimension():
    assert joint_positions(np.array([0.5, -0.5]), ["a", "b"]) == (0.5, -0.5)
    with pytest.raises(ConfigError, match="joint_names has 3 names but the action has 2 dimensions"):
        joint_positions(np.array([0.5, -0.5]), ["a", "b", "c"])


def test_float_array_fresh_is_clipped_and_every_safe_stop_is_zeros_of_the_action_size():
    output = output_for("float32_multi_array", [], [])
    fresh = output.decide(_action([0.5, 2.0, -3.0], age_ms=10.0), NOW, limits(200.0, [-1.0], [1.0]))
    assert (fresh.outcome, fresh.values, fresh.age_ms) == (Outcome.FRESH, (0.5, 1.0, -1.0), 10.0)
    assert not fresh.safe_stop
    stale = output.decide(_action([0.5, 2.0, -3.0], age_ms=250.0), NOW, limits(200.0, [-1.0], [1.0]))
    assert (stale.outcome, stale.values, stale.age_ms) == (Outcome.STALE, (0.0, 0.0, 0.0), 250.0)
    assert stale.safe_stop
    none = output.decide(None, NOW, limits(200.0, [-1.0], [1.0]))
    assert (none.outcome, none.values, none.age_ms) == (Outcome.NONE, (), None)
    wrong = output.decide(_action([0.5, 2.0, -3.0]), NOW, limits(200.0, [-1.0, -1.0], [1.0]))
    assert (wrong.outcome, wrong.values) == (Outcome.CONFIG_ERROR, (0.0, 0.0, 0.0))
    assert wrong.error == ("action_min has 2 values but the action has 3 dimensions "
                           "(give one value for all, or one per dimension)")


def test_twist_fresh_is_mapped_after_clipping_and_every_safe_stop_is_a_zero_twist():
    output = output_for("twist", [2, -1, 0, -1, -1, 1], [])
    fresh = output.decide(_action([0.25, 3.0, -0.5]), NOW, limits(200.0, [-1.0], [0.75]))
    assert fresh.values == (-0.5, 0.0, 0.25, 0.0, 0.0, 0.75)
    for action in (None, _action([0.25, 3.0, -0.5], age_ms=201.0)):
        assert output.decide(action, NOW, limits(200.0, [-1.0], [1.0])).values == (0.0,) * 6
    beyond = output_for("twist", [0, 1, 2, 3, 4, 5], []).decide(_action([0.1, 0.2]), NOW, limits(200.0, [-1.0], [1.0]))
    assert (beyond.outcome, beyond.values) == (Outcome.CONFIG_ERROR, (0.0,) * 6)
    assert beyond.error == "twist_dims maps linear.z to action dimension 2, but the action has only 2 dimensions"


def test_joint_trajectory_holds_the_last_commanded_positions_and_publishes_nothing_before_any():
    output = output_for("joint_trajectory", [], ["a", "b"])
    assert output.decide(None, NOW, limits(200.0, [-1.0], [1.0])).values is None
    mismatch = output.decide(_action([0.1, 0.2, 0.3]), NOW, limits(200.0, [-1.0], [1.0]))
    assert (mismatch.outcome, mismatch.values) == (Outcome.CONFIG_ERROR, None)
    assert output.decide(_action([0.5, 1.5]), NOW, limits(200.0, [-1.0], [1.0])).values == (0.5, 1.0)
    stale = output.decide(_action([0.25, 0.25], age_ms=500.0), NOW, limits(200.0, [-1.0], [1.0]))
    assert (stale.outcome, stale.values) == (Outcome.STALE, (0.5, 1.0))
    held = output.decide(_action([0.25, 0.25]), NOW, limits(200.0, [-1.0, -1.0, -1.0], [1.0]))
    assert (held.outcome, held.values) == (Outcome.CONFIG_ERROR, (0.5, 1.0))
    assert output.decide(_action([0.25, -0.75]), NOW, limits(200.0, [-1.0], [1.0])).values == (0.25, -0.75)


def test_an_action_with_nan_or_infinity_is_a_safe_stop_not_a_clip():
    output = output_for("float32_multi_array", [], [])
    for bad in (math.nan, math.inf):
        command = output.decide(_action([0.5, bad]), NOW, limits(200.0, [-1.0], [1.0]))
        assert (command.outcome, command.values) == (Outcome.INVALID, (0.0, 0.0))
        assert "non-finite" in command.error


@pytest.mark.parametrize("command_type, twist_dims, joint_names, message", [
    ("twist", [0, 1, 2], None, "twist_dims must have 6 values, got 3"),
    ("joint_trajectory", None, ["a", "b", "a"], "joint_names must be unique"),
    ("joint_trajectory", None, [], "joint_names must have 1 to 1024 values, got 0"),
    ("pose", None, None, "command_type must be one of"),
])
def test_what_needs_no_action_to_check_is_refused_at_construction(command_type, twist_dims, joint_names, message):
    values = {"command_type": command_type, "twist_dims": twist_dims, "joint_names": joint_names}
    with pytest.raises(ConfigError, match=message):
        ActionOutput(OutputKnobs.of({name: value for name, value in values.items() if value is not None}))


@pytest.mark.parametrize("knobs, dof, message", [
    ({"action_min": [-1.0, -1.0]}, 3, "action_min has 2 values but the action has 3 dimensions"),
    ({"command_type": "twist", "twist_dims": [0, 1, 2, -1, -1, -1]}, 2,
     "twist_dims maps linear.z to action dimension 2, but the action has only 2"),
    ({"command_type": "joint_trajectory", "joint_names": ["a", "b"]}, 3, "joint_names has 2 names but the action has 3"),
])
def test_knobs_that_cannot_serve_the_models_action_are_refused_before_any_tick(knobs, dof, message):
    with pytest.raises(ConfigError, match=message):
        ActionOutput(OutputKnobs.of(knobs), dof)


@pytest.mark.parametrize("values, message", [
    ({"action_min": [float("nan")]}, r"action_min\[0\] must be a finite number"),
    ({"action_max": [float("inf")]}, r"action_max\[0\] must be a finite number"),
    ({"action_min": [0.5], "action_max": [0.1]}, r"action_min is above action_max in dimension 0 \(0.5 > 0.1\)"),
    ({"action_min": [-1.0, -1.0], "action_max": [1.0, 1.0, 1.0]}, "give one value for all dimensions"),
    ({"action_min": []}, "action_min must have 1 to 1024 values, got 0"),
    ({"action_max": [1.0] * 100_000}, "action_max must have 1 to 1024 values, got 100000"),
])
def test_clip_limits_are_finite_ordered_and_of_a_sane_length(values, message):
    with pytest.raises(ConfigError, match=message):
        OutputKnobs.of(values)


# --- the node, on a private DDS graph ------------------------------------------------------------

if rclpy is not None:
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
    from geometry_msgs.msg import Twist
    from rcl_interfaces.msg import ParameterType, ParameterValue
    from rcl_interfaces.msg import Parameter as ParameterMsg
    from rcl_interfaces.srv import SetParameters
    from rclpy.node import Node
    from rclpy.parameter import Parameter
    from std_msgs.msg import Float32MultiArray
    from trajectory_msgs.msg import JointTrajectory

    from ros_graph import WAIT_S, call, private_graph
    from vla_edge_ros.nodes.action_publisher import ActionPublisher


class Graph:
    """An action publisher under test, a probe node listening to it, and a way to spin both."""

    def __init__(self, context, executor) -> None:
        self.context, self.executor = context, executor
        self.probe = Node("probe", context=context)
        executor.add_node(self.probe)
        self.nodes = [self.probe]

    def start(self, slot: ActionSlot, **overrides) -> ActionPublisher:
        """An active action publisher with the defaults, commanding float arrays unless ``overrides`` say
        otherwise."""
        node = self.create(slot, **overrides)
        node.transition("configure")
        node.transition("activate")
        return node

    def create(self, slot: ActionSlot, **overrides) -> ActionPublisher:
        """``start``'s publisher as it comes up: unconfigured."""
        settings = {**defaults()["action_publisher"], "command_type": "float32_multi_array", **overrides}
        node = ActionPublisher(slot, settings, context=self.context)
        self.executor.add_node(node)
        self.nodes.append(node)
        return node

    def listen(self, msg_type, topic: str, qos=10) -> list[tuple[int, object]]:
        """Every message on ``topic`` with its monotonic arrival time."""
        heard: list[tuple[int, object]] = []
        self.probe.create_subscription(msg_type, topic, lambda msg: heard.append((time.monotonic_ns(), msg)), qos)
        return heard

    def spin_until(self, done: Callable[[], bool], timeout_s: float | None = None) -> bool:
        """Spin until ``done()``; False if it still does not hold after ``timeout_s`` (default: WAIT_S)."""
        deadline = time.monotonic() + (WAIT_S if timeout_s is None else timeout_s)
        while not done():
            if time.monotonic() > deadline:
                return False
            self.executor.spin_once(timeout_sec=0.01)
        return True

    def set_param(self, name: str, value: float | list[float]):
        """What `ros2 param set /action_publisher NAME VALUE` does."""
        if isinstance(value, list):
            parameter = ParameterValue(type=ParameterType.PARAMETER_DOUBLE_ARRAY, double_array_value=value)
        else:
            parameter = ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=value)
        client = self.probe.create_client(SetParameters, "/action_publisher/set_parameters")
        request = SetParameters.Request(parameters=[ParameterMsg(name=name, value=parameter)])
        result = call(self.executor, client, request).results[0]
        assert result.successful, result.reason


@pytest.fixture
def graph():
    with private_graph() as (context, executor):
        graph = Graph(context, executor)
        yield graph
        for node in graph.nodes:
            node.destroy_node()


def _now_slot(values) -> ActionSlot:
    slot = ActionSlot()
    now = time.monotonic_ns()
    slot.put(np.array(values), now, 0, now)
    return slot


@needs_ros
def test_a_fresh_action_is_published_clipped_as_a_float_array(graph):
    heard = graph.listen(Float32MultiArray, "/vla/command")
    graph.start(_now_slot([0.5, 2.0, -3.0]), control_rate_hz=50.0, action_timeout_ms=60000.0)
    assert graph.spin_until(lambda: heard)
    msg = heard[0][1]
    assert list(msg.data) == [0.5, 1.0, -1.0]
    assert (msg.layout.dim[0].label, msg.layout.dim[0].size) == ("action", 3)


@needs_ros
def test_twist_fields_come_from_twist_dims(graph):
    heard = graph.listen(Twist, "/cmd_vel")
    graph.start(_now_slot([0.25, 3.0, -0.5]), command_topic="/cmd_vel", command_type="twist",
                twist_dims=[2, -1, 0, -1, -1, 1], action_max=[0.75], control_rate_hz=50.0,
                action_timeout_ms=60000.0)
    assert graph.spin_until(lambda: heard)
    msg = heard[0][1]
    assert (msg.linear.x, msg.linear.y, msg.linear.z) == (-0.5, 0.0, 0.25)
    assert (msg.angular.x, msg.angular.y, msg.angular.z) == (0.0, 0.0, 0.75)


@needs_ros
def test_joint_trajectory_names_positions_stamp_and_one_period_ahead(graph):
    heard = graph.listen(JointTrajectory, "/arm/joint_trajectory")
    graph.start(_now_slot([0.5, -2.0, 0.125]), command_topic="/arm/joint_trajectory",
                command_type="joint_trajectory", joint_names=["shoulder", "elbow", "wrist"],
                control_rate_hz=20.0, action_timeout_ms=60000.0)
    assert graph.spin_until(lambda: heard)
    msg = heard[0][1]
    assert list(msg.joint_names) == ["shoulder", "elbow", "wrist"]
    assert len(msg.points) == 1 and list(msg.points[0].positions) == [0.5, -1.0, 0.125]
    assert (msg.points[0].time_from_start.sec, msg.points[0].time_from_start.nanosec) == (0, 50_000_000)
    assert msg.header.stamp.sec > 0


@needs_ros
def test_a_stale_action_turns_into_a_zero_array_within_one_timeout_and_one_period(graph):
    heard = graph.listen(Float32MultiArray, "/vla/command")
    slot = ActionSlot()
    graph.start(slot, control_rate_hz=50.0, action_timeout_ms=300.0)
    ready_ns = time.monotonic_ns()
    slot.put(np.array([0.5, -0.5]), ready_ns, 0, ready_ns)
    assert graph.spin_until(lambda: [list(m.data) for t, m in heard if t > ready_ns].count([0.0, 0.0]) >= 3)
    after = [(t, list(m.data)) for t, m in heard if t > ready_ns]
    first_stop = next(i for i, (_, data) in enumerate(after) if data == [0.0, 0.0])
    assert [0.5, -0.5] in [data for _, data in after[:first_stop]]  # the action, while it was fresh
    assert all(data == [0.0, 0.0] for _, data in after[first_stop:])  # then stops, and only stops
    # Never before the timeout (a tick can be late on a busy machine, never early). That the stop comes
    # within one timeout and one period is checked on the virtual clock, test_driver.py.
    assert after[first_stop][0] - ready_ns > 300 * MS


@needs_ros
def test_a_live_action_timeout_through_the_parameter_service_applies_on_the_next_tick(graph):
    heard = graph.listen(Float32MultiArray, "/vla/command")
    slot = ActionSlot()
    second_ago = time.monotonic_ns() - 1000 * MS
    slot.put(np.array([0.5]), second_ago, 0, second_ago)  # a second old
    node = graph.start(slot, control_rate_hz=50.0, action_timeout_ms=60000.0)
    assert graph.spin_until(lambda: heard) and list(heard[-1][1].data) == [0.5]
    for timeout_ms, outcome, data in ((500.0, "stale", [0.0]), (5000.0, "fresh", [0.5])):
        graph.set_param("action_timeout_ms", timeout_ms)
        # Only this test spins the executor, so no tick runs between the answer and the next spin: the
        # next tick's decision is the node's next count, and it must already follow the new timeout.
        ticks = node.figures()
        assert graph.spin_until(lambda: node.figures()["published"] > ticks["published"])
        assert node.figures()[outcome] == ticks[outcome] + 1
        heard.clear()  # on the wire: messages still in flight carry the old decision, then only the new one
        assert graph.spin_until(lambda: [list(m.data) for _, m in heard].count(data) >= 2)
        first = next(i for i, (_, m) in enumerate(heard) if list(m.data) == data)
        assert all(list(m.data) == data for _, m in heard[first:])


@needs_ros
def test_a_live_control_rate_through_the_parameter_service_recreates_the_timer(graph):
    heard = graph.listen(JointTrajectory, "/vla/command")
    graph.start(_now_slot([0.0] * 7), command_type="joint_trajectory", control_rate_hz=2.0,
                action_timeout_ms=60000.0)
    assert graph.spin_until(lambda: heard)
    assert heard[0][1].points[0].time_from_start.nanosec == 500_000_000
    node = next(n for n in graph.nodes if isinstance(n, ActionPublisher))
    graph.set_param("control_rate_hz", 100.0)
    # the 2 Hz timer is gone and a 100 Hz one ticks (beside the 1 Hz diagnostics timer); counting messages
    # in a time window instead would fail on a busy machine
    assert sorted(t.timer_period_ns for t in node.timers) == [10_000_000, 1_000_000_000]
    heard.clear()
    assert graph.spin_until(lambda: len(heard) >= 5)
    assert {m.points[0].time_from_start.nanosec for _, m in heard[1:]} == {10_000_000}  # [0]: maybe in flight


@needs_ros
def test_diagnostics_report_error_during_a_safe_stop_and_ok_once_fresh(graph):
    diagnostics = graph.listen(DiagnosticArray, "/diagnostics")
    slot = ActionSlot()
    graph.start(slot, control_rate_hz=50.0, action_timeout_ms=60000.0)
    assert graph.spin_until(lambda: diagnostics)
    status = diagnostics[-1][1].status[0]
    values = {kv.key: kv.value for kv in status.values}
    assert status.name == "vla_edge_ros: action_publisher"
    assert (status.level, status.message) == (
        DiagnosticStatus.ERROR, "safe stop: no action from reasoning (none yet, or reasoning is not active)")
    # every tick so far was a safe stop for want of an action, and was published (however many ticks a
    # busy machine managed in the second before the first report)
    assert int(values["safe_stops"]) == int(values["no_action"]) == int(values["published"]) >= 1
    assert values["fresh"] == "0" and values["last_action_age_ms"] == "none"
    put_ns = time.monotonic_ns()
    slot.put(np.array([0.5]), put_ns, 0, put_ns)
    assert graph.spin_until(lambda: diagnostics[-1][1].status[0].level == DiagnosticStatus.OK)
    values = {kv.key: kv.value for kv in diagnostics[-1][1].status[0].values}
    assert int(values["fresh"]) > 0  # the age a tick saw: of this action, so no older than it is now
    assert 0.0 <= float(values["last_action_age_ms"]) <= (time.monotonic_ns() - put_ns) / MS


@needs_ros
def test_a_configuration_error_is_a_safe_stop_an_error_status_and_one_log_line(graph, capfd):
    """The log line is read where the node writes it (stderr), not over /rosout: /rosout keeps a line for 10 s,
    and on a loaded machine a listener may match the new node's /rosout later than that (seen in the suite)."""
    commands = graph.listen(Float32MultiArray, "/vla/command")
    diagnostics = graph.listen(DiagnosticArray, "/diagnostics")
    node = graph.start(_now_slot([0.5, 2.0, -3.0]), action_min=[-1.0, -1.0], control_rate_hz=50.0,
                       action_timeout_ms=60000.0)
    written: list[str] = []

    def lines() -> list[str]:
        written.extend(capfd.readouterr().err.splitlines())
        return [line for line in written if "[action_publisher]" in line and "configuration error" in line]

    assert graph.spin_until(lambda: diagnostics and commands and lines())  # ticks ran, none of them raised
    assert {tuple(m.data) for _, m in commands} == {(0.0, 0.0, 0.0)}
    status = diagnostics[-1][1].status[0]
    assert status.level == DiagnosticStatus.ERROR
    assert status.message.startswith("safe stop: configuration error: action_min has 2 values")
    values = {kv.key: kv.value for kv in status.values}
    assert int(values["config_errors"]) == int(values["safe_stops"]) >= 1 and values["fresh"] == "0"
    assert graph.spin_until(lambda: node.figures()["config_errors"] >= 10)
    assert len(lines()) == 1  # one line, however many ticks

    # Fixed live: the next tick commands the action.
    fixed = node.set_parameters([Parameter("action_min", Parameter.Type.DOUBLE_ARRAY, [-1.0])])[0]
    assert fixed.successful, fixed.reason
    commands.clear()
    assert graph.spin_until(lambda: len(commands) >= 2)
    assert list(commands[-1][1].data) == [0.5, 1.0, -1.0]


@needs_ros
def test_live_clip_limits_through_the_parameter_service(graph):
    commands = graph.listen(Float32MultiArray, "/vla/command")
    graph.start(_now_slot([0.5, 2.0, -3.0]), control_rate_hz=50.0, action_timeout_ms=60000.0)
    graph.set_param("action_max", [0.25])
    commands.clear()
    assert graph.spin_until(lambda: len(commands) >= 2)
    assert list(commands[-1][1].data) == [0.25, 0.25, -1.0]


@needs_ros
def test_a_live_change_that_cannot_serve_the_action_is_refused_with_the_reason(graph):
    """Knobs that depend on each other or on the model's action are checked on every change, not at a tick."""
    node = ActionPublisher(_now_slot([0.5, 2.0, -3.0]), {**defaults()["action_publisher"],
                                                         "command_type": "float32_multi_array"},
                           dof=lambda: 3, context=graph.context)
    graph.nodes.append(node)
    refused = node.set_parameters([Parameter("action_min", Parameter.Type.DOUBLE_ARRAY, [2.0])])[0]
    assert not refused.successful and "action_min is above action_max in dimension 0" in refused.reason
    refused = node.set_parameters([Parameter("action_max", Parameter.Type.DOUBLE_ARRAY, [1.0, 1.0])])[0]
    assert not refused.successful and "action_max has 2 values but the action has 3 dimensions" in refused.reason
    refused = node.set_parameters([Parameter("action_max", Parameter.Type.DOUBLE_ARRAY, [float("nan")])])[0]
    assert not refused.successful and "must be a finite number" in refused.reason
    accepted = node.set_parameters([Parameter("action_max", Parameter.Type.DOUBLE_ARRAY, [1.0, 0.5, 0.25])])[0]
    assert accepted.successful, accepted.reason


@needs_ros
def test_only_an_active_publisher_commands_and_deactivate_sends_one_explicit_stop(graph):
    """Configured but inactive: silent, whatever the slot holds. Active: the action. Deactivated: one stop, then
    silence again; re-activated: the action again."""
    heard = graph.listen(Float32MultiArray, "/vla/command")
    diagnostics = graph.listen(DiagnosticArray, "/diagnostics")
    node = graph.create(_now_slot([0.5, -0.5]), control_rate_hz=50.0, action_timeout_ms=60000.0)
    node.transition("configure")
    assert graph.spin_until(lambda: len(diagnostics) >= 2)  # a second and more: 50 ticks had there been a timer
    assert not heard and node.figures()["published"] == 0
    status = diagnostics[-1][1].status[0]
    assert (status.level, status.message) == (DiagnosticStatus.OK, "inactive: publishing no commands")
    for _ in range(2):
        node.transition("activate")
        assert graph.spin_until(lambda: heard and list(heard[-1][1].data) == [0.5, -0.5])
        node.transition("deactivate")
        published = node.figures()["published"]
        assert graph.spin_until(lambda: len(heard) == published)  # everything sent arrived: the stop, last
        assert list(heard[-1][1].data) == [0.0, 0.0]
        shown = len(diagnostics)
        assert graph.spin_until(lambda: len(diagnostics) >= shown + 2)
        assert len(heard) == node.figures()["published"] == published  # then silence
        assert [t.timer_period_ns for t in node.timers] == [1_000_000_000]  # diagnostics only: no control timer
    assert node.figures()["shutdown_stops"] == 2


@needs_ros
def test_a_trajectory_robot_never_commanded_gets_no_stop_on_deactivate(graph):
    """Zero joint positions are a motion, not a stop: with no position ever commanded there is nothing to hold."""
    node = graph.start(ActionSlot(), command_type="joint_trajectory", control_rate_hz=50.0)
    assert graph.spin_until(lambda: node.figures()["no_action"] >= 3)
    node.transition("deactivate")
    assert node.state == "inactive"
    assert node.figures()["published"] == node.figures()["shutdown_stops"] == 0


@needs_ros
def test_a_new_episode_drops_the_chunks_held_and_blends_none_of_them_into_its_first(graph):
    """``ActionSlot.new_episode`` (what the reasoning node's ~/reset_episode does): the new episode's first chunk is
    commanded as it is, even when it arrives before the publisher ticks again; rtc would otherwise blend the held
    chunk (of the episode before) into its overlap."""
    heard = graph.listen(Float32MultiArray, "/vla/command")
    slot = ActionSlot()
    graph.start(slot, control_rate_hz=50.0, execution="rtc", action_timeout_ms=60000.0, action_min=[-1e6],
                action_max=[1e6])
    obs = time.monotonic_ns()
    slot.put(np.full((500, 1), 7.0, np.float32), obs, 0, obs)
    assert graph.spin_until(lambda: [m for _, m in heard if list(m.data) == [7.0]])
    slot.new_episode()
    now = time.monotonic_ns()
    slot.put(np.full((500, 1), -3.0, np.float32), now, 0, now)  # no tick in between: nothing spins here
    assert graph.spin_until(lambda: len([m for t, m in heard if t > now]) >= 5)
    after = [m.data[0] for t, m in heard if t > now]
    assert set(after) <= {7.0, -3.0} and after[-1] == -3.0, after  # 7.0: only what was already on the wire


@needs_ros
def test_a_chunk_is_executed_one_action_a_tick_after_a_live_switch_and_a_bad_one_never_reaches_the_wire(graph):
    """sync holds a chunk's first action; set live to chunk, the ticks walk through the chunk, each tick's action
    never ahead of its time (a tick may be late, never early). A chunk holding a NaN (not in its first row) is
    rejected, counted and reported, and nothing of it is published."""
    heard = graph.listen(Float32MultiArray, "/vla/command")
    diagnostics = graph.listen(DiagnosticArray, "/diagnostics")
    slot = ActionSlot()
    node = graph.start(slot, control_rate_hz=50.0, execution="sync", action_timeout_ms=60000.0,
                       action_min=[-1e6], action_max=[1e6])
    obs = time.monotonic_ns()
    slot.put(np.arange(500, dtype=np.float32)[:, None], obs, 0, obs)  # action i (= i) is for obs + 20 i ms
    assert graph.spin_until(lambda: len([m for t, m in heard if t > obs and list(m.data) == [0.0]]) >= 3)
    switched = node.set_parameters([Parameter("execution", Parameter.Type.STRING, "chunk")])[0]
    assert switched.successful, switched.reason
    start = time.monotonic_ns()
    assert graph.spin_until(lambda: len({m.data[0] for t, m in heard if t > start}) >= 5)
    walked = [(t, m.data[0]) for t, m in heard if t > start]
    assert all(a <= b for (_, a), (_, b) in zip(walked, walked[1:]))  # forward through the chunk
    assert all(value <= (t - obs) / (20 * MS) for t, value in walked)  # never an action before its time
    assert node.figures()["execution"] == "chunk" and node.figures()["starvation_events"] == 0

    bad = np.arange(1000, 1500, dtype=np.float32)[:, None]
    bad[3, 0] = np.nan
    now = time.monotonic_ns()
    slot.put(bad, now, 0, now)
    assert graph.spin_until(lambda: node.figures()["rejected_nonfinite"] == 1)
    more = len(heard) + 5
    assert graph.spin_until(lambda: len(heard) >= more)
    assert all(math.isfinite(v) and v < 1000 for _, m in heard for v in m.data)
    assert graph.spin_until(lambda: diagnostics and "rejected" in diagnostics[-1][1].status[0].message)
    status = diagnostics[-1][1].status[0]
    assert status.level == DiagnosticStatus.WARN and "nonfinite: action 3 holds nan" in status.message


@needs_ros
def test_the_horizon_the_reasoning_gate_plans_on_follows_the_live_execution_setting(graph):
    """What bringup hands the reasoning node: the timeline's horizon with the slot's newest chunk, None in sync (the
    gate's fixed deadline) and while the publisher is not commanding."""
    slot = ActionSlot()
    node = graph.create(slot, control_rate_hz=50.0, execution="auto", action_min=[-1e6], action_max=[1e6])
    assert node.horizon(10) is None  # unconfigured: nothing is commanded, nothing runs out
    node.transition("configure")
    node.transition("activate")
    obs = time.monotonic_ns()
    slot.put(np.zeros((10, 2), dtype=np.float32), obs, 0, obs)
    horizon = node.horizon(10)
    assert horizon.end_ns == obs + 10 * 20 * MS and horizon.last_ns == 180 * MS  # auto: rtc for 10 actions
    assert horizon.switch_ns == obs + 5 * 20 * MS  # rtc: the next chunk wanted by s = ceil(10 / 2)
    assert node.horizon(1) is None  # auto with one action a cycle: sync
    assert node.set_parameters([Parameter("execution_horizon", Parameter.Type.INTEGER, 4)])[0].successful
    assert node.horizon(10).switch_ns == obs + 4 * 20 * MS and node.horizon(10).last_ns == 180 * MS
    assert node.set_parameters([Parameter("execution", Parameter.Type.STRING, "chunk")])[0].successful
    assert node.horizon(10).last_ns == 60 * MS and node.horizon(10).switch_ns is None  # chunk: the plan ends at s
    assert node.set_parameters([Parameter("execution", Parameter.Type.STRING, "sync")])[0].successful
    assert node.horizon(10) is None
    node.transition("deactivate")
    assert node.horizon(10) is None
