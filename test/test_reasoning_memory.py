"""The memory policy of a running reasoning node, tuned through the real ROS services."""

from __future__ import annotations

import time

import pytest

rclpy = pytest.importorskip("rclpy")

from rcl_interfaces.msg import Parameter as ParameterMsg  # noqa: E402
from rcl_interfaces.msg import ParameterType, ParameterValue  # noqa: E402
from rcl_interfaces.srv import SetParameters  # noqa: E402
from rclpy.node import Node  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402

from ros_graph import WAIT_S, call, private_graph  # noqa: E402
from vla_edge_ros.config import parse_settings  # noqa: E402
from vla_edge_ros.nodes.reasoning import ReasoningNode  # noqa: E402
from vla_edge_ros.runtime.action_slot import ActionSlot  # noqa: E402
from vla_edge_ros.runtime.frame_buffer import FrameBuffer  # noqa: E402
from vla_edge_ros.worlds.synthetic import SyntheticCamera  # noqa: E402

pytestmark = pytest.mark.ros


@pytest.fixture
def graph(tiny_model):
    """A reasoning node starting on cosine, a user node, and helpers to call its services and feed it frames."""
    settings = parse_settings({"reasoning": {"ros__parameters": {
        "model_dir": str(tiny_model), "backend": "numpy", "kv_capacity_tokens": 128,
        # the longest deadline the schema allows: a 33 ms one would have the gate refuse cycles on a loaded
        # machine, and these tests need frames to reach the engine, not the deadline
        "deadline_ms": 1000.0, "kv": {"policy": "cosine", "cosine": {"protect_recent_frames": 2}}}}}, "test.yaml")
    buffer = FrameBuffer(48, 64)
    with private_graph() as (context, executor):
        node = ReasoningNode(buffer, ActionSlot(), settings, context=context)
        user = Node("user", context=context)
        executor.add_node(node)
        executor.add_node(user)
        node.transition("configure")
        node.transition("activate")
        camera = SyntheticCamera(height=48, width=64, seed=2)

        def set_param(name, value):
            kind = {bool: "BOOL", int: "INTEGER", float: "DOUBLE", str: "STRING"}[type(value)]
            field = {bool: "bool_value", int: "integer_value", float: "double_value", str: "string_value"}[type(value)]
            msg = ParameterMsg(name=name, value=ParameterValue(type=getattr(ParameterType, f"PARAMETER_{kind}"),
                                                               **{field: value}))
            client = user.create_client(SetParameters, "/reasoning/set_parameters")
            return call(executor, client, SetParameters.Request(parameters=[msg])).results[0]

        def reset_episode():
            return call(executor, user.create_client(Trigger, "/reasoning/reset_episode"), Trigger.Request())

        def feed_until(condition, timeout_s: float = WAIT_S) -> bool:
            """Frames at 30 Hz until ``condition()``; False if it still does not hold after ``timeout_s``."""
            deadline = time.monotonic() + timeout_s
            while not condition():
                if time.monotonic() > deadline:
                    return False
                buffer.write(camera.frame(), stamp_ns=0, receive_ns=time.monotonic_ns())
                time.sleep(1 / 30)
            return True

        yield node, set_param, reset_episode, feed_until
        node.transition("deactivate")
        node.destroy_node()
        user.destroy_node()


def test_a_live_policy_knob_reaches_the_engine_between_cycles(graph):
    node, set_param, _, feed_until = graph
    result = set_param("kv.cosine.protect_recent_frames", 3)
    assert result.successful, result.reason
    assert feed_until(lambda: node.engine.policy.protect_recent_frames == 3)


def test_a_knob_the_arena_cannot_honour_is_rejected_with_the_reason(graph):
    node, set_param, _, _ = graph
    result = set_param("kv.cosine.protect_recent_frames", 100)
    assert not result.successful
    # 128 slots - 4 prompt - 7 action tokens leave 7 frames of 16 tokens
    assert "protect_recent_frames=100 must be in [0, 6]" in result.reason
    assert node.params["kv.cosine.protect_recent_frames"] == 2


def test_structural_memory_knobs_are_read_only(graph):
    _, set_param, _, _ = graph
    result = set_param("kv.cosine.signature", "values")
    assert not result.successful and "read-only" in result.reason.lower()


def test_a_new_policy_waits_for_the_next_episode(graph):
    node, set_param, reset_episode, feed_until = graph
    assert set_param("kv.policy", "aura").successful
    assert feed_until(lambda: node.engine.memory_stats().frames_seen >= 3)
    assert node.engine.policy.name == "cosine"  # mid-episode: unchanged
    answer = reset_episode()
    assert answer.success and "aura" in answer.message
    assert feed_until(lambda: node.engine.policy.name == "aura" and node.engine.memory_stats().frames_seen >= 1)
    assert node.episodes == 2
    report = {kv.key: kv.value for kv in node.report().values}
    assert report["kv_policy"] == "aura" and report["memory_state_bytes"] == "4224"


def test_dms_runs_live_and_reports_its_compression(graph):
    node, set_param, reset_episode, feed_until = graph
    assert not set_param("kv.dms.target_ratio", 0.5).successful  # 0 or >= 1
    assert set_param("kv.policy", "dms").successful and set_param("kv.dms.target_ratio", 8.0).successful
    assert reset_episode().success
    assert feed_until(lambda: node.engine.policy.name == "dms" and node.engine.memory_stats().frames_seen >= 4)
    assert node.engine.policy.knobs.target_ratio == 8.0
    report = {kv.key: kv.value for kv in node.report().values}
    assert report["kv_policy"] == "dms" and float(report["dms_compression"]) > 1.0


def test_a_policy_the_checkpoint_cannot_run_is_refused_before_it_is_set(graph, monkeypatch):
    node, set_param, _, _ = graph
    monkeypatch.delitem(node.engine.checkpoint.tensors, "aura.k_proj.weight")
    result = set_param("kv.policy", "aura")
    assert not result.successful and "kv.policy aura needs tensors" in result.reason


def test_a_gate_change_builds_and_checks_no_policy_a_memory_change_checks_without_building(graph, monkeypatch):
    """A parameter change validates what it touches: deadline_ms runs no memory check at all, a kv.* change
    checks every policy's knobs against the engine's site without constructing or attaching a policy."""
    import vla_edge_ros.memory.base as base
    import vla_edge_ros.nodes.reasoning as reasoning

    node, set_param, _, _ = graph
    checks, attaches = [], []
    real_check = reasoning.check_knobs
    monkeypatch.setattr(reasoning, "check_knobs", lambda *a, **k: checks.append(a) or real_check(*a, **k))
    monkeypatch.setattr(base.MemoryPolicy, "attach", lambda self, context: attaches.append(self))
    assert set_param("deadline_ms", 25.0).successful
    assert node.gate.snapshot().deadline_ms == 25.0 and checks == []
    assert set_param("kv.cosine.protect_recent_frames", 1).successful and len(checks) == 1
    assert not set_param("kv.cosine.protect_recent_frames", 100).successful and len(checks) == 2
    assert attaches == []
