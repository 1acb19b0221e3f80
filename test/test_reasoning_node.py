"""The reasoning node on a real engine: frames in the buffer become actions in the slot, under the gate.

These run live, on the wall clock of a machine that may be busy, so they check what holds at any speed:
which frame is answered, that nothing is taken twice, what the gate counts. The timing itself (actions
within the deadline, no misses, latency percentiles, refusals under an impossible deadline) is checked
exactly on the virtual clock in test_driver.py, with the same buffer, gate and reasoner.
"""

from __future__ import annotations

import time

import pytest

rclpy = pytest.importorskip("rclpy")

from rclpy.parameter import Parameter  # noqa: E402

from ros_graph import WAIT_S, private_graph  # noqa: E402
from vla_edge_ros.config import parse_settings  # noqa: E402
from vla_edge_ros.nodes.reasoning import ReasoningNode  # noqa: E402
from vla_edge_ros.runtime.action_slot import ActionSlot  # noqa: E402
from vla_edge_ros.runtime.admission import Horizon  # noqa: E402
from vla_edge_ros.runtime.frame_buffer import FrameBuffer  # noqa: E402
from vla_edge_ros.worlds.synthetic import SyntheticCamera  # noqa: E402

pytestmark = pytest.mark.ros


def _settings(tiny_model):
    # The longest deadline the schema allows: the tiny model's cycle takes tens of ms on a shared 2-core
    # machine, and a 33 ms deadline would have the gate (rightly) refuse it. What is under test here is the
    # node's wiring; the deadline is the gate's business, tested on the virtual clock.
    return parse_settings({"reasoning": {"ros__parameters": {
        "model_dir": str(tiny_model), "backend": "numpy", "kv_capacity_tokens": 256, "deadline_ms": 1000.0}}},
        "test.yaml")


@pytest.fixture
def reasoning(tiny_model):
    buffer, slot = FrameBuffer(48, 64), ActionSlot()
    with private_graph() as (context, executor):
        node = ReasoningNode(buffer, slot, _settings(tiny_model), context=context)
        executor.add_node(node)
        node.transition("configure")
        node.transition("activate")
        yield node, buffer, slot
        if node.state == "active":
            node.transition("deactivate")
        node.destroy_node()


