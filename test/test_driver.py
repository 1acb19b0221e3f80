"""The offline driver: the live pipeline's pieces on a virtual clock, and the commands they would publish."""

from __future__ import annotations

import re

import numpy as np
import pytest

from vla_edge_ros.config import GateKnobs, OutputKnobs, parse_settings
from vla_edge_ros.runtime.action_output import ActionOutput, Outcome
from vla_edge_ros.runtime.action_slot import TimedAction, frozen_chunk
from vla_edge_ros.runtime.block_costs import parse_cost
from vla_edge_ros.runtime.clock import NS_PER_MS, VirtualClock
from vla_edge_ros.runtime.driver import Driver
from vla_edge_ros.runtime.loader import load_engine
from vla_edge_ros.runtime.reasoner import decode_blocks
from vla_edge_ros.model.init_model import preset, write_random_model
from vla_edge_ros.worlds.synthetic import SyntheticCamera

COSTS = parse_cost("fixed:encode=8ms,decode=1ms")  # a cycle: 8 ms encode + prefill, 6 decode steps of 1 ms


def _settings(tiny_model, reasoning=None, publisher=None):
    return parse_settings({
        "reasoning": {"ros__parameters": {"model_dir": str(tiny_model), "backend": "numpy", "kv_capacity_tokens": 128,
                                          **(reasoning or {})}},
        "action_publisher": {"ros__parameters": {"command_type": "float32_multi_array", **(publisher or {})}}},
        "test.yaml")


def _driver(settings, costs=COSTS) -> Driver:
    return Driver(load_engine(settings).engine, settings, VirtualClock(0), costs, (48, 64))


