"""The reasoning node on a real engine: frames in the buffer become actions in the slot, under the gate."""

from __future__ import annotations

import time

import pytest

rclpy = pytest.importorskip("rclpy")

from rclpy.parameter import Parameter  # noqa: E402

from ros_graph import private_graph  # noqa: E402
from vla_edge_ros.config import parse_settings  # noqa: E402
from vla_edge_ros.nodes.reasoning import ReasoningNode  # noqa: E402
from vla_edge_ros.runtime.action_slot import ActionSlot  # noqa: E402
from vla_edge_ros.runtime.frame_buffer import FrameBuffer  # noqa: E402
from vla_edge_ros.runtime.loader import load_engine  # noqa: E402
from vla_edge_ros.worlds.synthetic import SyntheticCamera  # noqa: E402

pytestmark = pytest.mark.ros


@pytest.fixture
def reasoning(tiny_model):
    settings = parse_settings({"reasoning": {"ros__parameters": {
        "model_dir": str(tiny_model), "backend": "numpy", "kv_capacity_tokens": 256}}}, "test.yaml")
    engine = load_engine(settings).engine
    buffer, slot = FrameBuffer(48, 64), ActionSlot()
    with private_graph() as (context, executor):
        node = ReasoningNode(engine, buffer, slot, settings["reasoning"], context=context)
        executor.add_node(node)
        node.start()
        yield node, buffer, slot
        node.stop()
        node.destroy_node()


def _feed(buffer: FrameBuffer, frames: int, rate_hz: float = 30.0, first_stamp: int = 0,
          until=lambda stamp: False) -> int:
    """Write ``frames`` frames at ``rate_hz``, stopping early once ``until(last stamp written)`` holds;
    return the last stamp written. Tests wait on outcomes, not on fixed sleeps: CI machines are shared."""
    camera = SyntheticCamera(height=48, width=64, seed=9)
    stamp = first_stamp - 1
    for stamp in range(first_stamp, first_stamp + frames):
        buffer.write(camera.frame(), stamp_ns=stamp, receive_ns=time.monotonic_ns())
        time.sleep(1.0 / rate_hz)
        if until(stamp):
            break
    return stamp


def test_frames_become_actions_within_the_deadline(reasoning):
    node, buffer, slot = reasoning
    last = _feed(buffer, 30)
    time.sleep(0.2)
    # a busy machine may refuse the last frame's cycle; then the next frames must be answered instead
    if slot.latest() is None or slot.latest().frame_stamp_ns != last:
        last = _feed(buffer, 100, first_stamp=last + 1,
                     until=lambda stamp: slot.latest() is not None and slot.latest().frame_stamp_ns == stamp)
    action = slot.latest()
    assert action is not None and action.values.shape == (7,)
    assert action.frame_stamp_ns == last  # the newest frame was answered, not a backlog
    stats = node.gate.snapshot()
    assert node.actions >= 20 and stats.missed == 0
    assert stats.latency.p99_ms < 33.0


def test_an_impossible_deadline_turns_into_refusals_not_misses(reasoning):
    node, buffer, slot = reasoning
    _feed(buffer, 10)  # learn the costs first
    assert node.set_parameters([Parameter("deadline_ms", Parameter.Type.DOUBLE, 1.0)])[0].successful
    assert node.gate.snapshot().deadline_ms == 1.0
    time.sleep(0.2)  # a cycle already running keeps the deadline it started with; let it finish
    before_missed, before_actions = node.gate.snapshot().missed, node.actions
    _feed(buffer, 20)
    time.sleep(0.1)
    after = node.gate.snapshot()
    assert node.actions == before_actions  # nothing fits in 1 ms on this machine ...
    assert after.missed == before_missed  # ... and nothing was started that could not finish
    assert after.refused + after.stale >= 15


def test_a_failing_cycle_is_counted_reported_and_survived(reasoning, monkeypatch):
    from vla_edge_ros.nodes.diagnostics import ERROR, OK

    node, buffer, slot = reasoning
    _feed(buffer, 5)
    real = node.engine.add_frame
    monkeypatch.setattr(node.engine, "add_frame", lambda image: (_ for _ in ()).throw(RuntimeError("boom")))
    _feed(buffer, 100, until=lambda stamp: node.engine_errors >= 1)
    assert node.engine_errors >= 1 and node.report().level == ERROR
    monkeypatch.setattr(node.engine, "add_frame", real)
    actions = node.actions
    _feed(buffer, 200, until=lambda stamp: node.actions > actions)
    assert node.actions > actions  # still reasoning
    time.sleep(1.1)
    assert node.report().level == OK  # the failure is no longer recent
