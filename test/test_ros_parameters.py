"""Parameters through the real set_parameters service, which is what `ros2 param set` calls."""

from __future__ import annotations

import pytest

rclpy = pytest.importorskip("rclpy")

from rcl_interfaces.msg import Parameter as ParameterMsg  # noqa: E402
from rcl_interfaces.msg import ParameterType, ParameterValue  # noqa: E402
from rcl_interfaces.srv import DescribeParameters, SetParameters  # noqa: E402
from rclpy.node import Node  # noqa: E402

from ros_graph import call, private_graph  # noqa: E402
from vla_edge_ros.config import defaults  # noqa: E402
from vla_edge_ros.nodes.parameters import NodeParameters  # noqa: E402

pytestmark = pytest.mark.ros


def _value(value) -> ParameterValue:
    if isinstance(value, bool):
        return ParameterValue(type=ParameterType.PARAMETER_BOOL, bool_value=value)
    if isinstance(value, int):
        return ParameterValue(type=ParameterType.PARAMETER_INTEGER, integer_value=value)
    if isinstance(value, float):
        return ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=value)
    return ParameterValue(type=ParameterType.PARAMETER_STRING, string_value=value)


@pytest.fixture
def reasoning():
    """A node named like the real one, its parameters, and a client for its services."""
    with private_graph() as (context, executor):
        node = Node("reasoning", context=context)
        params = NodeParameters(node, "reasoning", defaults()["reasoning"])
        user = Node("user", context=context)
        executor.add_node(node)
        executor.add_node(user)

        def set_param(name, value):
            client = user.create_client(SetParameters, "/reasoning/set_parameters")
            request = SetParameters.Request(parameters=[ParameterMsg(name=name, value=_value(value))])
            return call(executor, client, request).results[0]

        def describe(name):
            client = user.create_client(DescribeParameters, "/reasoning/describe_parameters")
            return call(executor, client, DescribeParameters.Request(names=[name])).descriptors[0]

        yield params, set_param, describe
        node.destroy_node()
        user.destroy_node()


def test_valid_value_applies_and_listeners_hear_it(reasoning):
    params, set_param, _ = reasoning
    heard = []
    params.on_change(heard.append)
    result = set_param("deadline_ms", 25.0)
    assert result.successful, result.reason
    assert params["deadline_ms"] == 25.0 and heard == [{"deadline_ms": 25.0}]


def test_integer_for_a_double_gets_an_answer_a_user_understands(reasoning):
    params, set_param, _ = reasoning
    result = set_param("deadline_ms", 33)  # what `ros2 param set /reasoning deadline_ms 33` sends
    if hasattr(Node, "add_pre_set_parameters_callback"):
        assert result.successful, result.reason
        assert params["deadline_ms"] == 33.0 and isinstance(params["deadline_ms"], float)
    else:  # Humble: rclpy's own answer
        assert not result.successful and "Wrong parameter type" in result.reason


@pytest.mark.parametrize("name, value, reason", [
    ("deadline_ms", 0.5, "out of range"),  # rclpy enforces the declared range ...
    ("margin_k", -1.0, "out of range"),
    ("warmup_cycles", 0, "out of range"),
    ("deadline_ms", "fast", "Wrong parameter type"),
    ("model_dir", "/elsewhere", "read-only"),
    ("backend", "numpy", "read-only"),
])
def test_invalid_values_are_rejected_with_a_reason_and_change_nothing(reasoning, name, value, reason):
    params, set_param, _ = reasoning
    before = dict(params.values)
    result = set_param(name, value)
    assert not result.successful
    assert reason in result.reason
    assert params.values == before


def test_in_process_set_parameters_gets_the_same_checks():
    """A node's own code changing a parameter goes through the same validation as the service."""
    with private_graph() as (context, executor):
        node = Node("reasoning", context=context)
        params = NodeParameters(node, "reasoning", defaults()["reasoning"])
        from rclpy.parameter import Parameter

        result = node.set_parameters([Parameter("ema_alpha", Parameter.Type.DOUBLE, 2.0)])[0]
        assert not result.successful and "out of range" in result.reason
        assert params["ema_alpha"] == 0.1
        node.destroy_node()


def test_descriptors_carry_description_range_and_read_only(reasoning):
    _, _, describe = reasoning
    deadline = describe("deadline_ms")
    assert "deadline" in deadline.description and not deadline.read_only
    assert deadline.floating_point_range[0].from_value == 1.0
    assert describe("model_dir").read_only
    assert "one of auto, numpy, cuda" in describe("backend").additional_constraints
    assert "each in [0, 2.14748e+09]" in describe("prompt_token_ids").additional_constraints
    cap = describe("vision_max_pixels")  # a schema parameter needs no ROS code of its own to be declared
    assert cap.read_only and "pixels" in cap.description
    assert (cap.integer_range[0].from_value, cap.integer_range[0].to_value) == (784, 8192 * 8192)


def test_command_line_overrides_apply_to_live_parameters_and_never_to_read_only_ones():
    """`--ros-args -p` reaches a live knob (checked by the schema); a read-only one keeps the config file's value,
    since the engine was built from it, and the node says so."""
    from rclpy.parameter import Parameter

    from vla_edge_ros.config import ConfigError

    with private_graph() as (context, _):
        overrides = [Parameter("deadline_ms", value=25.0), Parameter("kv_capacity_tokens", value=99)]
        node = Node("reasoning", context=context, parameter_overrides=overrides)
        params = NodeParameters(node, "reasoning", defaults()["reasoning"])
        assert params["deadline_ms"] == 25.0
        assert params["kv_capacity_tokens"] == node.get_parameter("kv_capacity_tokens").value == 512
        node.destroy_node()
        bad = Node("reasoning", context=context, parameter_overrides=[Parameter("deadline_ms", value=-1.0)])
        with pytest.raises(ConfigError, match="/reasoning: .*deadline_ms out of range"):
            NodeParameters(bad, "reasoning", defaults()["reasoning"])
        bad.destroy_node()