class Camera:
    """Writes synthetic frames into the buffer, stamped 0, 1, 2, ... and received now."""

    def __init__(self, buffer: FrameBuffer) -> None:
        self.buffer = buffer
        self.frames = SyntheticCamera(height=48, width=64, seed=9)
        self.stamp = -1

    def write(self) -> int:
        self.stamp += 1
        self.buffer.write(self.frames.frame(), stamp_ns=self.stamp, receive_ns=time.monotonic_ns())
        return self.stamp

    def feed_until(self, done, rate_hz: float = 30.0, timeout_s: float = WAIT_S) -> None:
        """Write a frame every 1/rate_hz until ``done()``; fail if it still does not hold after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not done():
            assert time.monotonic() < deadline, f"still not done after {timeout_s:g} s of frames"
            self.write()
            time.sleep(1.0 / rate_hz)


def _wait(done, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _cycle_decisions(stats) -> tuple[int, int]:
    """(cycles the gate started, cycles it turned away as stale or refused): one of the two per frame taken."""
    cycle = stats.kinds["cycle"]
    return cycle.admitted + cycle.warmup + cycle.probes + cycle.recoveries, cycle.refused + stats.stale


def test_the_newest_frame_becomes_an_action_and_no_frame_is_taken_twice(reasoning):
    node, buffer, slot = reasoning
    answered: list[int] = []  # the frame stamp of every action the node hands over, in order
    put = slot.put
    slot.put = lambda chunk, ready_ns, stamp, obs_ns: (answered.append(stamp), put(chunk, ready_ns, stamp, obs_ns))
    camera = Camera(buffer)
    camera.feed_until(lambda: node.actions >= 5)  # a 30 Hz stream: the reasoner takes the newest frame when free
    # Then the stream pauses on its newest frame, which must be the one answered. (Should a busy machine
    # have the gate refuse it, the camera offers another, once the last one had all of WAIT_S to be answered.)
    deadline = time.monotonic() + 5 * WAIT_S
    last = camera.write()
    while not _wait(lambda: slot.latest() is not None and slot.latest().frame_stamp_ns == last, WAIT_S):
        assert time.monotonic() < deadline, "no paused stream's newest frame was ever answered"
        last = camera.write()
    action = slot.latest()
    assert action.values.shape == (7,) and action.frame_stamp_ns == last == camera.stamp
    assert answered == sorted(set(answered)) and answered[-1] == last  # in order, each frame once, no backlog
    frames = buffer.stats()
    assert node.cycles == frames.read and frames.read + frames.dropped + frames.pending == frames.written
    stats = node.gate.snapshot()
    assert node.actions == len(answered) == stats.kinds["cycle"].completed == stats.latency.count
    assert node.engine_errors == 0


def test_an_impossible_deadline_turns_into_refusals_not_misses(reasoning):
    node, buffer, slot = reasoning
    camera = Camera(buffer)
    warmup = node.gate.snapshot().warmup
    camera.feed_until(lambda: node.gate.snapshot().kinds["cycle"].completed >= warmup)  # learn the costs first
    assert node.set_parameters([Parameter("deadline_ms", Parameter.Type.DOUBLE, 1.0)])[0].successful
    assert node.gate.snapshot().deadline_ms == 1.0
    # A cycle already running keeps the deadline it started with; once the gate decides on another frame,
    # that cycle is over (one reasoning thread) and every later decision is made against 1 ms.
    decided = sum(_cycle_decisions(node.gate.snapshot()))
    camera.feed_until(lambda: sum(_cycle_decisions(node.gate.snapshot())) > decided)
    before, before_actions = node.gate.snapshot(), node.actions
    camera.feed_until(lambda: sum(_cycle_decisions(node.gate.snapshot())) >= sum(_cycle_decisions(before)) + 15)
    after = node.gate.snapshot()
    (started_before, turned_away_before), (started_after, turned_away_after) = map(_cycle_decisions, (before, after))
    assert started_after == started_before  # no cycle can finish in 1 ms, so none was started ...
    assert turned_away_after - turned_away_before >= 15  # ... each frame taken was refused (or already stale)
    assert node.actions == before_actions and after.missed == before.missed  # ... and nothing ran late


def test_with_a_horizon_the_loop_waits_for_its_start_time_before_taking_a_frame(reasoning):
    """The horizon (bringup hands over the publisher's) says commands are held for 60 s more: once the cycle's cost
    is learned, the node leaves the newest frame unread instead of computing a chunk now; when the held commands
    run out (nothing held) it takes it at once, with the new chunk's own end as its deadline."""
    node, buffer, slot = reasoning
    camera = Camera(buffer)
    warmup = node.gate.snapshot().warmup
    camera.feed_until(lambda: node.gate.snapshot().kinds["cycle"].completed >= warmup)
    assert node.figures()["deadline"] == "fixed"
    held = [time.monotonic_ns() + 60 * 10**9]
    node.horizon = lambda chunk_rows: Horizon(held[0], 10 * 10**9)
    time.sleep(0.2)  # a cycle that had already started ends
    cycles = node.cycles
    last = camera.write()
    time.sleep(0.3)
    assert node.cycles == cycles and buffer.stats().pending == 1  # waiting: the frame is not taken
    held[0] = None  # every command ran out
    assert _wait(lambda: slot.latest() is not None and slot.latest().frame_stamp_ns == last, WAIT_S)
    figures = node.figures()
    assert figures["horizon_empty_starts"] >= 1 and figures["cycle_predicted_ms"] > 0
    assert figures["deadline"] == "horizon"  # the last cycle's


def test_a_failing_cycle_is_counted_reported_and_survived(reasoning, monkeypatch):
    from vla_edge_ros.nodes.diagnostics import ERROR, OK

    node, buffer, slot = reasoning
    camera = Camera(buffer)
    camera.feed_until(lambda: node.actions >= 1)
    real = node.engine.prefill_frame
    failed_ns: list[int] = []

    def broken(encoded):
        failed_ns.append(time.monotonic_ns())
        raise RuntimeError("boom")

    monkeypatch.setattr(node.engine, "prefill_frame", broken)  # the reasoner encodes, then prefills
    camera.feed_until(lambda: node.engine_errors >= 1 and node.report().level == ERROR)
    monkeypatch.setattr(node.engine, "prefill_frame", real)
    actions = node.actions
    camera.feed_until(lambda: node.actions > actions)  # still reasoning
    assert node.engine_errors == len(failed_ns) >= 1
    # ERROR while a failure is recent (within 1 s), then OK on its own, with no frame needed to clear it
    assert _wait(lambda: node.report().level == OK, WAIT_S)
    assert time.monotonic_ns() - failed_ns[-1] >= 1_000_000_000


def test_deactivate_stops_reasoning_and_withdraws_the_action_and_cleanup_frees_the_engine(reasoning):
    import gc
    import weakref

    node, buffer, slot = reasoning
    camera = Camera(buffer)
    camera.feed_until(lambda: node.actions >= 2)
    node.transition("deactivate")
    assert slot.latest() is None  # an active publisher commands a stop, not this node's last answer
    cycles = node.cycles
    for _ in range(5):
        camera.write()
        time.sleep(0.02)
    assert node.cycles == cycles and buffer.stats().pending == 1  # frames wait, unread: nobody reasons
    engine = weakref.ref(node.engine)
    node.transition("cleanup")
    gc.collect()
    assert engine() is None and node.engine is None and node.figures() == {"state": "unconfigured"}
    node.transition("configure")  # a new engine and counters, in the same process
    node.transition("activate")
    assert node.actions == 0
    camera.feed_until(lambda: node.actions >= 1)


def test_parameters_are_settable_in_every_state_and_read_at_configure_only_while_unconfigured(tiny_model):
    with private_graph() as (context, _):
        node = ReasoningNode(FrameBuffer(48, 64), ActionSlot(), _settings(tiny_model), context=context)
        try:
            live = node.set_parameters([Parameter("deadline_ms", Parameter.Type.DOUBLE, 250.0)])[0]
            assert live.successful, live.reason  # no gate yet: kept for configure
            capacity = node.set_parameters([Parameter("kv_capacity_tokens", Parameter.Type.INTEGER, 192)])[0]
            assert capacity.successful, capacity.reason
            node.transition("configure")
            assert node.gate.snapshot().deadline_ms == 250.0 and node.engine.arena.capacity == 192
            node.transition("activate")
            refused = node.set_parameters([Parameter("kv_capacity_tokens", Parameter.Type.INTEGER, 128)])[0]
            assert not refused.successful
            assert "kv_capacity_tokens is read-only while the node is active" in refused.reason
            assert "while unconfigured (ros2 lifecycle set /reasoning deactivate, then cleanup)" in refused.reason
            assert node.set_parameters([Parameter("deadline_ms", Parameter.Type.DOUBLE, 500.0)])[0].successful
            assert node.gate.snapshot().deadline_ms == 500.0  # live, at once
            node.transition("deactivate")
        finally:
            node.destroy_node()