def _stream(driver: Driver, frames: int, frame_hz: float = 30.0, tick_hz: float = 50.0, start_ns: int = 0,
            end_ns: int | None = None) -> tuple[list[tuple[int, object]], list[tuple[int, object]]]:
    """The live pipeline's schedule on the driver's virtual clock. A camera frame arrives every 1/frame_hz
    from ``start_ns`` (stamp = its index), overwriting an unread one; the reasoner takes the newest frame
    whenever it is free; the publisher decides a command every 1/tick_hz. Returns (start time, cycle) for
    every cycle and (tick time, command) for every tick before ``end_ns`` (default: 1 s after the last frame)."""
    clock = driver.clock
    camera = SyntheticCamera(height=48, width=64, seed=4)
    arrivals = [start_ns + round(i * 1e9 / frame_hz) for i in range(frames)]
    end_ns = arrivals[-1] + 10**9 if end_ns is None else end_ns
    period = round(1e9 / tick_hz)
    tick = -(-start_ns // period)  # the first tick at or after start_ns
    cycles, commands = [], []
    for index, arrival in enumerate(arrivals):
        following = arrivals[index + 1] if index + 1 < frames else end_ns
        driver.camera(camera.frame(), stamp_ns=index, arrival_ns=arrival)
        while True:
            clock.wait_until(arrival)  # an idle reasoner waits for the frame; a busy one is already past it
            if clock() >= following:  # still busy when the next frame arrives: that one overwrites this
                break
            started = clock()
            cycle = driver.reason()
            if cycle is None:
                break
            cycles.append((started, cycle))
        # every cycle that starts before the next arrival has run, so the ticks before it are decided
        while tick * period < following:
            commands.append((tick * period, driver.command(tick * period)))
            tick += 1
    return cycles, commands


@pytest.fixture
def driver(tiny_model):
    settings = parse_settings({
        "reasoning": {"ros__parameters": {"model_dir": str(tiny_model), "backend": "numpy", "kv_capacity_tokens": 128,
                                          "warmup_cycles": 1}},
        "action_publisher": {"ros__parameters": {"command_type": "float32_multi_array", "action_max": [0.01],
                                                 "action_timeout_ms": 50.0}}}, "test.yaml")
    return Driver(load_engine(settings).engine, settings, VirtualClock(0), COSTS, (48, 64))


def test_an_action_is_the_robots_from_its_ready_time_until_it_is_stale(driver):
    camera = SyntheticCamera(height=48, width=64, seed=1)
    assert driver.reason() is None  # no frame yet: nothing to do, and the clock does not move
    assert driver.clock() == 0 and driver.command(0).outcome is Outcome.NONE
    driver.camera(camera.frame(), stamp_ns=7, arrival_ns=0)
    cycle = driver.reason()
    ready = cycle.result.ready_ns
    assert ready == (8 + 6 * 1) * NS_PER_MS == driver.clock()  # encode + prefill, then 6 decode steps of 7 dims
    assert driver.reason() is None  # the frame was taken: nothing is processed twice

    before = driver.command(ready - 1)
    assert before.outcome is Outcome.NONE and before.safe_stop  # not ready yet: still nothing to command
    fresh = driver.command(ready)
    knobs = driver.knobs
    expected = ActionOutput(knobs).decide(TimedAction(frozen_chunk(cycle.result.chunk), ready, 7, 0), ready, knobs)
    assert fresh == expected and fresh.outcome is Outcome.FRESH
    assert max(fresh.values) <= 0.01  # clipped by action_max exactly as the publisher clips
    stale = driver.command(ready + 51 * NS_PER_MS)
    assert stale.outcome is Outcome.STALE and stale.values == (0.0,) * 7


def test_the_previous_action_is_commanded_while_the_next_is_still_being_computed(driver):
    camera = SyntheticCamera(height=48, width=64, seed=2)
    driver.camera(camera.frame(), 1, 0)
    first = driver.reason().result
    start = driver.clock()
    driver.camera(camera.frame(), 2, start)
    second = driver.reason().result
    assert second.ready_ns > start
    between = driver.command(second.ready_ns - 1)
    assert between.outcome is Outcome.FRESH and between.age_ms == (second.ready_ns - 1 - first.ready_ns) / NS_PER_MS
    assert driver.command(second.ready_ns).age_ms == 0.0


def test_a_new_episode_forgets_frames_and_actions_but_not_the_learned_costs(driver):
    camera = SyntheticCamera(height=48, width=64, seed=3)
    driver.camera(camera.frame(), 1, 0)
    driver.reason()
    driver.camera(camera.frame(), 2, driver.clock())
    driver.new_episode()
    assert driver.reason() is None and driver.command(driver.clock()).outcome is Outcome.NONE
    assert driver.gate.snapshot().kinds["cycle"].completed == 1


def test_the_command_is_checked_like_the_publishers(driver):
    knobs = OutputKnobs.of({"command_type": "twist", "twist_dims": [0, 1, 2, 3, 4, 9]})
    out = ActionOutput(knobs).decide(TimedAction(frozen_chunk(np.zeros(7)), 0, 0, 0), 0, knobs)
    assert out.outcome is Outcome.CONFIG_ERROR and out.values == (0.0,) * 6  # never a guess on the robot


# --- timing on the virtual clock: what the live pipeline would do, whatever the machine's load -----------


def test_frames_become_actions_within_the_deadline(tiny_model):
    """A 30 Hz camera and a cycle that fits (8 + 6 x 1 = 14 ms against the default 33 ms deadline): every
    frame is answered, in order, once, with no miss, refusal or stale frame, and p99 latency is 14 ms."""
    driver = _driver(_settings(tiny_model))
    cycles, _ = _stream(driver, frames=60)
    assert [cycle.frame.stamp_ns for _, cycle in cycles] == list(range(60))
    assert all(cycle.result.action is not None and not cycle.result.missed for _, cycle in cycles)
    stats = driver.gate.snapshot()
    assert stats.deadline_ms == 33.0 and stats.missed == stats.refused == stats.stale == 0
    assert stats.latency.count == 60 and stats.latency.p99_ms == stats.latency.max_ms == 14.0


def test_a_reasoner_slower_than_the_camera_answers_the_newest_frame_never_a_backlog(tiny_model):
    """A 50 ms cycle (44 + 6 x 1) against frames every 33 ms and a 120 ms deadline: the frames that arrive
    while a cycle runs overwrite each other, and each cycle takes the newest one that has arrived."""
    driver = _driver(_settings(tiny_model, {"deadline_ms": 120.0}), parse_cost("fixed:encode=44ms,decode=1ms"))
    cycles, _ = _stream(driver, frames=60)
    arrivals = [round(i * 1e9 / 30) for i in range(60)]
    for started, cycle in cycles:
        assert cycle.frame.stamp_ns == max(i for i, t in enumerate(arrivals) if t <= started)
        assert cycle.result.action is not None and cycle.result.ready_ns == started + 50 * NS_PER_MS
    stamps = [cycle.frame.stamp_ns for _, cycle in cycles]
    assert stamps == sorted(set(stamps)) and len(stamps) < 60  # each frame once, in order; some never read
    assert driver.buffer.stats().dropped == 60 - len(stamps) - driver.buffer.stats().pending
    stats = driver.gate.snapshot()
    assert stats.missed == 0 and stats.latency.max_ms <= 120.0


def test_an_impossible_deadline_turns_into_refusals_not_misses(tiny_model):
    """Costs learned at the default deadline, then 1 ms, as a live `ros2 param set deadline_ms 1` does:
    every later cycle is refused at its start (14 ms predicted), so no action and no miss."""
    settings = _settings(tiny_model)
    driver = _driver(settings)
    _stream(driver, frames=10, end_ns=round(10 * 1e9 / 30))
    learned = driver.gate.snapshot()
    assert learned.kinds["cycle"].completed == 10 and learned.missed == 0
    driver.gate.configure(GateKnobs.of({**settings["reasoning"], "deadline_ms": 1.0}))  # what the node's callback does
    cycles, _ = _stream(driver, frames=20, start_ns=driver.clock())
    after = driver.gate.snapshot()
    assert len(cycles) == 20 and all(cycle.result.action is None for _, cycle in cycles)
    assert after.missed == 0 and after.kinds["cycle"].completed == 10
    assert after.kinds["cycle"].refused == 20 and after.stale == 0  # refused at the start, nothing begun


def test_a_camera_that_stops_is_a_safe_stop_within_one_timeout_and_one_period(tiny_model):
    """One second of frames, then none: the publisher (50 Hz ticks, 300 ms timeout) commands the newest
    action while it is fresh, a safe stop from the first tick after it is 300 ms old, and nothing else after."""
    driver = _driver(_settings(tiny_model, publisher={"action_timeout_ms": 300.0, "control_rate_hz": 50.0}))
    cycles, commands = _stream(driver, frames=30, tick_hz=50.0, end_ns=2 * 10**9)
    last_ready = max(cycle.result.ready_ns for _, cycle in cycles)
    first_ready = min(cycle.result.ready_ns for _, cycle in cycles)
    fresh = [(t, c) for t, c in commands if first_ready <= t <= last_ready + 300 * NS_PER_MS]
    assert fresh and all(c.outcome is Outcome.FRESH and any(v != 0.0 for v in c.values) for _, c in fresh)
    stops = [(t, c) for t, c in commands if t > last_ready + 300 * NS_PER_MS]
    assert stops and all(c.outcome is Outcome.STALE and c.values == (0.0,) * 7 for _, c in stops)
    first_stop = stops[0][0]
    assert last_ready + 300 * NS_PER_MS < first_stop <= last_ready + (300 + 20) * NS_PER_MS


# --- observations: two cameras and the robot's state, and every bad input of them ---------------------------

STATE_JOINTS = ["shoulder", "elbow", "wrist"]


@pytest.fixture(scope="module")
def chunk_model(tmp_path_factory):
    """A 1-layer tiny model with an mlp head giving 12 actions of 7 a cycle."""
    return write_random_model(tmp_path_factory.mktemp("chunked") / "m", preset("tiny", layers=1, head="mlp", chunk=12),
                              seed=2)


@pytest.mark.parametrize("execution", ["auto", "chunk"])
def test_a_model_slower_than_the_control_period_is_executed_from_its_chunks(chunk_model, execution):
    """Cycles of 100 ms against a 20 ms control period: the ticks between chunks command the chunk's later
    actions, one a tick, so commands change every tick instead of every cycle; nothing starves once the first
    chunk is in (its 12 actions last 240 ms, the next chunk is ready 100 ms after its frame). auto is rtc."""
    settings = _settings(chunk_model, {"deadline_ms": 1000.0},
                         {"control_rate_hz": 50.0, "action_min": [-1e6], "action_max": [1e6], "execution": execution})
    driver = _driver(settings, parse_cost("fixed:encode=100ms,decode=1ms"))  # a continuous head decodes no token
    cycles, commands = _stream(driver, frames=30, frame_hz=30.0, tick_hz=50.0, end_ns=1000 * NS_PER_MS)
    assert len(cycles) >= 8 and {round(cycle.result.chunk.shape[0]) for _, cycle in cycles} == {12}
    first_ready = cycles[0][1].result.ready_ns
    after = [(t, c) for t, c in commands if t >= first_ready]
    assert all(c.outcome is Outcome.FRESH for _, c in after) and driver.timeline.starvation_events == 0
    assert driver.timeline.mode == ("rtc" if execution == "auto" else "chunk")
    distinct = sum(a.values != b.values for (_, a), (_, b) in zip(after, after[1:]))
    assert distinct == len(after) - 1  # a new command every tick
    if execution == "chunk":  # each tick's command is the newest chunk's action for that tick's time
        _, cycle = cycles[3]
        chunk, frame = cycle.result.chunk, cycle.frame
        between = [(t, command) for t, command in after if cycle.result.ready_ns <= t < cycles[4][1].result.ready_ns]
        assert len(between) == 5  # a cycle of 100 ms, a tick every 20 ms
        for t, command in between:
            index = (t - frame.receive_ns) // (20 * NS_PER_MS)
            assert command.values == tuple(float(v) for v in chunk[index])


@pytest.fixture(scope="module")
def chunk16_model(tmp_path_factory):
    """A 1-layer tiny model with an mlp head giving 16 actions of 7 a cycle."""
    return write_random_model(tmp_path_factory.mktemp("chunk16") / "m", preset("tiny", layers=1, head="mlp", chunk=16),
                              seed=3)


def _at_control_rate(driver: Driver, ticks: int, rate_hz: float = 30.0) -> tuple[list, list]:
    """A camera frame and a publisher tick every 1/rate_hz (the simulated robot's schedule), the reasoner's turn at
    each frame through ``reason_at``: it waits for its start time as the live loop does. (cycles, commands)."""
    camera = SyntheticCamera(height=48, width=64, seed=4)
    period = round(1e9 / rate_hz)
    cycles, commands = [], []
    for tick in range(ticks):
        now = tick * period
        driver.camera(camera.frame(), stamp_ns=tick, arrival_ns=now)
        cycle = driver.reason_at(now, now + period)
        if cycle is not None:
            cycles.append(cycle)
        commands.append(driver.command(now))
    return cycles, commands


@pytest.mark.parametrize("execution", ["chunk", "auto"])
def test_a_250_ms_model_at_30_hz_with_16_action_chunks_is_never_refused_and_never_starves(chunk16_model, execution):
    """The gate plans on the horizon. chunk: each 250 ms cycle starts when the chunk held has its cost plus the 10 ms
    margin left, so the next chunk is in before it runs out. auto (rtc) wants the next chunk by the end of the
    execution horizon, 8 actions (267 ms) after the held chunk's frame, which two 250 ms cycles cannot meet: each
    cycle starts as soon as the previous chunk is in and the next frame arrives, planned on the held chunk's end
    (shortened), and is in before the 16th action. Today's fixed 33 ms deadline (sync) refuses every cycle once
    warm and the robot stands still on safe stops."""
    publisher = {"control_rate_hz": 30.0, "action_min": [-1e6], "action_max": [1e6], "execution": execution}
    costs = parse_cost("fixed:encode=250ms,decode=1ms")
    driver = _driver(_settings(chunk16_model, publisher=publisher), costs)
    cycles, commands = _at_control_rate(driver, 150)  # 5 s
    stats = driver.gate.snapshot()
    assert stats.refused == stats.missed == stats.stale == 0 and len(cycles) >= 17
    assert all(cycle.result.chunk is not None for cycle in cycles)
    assert stats.horizon.planned == len(cycles) - 1 and stats.horizon.empty == 1  # the first: nothing held
    if execution == "chunk":
        assert stats.horizon.slack_min_ms == 0.0 and stats.horizon.shortened == 0
    else:
        assert stats.horizon.shortened == stats.horizon.planned and stats.horizon.slack_min_ms > 0
    assert stats.horizon.predicted_ms == 250.0
    first = next(i for i, command in enumerate(commands) if command.outcome is Outcome.FRESH)
    after = commands[first:]
    assert all(command.outcome is Outcome.FRESH for command in after)
    assert driver.timeline.starved_ticks == driver.timeline.starvation_events == 0
    assert sum(a.values != b.values for a, b in zip(after, after[1:])) == len(after) - 1  # 30 distinct a second
    assert driver.timeline.figures(len(commands) * round(1e9 / 30), driver.knobs)["distinct_commands_hz"] >= 29.0
    if execution == "auto":
        return
    sync = _driver(_settings(chunk16_model, publisher={**publisher, "execution": "sync"}), costs)
    cycles, commands = _at_control_rate(sync, 150)
    stats = sync.gate.snapshot()
    warm = len(cycles) - stats.warmup
    assert stats.refused >= 0.9 * warm and stats.horizon.planned == 0
    assert sum(command.outcome is Outcome.FRESH for command in commands) < 0.2 * len(commands)


class VaryingCosts:
    """A block timer whose encode blocks cost the next of ``costs_ms`` in turn (decodes cost nothing): a model
    whose cycle varies, as a loaded machine's does, on the virtual clock."""

    def __init__(self, clock: VirtualClock, costs_ms: list[float]) -> None:
        self.clock, self.costs_ms, self.count = clock, costs_ms, 0

    def started(self, kind) -> None:
        pass

    def finished(self, kind) -> None:
        if kind.value == "encode_prefill":
            self.clock.now += round(self.costs_ms[self.count % len(self.costs_ms)] * NS_PER_MS)
            self.count += 1


def test_a_cycle_predicted_to_miss_the_held_chunk_still_starts_so_a_varying_model_never_starves(chunk16_model):
    """Cycles of 140-260 ms: predicted at mean + 3 deviations (about 270 ms), two of them do not fit the 533 ms
    chunk, so most cycles are predicted to come after the held chunk runs out. They start anyway (late starts),
    judged by their own chunk: refused, the next frame would have the same end nearer, and the robot would
    stop until it passed. They are in time, as most cycles are faster than predicted: nothing starves."""
    publisher = {"control_rate_hz": 30.0, "action_min": [-1e6], "action_max": [1e6]}
    driver = _driver(_settings(chunk16_model, publisher=publisher), parse_cost("fixed:encode=1ms,decode=1ms"))
    driver.reasoner.timer = VaryingCosts(driver.clock, [140.0, 260.0, 200.0, 170.0, 230.0, 250.0, 150.0])
    cycles, commands = _at_control_rate(driver, 300)  # 10 s
    stats = driver.gate.snapshot()
    assert stats.refused == 0 and stats.horizon.late > len(cycles) // 2
    first = next(i for i, command in enumerate(commands) if command.outcome is Outcome.FRESH)
    assert driver.timeline.starved_ticks == 0 and len(commands) - first > 280
    assert stats.horizon.slack_min_ms < 0  # predicted to starve, and did not


def test_a_model_faster_than_its_chunk_waits_for_the_horizon_instead_of_computing_chunks_it_would_drop(
        chunk16_model):
    """chunk, 100 ms cycles, 16 actions of 33 ms: after warm-up each cycle starts when 110 ms of the chunk are left,
    one every 400 ms, rather than back to back (one every 133 ms at this camera rate), and none starves."""
    publisher = {"control_rate_hz": 30.0, "action_min": [-1e6], "action_max": [1e6], "execution": "chunk"}
    costs = parse_cost("fixed:encode=100ms,decode=1ms")
    driver = _driver(_settings(chunk16_model, publisher=publisher), costs)
    cycles, commands = _at_control_rate(driver, 150)
    stats = driver.gate.snapshot()
    assert stats.refused == stats.missed == 0 and driver.timeline.starved_ticks == 0
    assert stats.horizon.left_ms == 110.0 and stats.horizon.slack_ms == 0.0
    starts = [cycle.result.ready_ns - 100 * NS_PER_MS for cycle in cycles]
    gaps = {round((b - a) / NS_PER_MS) for a, b in zip(starts[3:], starts[4:])}
    assert gaps == {400} and len(cycles) <= 15
    eager = _driver(_settings(chunk16_model, publisher=publisher), costs)  # reasoning whenever free
    _stream(eager, frames=150, frame_hz=30.0, tick_hz=30.0, end_ns=5000 * NS_PER_MS)
    assert eager.gate.snapshot().kinds["cycle"].completed > 2 * len(cycles)


@pytest.fixture(scope="module")
def two_cameras_and_state(tmp_path_factory):
    """The tiny model seeing two cameras and a 3-joint state per observation (16 + 16 + 1 tokens)."""
    from vla_edge_ros.model.init_model import preset, write_random_model

    return write_random_model(tmp_path_factory.mktemp("models") / "stereo_state", preset("tiny", cameras=2, state_dim=3))


def _observing(model, camera=None, publisher=None):
    settings = _settings(model, {"warmup_cycles": 1, "kv_capacity_tokens": 512},
                         {"action_timeout_ms": 100.0, **(publisher or {})})
    return settings.replace("camera_subscriber", {"extra_image_topics": ["wrist/image_raw"], "sync_slop_ms": 10.0,
                                                  "state_topic": "joint_states", "state_joint_names": STATE_JOINTS,
                                                  "state_max_age_ms": 50.0, **(camera or {})})


def _joints(position, names=STATE_JOINTS):
    from types import SimpleNamespace

    return SimpleNamespace(name=list(names), position=list(position), velocity=[])


def _run(driver, frames: int, state_at=lambda i: _joints([0.1, 0.2, 0.3]), cameras=(0, 1), start_ns: int = 10**9,
         tick_hz: float = 100.0):
    """Frames every 33 ms from ``start_ns`` from ``cameras`` (stamp = arrival, the wrist's 1 ms after the front's),
    the state message ``state_at(i)`` (None: none) stamped with the frame's time just before each, the reasoner
    whenever free, and every publisher tick from ``start_ns``: (cycles, commands)."""
    camera = SyntheticCamera(height=48, width=64, seed=6)
    clock, cycles, commands = driver.clock, [], []
    period = round(1e9 / tick_hz)
    tick = -(-start_ns // period)
    for i in range(frames):
        now = start_ns + i * 33 * NS_PER_MS
        clock.wait_until(now)
        sent = state_at(i)
        if sent is not None:
            driver.state(sent, now, now)
        for index in cameras:
            driver.camera(camera.frame(), now + index * NS_PER_MS, now + index * NS_PER_MS, camera=index)
        if clock() <= now + 2 * NS_PER_MS:
            clock.wait_until(now + 2 * NS_PER_MS)
            cycle = driver.reason()
            if cycle is not None:
                cycles.append(cycle)
        while tick * period < now + 33 * NS_PER_MS:
            commands.append(driver.command(tick * period))
            tick += 1
    return cycles, commands


def _nothing_unsafe(commands) -> None:
    """Every command is a fresh, finite action or the safe stop's zeros."""
    for command in commands:
        assert command.outcome in (Outcome.FRESH, Outcome.NONE, Outcome.STALE), command
        assert all(np.isfinite(command.values))
        if command.outcome is not Outcome.FRESH:
            assert not any(command.values)


def test_two_synced_cameras_and_a_fresh_state_make_each_observation_one_cycle(two_cameras_and_state):
    driver = _driver(_observing(two_cameras_and_state))
    cycles, commands = _run(driver, frames=8)
    assert len(cycles) == 8 and all(cycle.result.action is not None for cycle in cycles)
    frame = cycles[-1].frame
    assert len(frame.extra_images) == 1 and frame.state.tolist() == pytest.approx([0.1, 0.2, 0.3])
    assert driver.engine.observation_tokens == 33
    assert driver.engine.arena.used == 6 + 8 * 33  # the prompt, then whole observations: cameras and state token
    assert driver.assembler.observations == 8 and driver.assembler.no_state == 0
    _nothing_unsafe(commands)
    assert commands[-1].outcome is Outcome.FRESH


def test_a_stale_state_means_no_observation_and_the_robot_stops(two_cameras_and_state):
    """The state stops coming after frame 3: 50 ms later the frames have no observation (no_state), so no cycle
    runs on them and the publisher stops the robot once the last action is 100 ms old, never acting on a made-up
    state."""
    driver = _driver(_observing(two_cameras_and_state))
    cycles, commands = _run(driver, frames=20, state_at=lambda i: _joints([0.1, 0.2, 0.3]) if i <= 3 else None)
    assert len(cycles) == 5  # frames 0-3, and frame 4, 33 ms after the last state (within 50 ms)
    assert driver.assembler.no_state == 15 and "older than the frames (state_max_age_ms 50)" in \
        driver.assembler.last_refusal
    _nothing_unsafe(commands)
    assert commands[-1].outcome is Outcome.STALE


@pytest.mark.parametrize("bad, reason", [
    (_joints([0.1, float("nan"), 0.3]), "not_finite"),
    (_joints([0.1, 0.2, float("inf")]), "not_finite"),
    (_joints([0.1, 0.2], names=["shoulder", "elbow"]), "missing_joint"),
    (_joints([0.1, 0.2, 0.3, 0.4], names=["shoulder", "elbow", "wrist", "wrist"]), "duplicate_joint"),
    (_joints([0.1, 0.2], names=STATE_JOINTS), "wrong_length"),
])
def test_a_bad_state_is_dropped_counted_and_never_reaches_the_model(two_cameras_and_state, bad, reason):
    """Only bad state messages from frame 2 on: each is refused with its reason, the last good state ages out, and
    from then on there is no observation, so no action: the robot stops."""
    driver = _driver(_observing(two_cameras_and_state))
    good = _joints([0.1, 0.2, 0.3])
    cycles, commands = _run(driver, frames=12, state_at=lambda i: good if i < 2 else bad)
    assert driver.states.dropped[reason] == 10 and driver.states.received == 12
    assert all(np.array_equal(cycle.frame.state, np.float32([0.1, 0.2, 0.3])) for cycle in cycles)
    assert len(cycles) == 3 and driver.assembler.no_state == 9  # frame 2 still pairs with frame 1's state
    _nothing_unsafe(commands)
    assert commands[-1].outcome is Outcome.STALE


def test_a_silent_camera_means_no_observation_and_the_robot_stops(two_cameras_and_state):
    """The wrist camera goes silent after frame 3: the front camera's frames find no partner (counted as unsynced),
    no observation is made with a camera missing, and the robot stops once the last action is stale."""
    driver = _driver(_observing(two_cameras_and_state))
    first, commands_before = _run(driver, frames=4)
    later, commands = _run(driver, frames=12, cameras=(0,), start_ns=10**9 + 4 * 33 * NS_PER_MS)
    assert len(first) == 4 and later == []
    assert driver.assembler.unsynced[0] > 0 and "nothing waiting from camera 1" in driver.assembler.last_refusal
    _nothing_unsafe(commands_before + commands)
    assert commands[-1].outcome is Outcome.STALE


@pytest.mark.parametrize("camera, words", [
    ({"state_topic": ""}, "reads a robot state of 3 values (state_proj, vla.state): set state_topic"),
    ({"extra_image_topics": []}, "sees 2 cameras per observation (vla.cameras), the configuration names 1"),
    ({"state_joint_names": ["shoulder", "elbow"]}, "reads a state of 3 values, state_type joint_state gives 2"),
    ({"state_type": "odometry"}, "state_type odometry gives 6 (odometry gives x, y, yaw, vx, vy, wz)"),
])
def test_an_observation_the_checkpoint_does_not_read_is_refused_at_configure(two_cameras_and_state, camera, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        load_engine(_observing(two_cameras_and_state, camera))


def test_a_state_topic_for_a_checkpoint_without_a_state_projection_is_refused(tiny_model):
    settings = _settings(tiny_model).replace("camera_subscriber", {"state_topic": "joint_states"})
    with pytest.raises(ValueError, match="camera_subscriber: state_topic is 'joint_states', but .* reads no robot "
                                         "state \\(it has no state_proj\\)"):
        load_engine(settings)


@pytest.mark.parametrize("head, chunk, blocks", [("bins", 1, 6), ("bins", 4, 1), ("linear", 1, 0), ("mlp", 8, 0)])
def test_decode_blocks_counts_the_decode_blocks_a_cycle_runs(tmp_path, head, chunk, blocks):
    """What a latency sweep sets a cycle's cost from: one cycle of each head records exactly that many decodes."""
    config = preset("tiny", layers=1, head=head, chunk=chunk)
    assert decode_blocks(config) == blocks
    driver = _driver(_settings(write_random_model(tmp_path / "m", config, seed=1), {"deadline_ms": 1000.0}))
    driver.camera(SyntheticCamera(height=48, width=64, seed=1).frame(), stamp_ns=0, arrival_ns=0)
    assert driver.reason().result.chunk is not None
    assert driver.gate.snapshot().kinds["decode"].completed == blocks
    assert driver.clock() == 8 * NS_PER_MS + blocks * NS_PER_MS  # COSTS: encode 8 ms, decode 1 ms


def test_rtc_asks_for_the_next_chunk_by_the_end_of_the_execution_horizon_and_blends_over_the_rest(chunk16_model):
    """auto (rtc), 100 ms cycles, 16 actions at 30 Hz, execution_horizon left at 0: s = 8. After warm-up each cycle
    starts 110 ms before the held chunk's 8th action (267 ms after its frame), so every chunk is ready 10 ms before
    it, and the held chunk's last 8 actions are the overlap the new one is blended toward: every tick then commands
    a blend, not the newest chunk's own action as chunk would. A cycle every 4 frames, none refused or missed, no
    starved tick."""
    publisher = {"control_rate_hz": 30.0, "action_min": [-1e6], "action_max": [1e6]}
    driver = _driver(_settings(chunk16_model, publisher=publisher), parse_cost("fixed:encode=100ms,decode=1ms"))
    cycles, commands = _at_control_rate(driver, 150)
    stats = driver.gate.snapshot()
    period = round(1e9 / 30)
    assert stats.refused == stats.missed == 0 and driver.timeline.starved_ticks == 0 and len(cycles) >= 30
    assert stats.horizon.deadline == "switch" and stats.horizon.shortened == 0
    warm = cycles[3:]
    for previous, cycle in zip(warm, warm[1:]):
        switch = previous.frame.receive_ns + 8 * period
        assert cycle.result.ready_ns == switch - 10 * NS_PER_MS
    starts = [cycle.result.ready_ns - 100 * NS_PER_MS for cycle in warm]
    assert {round((b - a) / NS_PER_MS) for a, b in zip(starts, starts[1:])} == {133}
    blended = own = 0
    for tick, command in enumerate(commands):
        t = tick * period
        ready = [cycle for cycle in cycles if cycle.result.ready_ns <= t]
        if len(ready) < 6:
            continue
        newest = ready[-1]
        action = newest.result.chunk[(t - newest.frame.receive_ns) // period]
        if command.values == tuple(float(v) for v in action):
            own += 1
        else:
            blended += 1
    assert blended > 100 and own == 0
