"""Diagnostics that tell the truth about what the robot is getting, judged on a clock the test controls."""

from __future__ import annotations

import re

import pytest

from vla_edge_ros.config import ConfigError, DiagnosticsKnobs, GateKnobs
from vla_edge_ros.runtime.admission import AdmissionGate, BlockKind, Horizon
from vla_edge_ros.runtime.event_window import EventWindow
from vla_edge_ros.runtime.reasoning_health import Level, ReasoningHealth

MS = 1_000_000
S = 1_000_000_000


def test_an_event_window_counts_the_last_window_in_constant_memory():
    window = EventWindow(2.0, slices=20)
    for k in range(1000):  # 100 Hz for 10 s
        window.add("tick", k * 10 * MS)
    now = 10 * S
    assert 200 <= window.counts(now)["tick"] <= 210  # the last 2 s, to one slice (100 ms)
    assert window.rate_hz("tick", now) == pytest.approx(100, rel=0.06)
    assert window.counts(now + 5 * S)["tick"] == 0  # nothing new: the window empties
    assert sum(len(c) for c in window._counts) <= 20  # one counter per slice, however many events came


def test_a_rate_right_after_the_start_divides_by_the_time_covered_not_the_window():
    window = EventWindow(2.0)
    for k in range(15):  # 30 Hz for half a second
        window.add("tick", k * S // 30)
    assert window.rate_hz("tick", S // 2) == pytest.approx(30, rel=0.1)
    assert EventWindow(2.0).rate_hz("tick", S) == 0.0


def _gate(predicted_ms: float) -> AdmissionGate:
    """A gate whose cycle estimate is ``predicted_ms`` (mean, no spread), on a clock the test moves."""
    clock = [0]
    gate = AdmissionGate(GateKnobs.of({"warmup_cycles": 1, "ema_alpha": 1.0}), clock=lambda: clock[0])
    cycle = gate.start_cycle(0)
    clock[0] = round(predicted_ms * MS)
    gate.record(cycle)
    assert gate.admit(BlockKind.DECODE, 10**12)  # the gate works; its snapshot now has a cycle estimate
    return gate


def health(**knobs) -> ReasoningHealth:
    return ReasoningHealth(DiagnosticsKnobs.of({f"diagnostics.{name}": value for name, value in knobs.items()}))


def test_refusals_over_the_window_turn_warn_then_error_and_say_why():
    judge = health(window_s=5.0, refused_warn_share=0.1, refused_error_share=0.5)
    gate = _gate(predicted_ms=41.0).snapshot()
    for k in range(100):  # 3.3 s of frames at 30 Hz: 20 % without an action
        judge.record("refused" if k % 5 == 0 else "acted", k * S // 30)
    warn = judge.judge(100 * S // 30, gate)
    assert warn.level is Level.WARN and warn.shares["refused"] == pytest.approx(0.2)
    assert "no action for 20% of frames over the last 5 s (20 refused, 0 stale)" in warn.message
    assert "predicted cycle 41.0 ms" in warn.message and "33 ms deadline" in warn.message
    for k in range(100, 250):  # now 9 of 10 frames refused
        judge.record("acted" if k % 10 == 0 else "refused", k * S // 30)
    error = judge.judge(250 * S // 30, gate)
    assert error.level is Level.ERROR and error.shares["refused"] > 0.5
    for k in range(250, 450):  # the machine got faster: the old refusals leave the window
        judge.record("acted", k * S // 30)
    assert judge.judge(450 * S // 30, gate).level is Level.OK


def test_with_chunks_refusals_and_misses_are_explained_against_the_horizon_not_deadline_ms():
    gate = _gate(predicted_ms=250.0)
    now = gate.now_ns()
    assert not gate.start_cycle(now, Horizon(end_ns=None, last_ns=200 * MS))  # its chunk would be past
    judge = health()
    judge.record("refused", now)
    message = judge.judge(now, gate.snapshot()).message
    assert "predicted cycle 250.0 ms" in message and "against the new chunk's last action" in message
    assert "10 ms margin" in message and "33 ms" not in message
    assert gate.start_cycle(now, Horizon(end_ns=now + 300 * MS, last_ns=500 * MS))
    judge.record("missed", now)
    assert "deadline the chunk's end (300.0 ms left at the start" in judge.judge(now, gate.snapshot()).message
    assert gate.start_cycle(now, Horizon(end_ns=now + 600 * MS, last_ns=500 * MS, switch_ns=now + 300 * MS))  # rtc
    assert ("deadline the end of the execution horizon, less the 10 ms margin (the chunk held had 600.0 ms left"
            in judge.judge(now, gate.snapshot()).message)


def test_any_miss_warns_by_default_and_a_failure_is_an_error_for_a_second():
    judge = health()
    gate = _gate(predicted_ms=20.0).snapshot()
    for k in range(19):
        judge.record("acted", k * MS)
    judge.record("missed", 19 * MS)
    missed = judge.judge(20 * MS, gate)
    assert missed.level is Level.WARN and "missing the deadline on 5% of frames" in missed.message
    assert "cycle mean 20.0 ms, deadline 33 ms" in missed.message
    judge.record("failed", 30 * MS)
    assert judge.judge(40 * MS, gate).level is Level.ERROR
    assert "cycles failing (1 in the last 5 s)" in judge.judge(40 * MS, gate).message
    assert judge.judge(30 * MS + 2 * S, gate).level is Level.WARN  # the miss is still in the window


def test_thresholds_must_be_ordered_and_a_new_window_starts_afresh():
    with pytest.raises(ConfigError, match="diagnostics.refused_warn_share=0.6 is above"):
        DiagnosticsKnobs.of({"diagnostics.refused_warn_share": 0.6})
    judge = health()
    judge.record("refused", 0)
    judge.configure(DiagnosticsKnobs.of({"diagnostics.window_s": 10.0}))
    assert judge.judge(MS, _gate(10.0).snapshot()).message == "waiting for frames"


# --- the nodes' diagnostics ------------------------------------------------------------------------------


@pytest.mark.ros
def test_the_reasoning_node_reports_error_while_it_refuses_and_says_why(tiny_model):
    import time

    pytest.importorskip("rclpy")
    from diagnostic_msgs.msg import DiagnosticStatus
    from rclpy.parameter import Parameter

    from ros_graph import private_graph
    from vla_edge_ros.config import parse_settings
    from vla_edge_ros.nodes.reasoning import ReasoningNode
    from vla_edge_ros.runtime.action_slot import ActionSlot
    from vla_edge_ros.runtime.frame_buffer import FrameBuffer
    from vla_edge_ros.worlds.synthetic import SyntheticCamera

    settings = parse_settings({"reasoning": {"ros__parameters": {
        "model_dir": str(tiny_model), "backend": "numpy", "kv_capacity_tokens": 128, "warmup_cycles": 1}}}, "t.yaml")
    buffer, camera = FrameBuffer(48, 64), SyntheticCamera(height=48, width=64, seed=4)
    with private_graph() as (context, _):
        node = ReasoningNode(buffer, ActionSlot(), settings, context=context)
        node.transition("configure")
        node.transition("activate")
        try:
            assert node.set_parameters([Parameter("deadline_ms", Parameter.Type.DOUBLE, 1.0)])[0].successful
            deadline = time.monotonic() + 120  # nothing fits in 1 ms: every frame after the first is refused
            while "no action for" not in node.report().message and time.monotonic() < deadline:
                buffer.write(camera.frame(), 0, time.monotonic_ns())
                time.sleep(0.02)
            report = node.report()
            assert report.level == DiagnosticStatus.ERROR, report.message
            assert "no action for" in report.message and "against the 1 ms deadline" in report.message
        finally:
            node.transition("deactivate")
            node.destroy_node()


@pytest.mark.ros
def test_the_publisher_warns_when_its_timer_falls_behind_control_rate_hz():
    import time

    pytest.importorskip("rclpy")
    from diagnostic_msgs.msg import DiagnosticStatus

    from ros_graph import private_graph
    from vla_edge_ros.config import defaults
    from vla_edge_ros.nodes.action_publisher import ActionPublisher
    from vla_edge_ros.runtime.action_slot import ActionSlot

    with private_graph() as (context, _):  # never spun: only the ticks this test writes are counted
        node = ActionPublisher(ActionSlot(), defaults()["action_publisher"], context=context)
        node.transition("configure")
        node.transition("activate")
        start = time.monotonic_ns()
        for k in range(36):  # 18 Hz for 2 s against control_rate_hz 30
            node._ticks.add("tick", start + k * S // 18)
        slow = node.report(start + 2 * S)
        assert slow.level == DiagnosticStatus.ERROR  # no action yet: a safe stop, and ...
        assert re.search(r"publishing at 1[78]\.\d Hz, below 90% of control_rate_hz 30 Hz", slow.message)  # +-1 slice
        values = {kv.key: kv.value for kv in slow.values}
        assert float(values["achieved_rate_hz"]) == pytest.approx(18.0, rel=0.06)
        node.destroy_node()
