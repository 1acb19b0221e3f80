"""The action timeline on hand-made chunks: which action each tick commands, per execution mode, and chunk safety.

Everything runs on explicit nanosecond times (the virtual clock's view): a control period of 10 ms, ticks at
whole periods unless a test says otherwise. Commands are float32_multi_array with wide clip limits, so a
command's values are the action itself.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

from vla_edge_ros.config import ConfigError, OutputKnobs, parse_settings
from vla_edge_ros.runtime.action_output import ActionOutput, Outcome, check_fits_action
from vla_edge_ros.runtime.action_slot import TimedAction, frozen_chunk
from vla_edge_ros.runtime.action_timeline import (ActionTimeline, ensemble_mean, execution_rows, held_rows,
                                                  resolve_execution, rtc_weights)
from vla_edge_ros.runtime.admission import Horizon
from vla_edge_ros.tools.evaluate import jerk

MS = 1_000_000
P = 10 * MS  # the control period


def knobs(**values) -> OutputKnobs:
    safety = {f"chunk_safety.{k[len('safety_'):]}": v for k, v in values.items() if k.startswith("safety_")}
    plain = {k: v for k, v in values.items() if not k.startswith("safety_")}
    return OutputKnobs.of({"command_type": "float32_multi_array", "action_min": [-1e6], "action_max": [1e6],
                           "action_timeout_ms": 200.0, **plain, **safety})


def chunk(rows, obs_ms: float, ready_ms: float) -> TimedAction:
    return TimedAction(frozen_chunk(np.asarray(rows, dtype=np.float32)), round(ready_ms * MS), 0, round(obs_ms * MS))


def ramp(start: float, count: int, dof: int = 1) -> np.ndarray:
    """Actions start, start + 1, ... (one per row), the same in every dimension: each value names its action."""
    return np.repeat((start + np.arange(count, dtype=np.float32))[:, None], dof, axis=1)


class Run:
    """A timeline under fixed knobs, fed the newest chunk at each tick as the publisher's slot would."""

    def __init__(self, **values) -> None:
        self.knobs = knobs(**values)
        self.timeline = ActionTimeline(ActionOutput(self.knobs))
        self.newest: TimedAction | None = None

    def tick(self, t_ms: float):
        return self.timeline.command(self.newest, round(t_ms * MS), self.knobs, P)

    def values(self, t_ms: float) -> tuple[float, ...] | None:
        command = self.tick(t_ms)
        return command.values if command.outcome is Outcome.FRESH else None


def test_auto_is_rtc_for_a_chunk_and_sync_for_one_action():
    assert resolve_execution("auto", 8) == "rtc" and resolve_execution("auto", 1) == "sync"
    assert resolve_execution("ensemble", 1) == "ensemble"


# --- sync: the rule from before chunks ---------------------------------------------------------------------

def test_sync_commands_the_newest_first_action_until_it_is_stale_exactly_as_decide_does():
    run = Run(execution="sync")
    assert run.tick(0).outcome is Outcome.NONE
    run.newest = chunk(ramp(5, 4), obs_ms=0, ready_ms=30)  # a chunk: sync executes its first action only
    for t in (30, 40, 230):
        command = run.tick(t)
        expected = ActionOutput(run.knobs).decide(run.newest, round(t * MS), run.knobs)
        assert command == expected and command.values == (5.0,)
    assert run.tick(230.001).outcome is Outcome.STALE  # older than action_timeout_ms (200)
    run.newest = chunk([[7.0]], obs_ms=230, ready_ms=240)
    assert run.values(240) == (7.0,) and run.timeline.starved_ticks == 0


# --- chunk: the newest chunk at once -------------------------------------------------------------------------

def test_chunk_executes_from_the_take_over_tick_then_starves_with_a_safe_stop():
    run = Run(execution="chunk")
    run.newest = chunk(ramp(0, 6), obs_ms=0, ready_ms=25)  # actions for 0, 10, ..., 50 ms
    assert [run.values(t) for t in (30, 40, 50, 59.9)] == [(3.0,), (4.0,), (5.0,), (5.0,)]  # 0-2 were past
    starved = run.tick(60)
    assert starved.outcome is Outcome.STARVED and starved.safe_stop and starved.values == (0.0,)
    assert run.tick(70).outcome is Outcome.STARVED
    assert (run.timeline.starvation_events, run.timeline.starved_ticks) == (1, 2)
    run.newest = chunk(ramp(10, 6), obs_ms=60, ready_ms=75)
    assert run.values(80) == (12.0,)  # back on a chunk: the starvation event has ended
    assert run.tick(200).outcome is Outcome.STARVED and run.timeline.starvation_events == 2


def test_chunk_switches_to_a_newer_chunk_at_once():
    run = Run(execution="chunk")
    run.newest = chunk(ramp(0, 10), obs_ms=0, ready_ms=5)
    assert [run.values(t) for t in (10, 20)] == [(1.0,), (2.0,)]
    run.newest = chunk(ramp(100, 10), obs_ms=15, ready_ms=28)
    assert [run.values(t) for t in (30, 40)] == [(101.0,), (102.0,)]  # index floor((30 - 15) / 10) = 1


def test_the_execution_horizon_ends_each_chunk_s_plan_early():
    run = Run(execution="chunk", execution_horizon=4)
    run.newest = chunk(ramp(0, 8), obs_ms=0, ready_ms=15)
    assert [run.values(t) for t in (20, 30)] == [(2.0,), (3.0,)]
    assert run.tick(40).outcome is Outcome.STARVED
    assert run.timeline.horizon_left_ms(round(40 * MS), run.knobs) == 0.0


def test_horizon_left_is_the_time_until_the_plan_runs_out():
    run = Run(execution="chunk")
    run.newest = chunk(ramp(0, 8), obs_ms=0, ready_ms=15)
    run.tick(20)
    assert run.timeline.horizon_left_ms(round(23 * MS), run.knobs) == 57.0
    assert run.timeline.figures(round(23 * MS), run.knobs)["horizon_left_ms"] == 57.0


def test_the_gate_plans_on_what_the_timeline_will_execute():
    """Horizon: the end of the held plan, a chunk handed over but not yet offered counted as accepted (its own
    end, execution_horizon included), a rejected one not at all; None in sync (the gate's fixed deadline)."""
    run = Run(execution="chunk", execution_horizon=6)
    assert run.timeline.horizon(None, 8, run.knobs, P) == Horizon(None, 50 * MS)  # nothing yet: when a chunk's last action starts
    run.newest = chunk(ramp(0, 8), obs_ms=0, ready_ms=15)
    assert run.timeline.horizon(run.newest, 8, run.knobs, P).end_ns == 60 * MS  # handed over, not yet ticked
    run.tick(20)
    assert run.timeline.horizon(run.newest, 8, run.knobs, P).end_ns == 60 * MS
    run.newest = chunk(np.full((8, 1), np.nan, dtype=np.float32), obs_ms=20, ready_ms=25)
    assert run.timeline.horizon(run.newest, 8, run.knobs, P).end_ns == 80 * MS  # as if it will be accepted
    run.tick(30)  # rejected: the old plan is what runs out
    assert run.timeline.rejected["nonfinite"] == 1
    assert run.timeline.horizon(run.newest, 8, run.knobs, P).end_ns == 60 * MS
    assert run.timeline.horizon(run.newest, 1, knobs(execution="auto"), P) is None  # H = 1: sync
    assert run.timeline.horizon(run.newest, 8, knobs(execution="sync"), P) is None
    ensemble = Run(execution="ensemble")
    ensemble.newest = chunk(ramp(0, 8), obs_ms=0, ready_ms=15)
    ensemble.tick(20)
    ensemble.newest = chunk(ramp(0, 8), obs_ms=30, ready_ms=45)
    ensemble.tick(50)
    # blending: the commands run out after H = 8 actions of the newest chunk, the next should take over at s = 4,
    # and a new chunk can be taken over until its last (8th) action
    assert ensemble.timeline.horizon(ensemble.newest, 8, ensemble.knobs, P) == Horizon(110 * MS, 70 * MS, 70 * MS)


def test_a_chunk_that_is_over_by_the_time_it_is_ready_is_rejected_as_late():
    run = Run(execution="chunk")
    run.newest = chunk(ramp(0, 3), obs_ms=0, ready_ms=35)
    assert run.tick(40).outcome is Outcome.NONE  # nothing was accepted: no chunk, not a starved one
    assert run.timeline.rejected["late"] == 1 and run.timeline.accepted == 0


def test_a_withdrawn_slot_stops_at_once_instead_of_running_the_old_chunk():
    run = Run(execution="chunk")
    run.newest = chunk(ramp(0, 50), obs_ms=0, ready_ms=5)
    assert run.values(10) == (1.0,)
    run.newest = None  # reasoning stopped: ActionSlot.clear
    assert run.tick(20).outcome is Outcome.NONE and run.timeline.starvation_events == 0


# --- ensemble: ACT's temporal ensembling ---------------------------------------------------------------------

def test_ensemble_averages_every_chunk_holding_the_tick_oldest_weighing_most():
    decay = 0.5
    run = Run(execution="ensemble", ensemble_decay=decay)
    run.newest = chunk(ramp(0, 5), obs_ms=0, ready_ms=5)  # holds 0..40 ms
    assert run.values(10) == (1.0,)  # alone
    run.newest = chunk(ramp(100, 5), obs_ms=20, ready_ms=25)  # holds 20..60 ms
    w = np.exp(-decay * np.arange(2))
    for t, old, new in ((30, 3.0, 101.0), (40, 4.0, 102.0)):
        assert run.values(t) == pytest.approx(((w[0] * old + w[1] * new) / w.sum(),), abs=1e-9)
    assert run.values(50) == (103.0,)  # the first chunk has run out: the second alone
    assert run.values(60) == (104.0,) and run.tick(70).outcome is Outcome.STARVED


def test_ensemble_weights_are_act_s_exp_minus_m_i():
    actions = [np.array([1.0, 0.0]), np.array([2.0, 10.0]), np.array([4.0, 20.0])]
    weights = np.array([1.0, math.exp(-0.01), math.exp(-0.02)])
    np.testing.assert_allclose(ensemble_mean(actions, 0.01), (weights[:, None] * actions).sum(0) / weights.sum())
    np.testing.assert_allclose(ensemble_mean(actions, 0.0), np.mean(actions, axis=0))


# --- rtc: real-time chunking -------------------------------------------------------------------------------

def soft(i: int, delay: int, end: int) -> float:
    """The RTC paper's soft mask (its eq. 5), written out: the weight on the previous chunk of new action i."""
    if i < delay:
        return 1.0
    if i >= end:
        return 0.0
    c = (end - i) / (end - delay + 1)
    return c * (math.exp(c) - 1) / (math.e - 1)


def test_rtc_drops_the_past_and_blends_the_overlap_toward_the_previous_plan_with_decaying_weights():
    run = Run(execution="rtc")
    run.newest = chunk(np.zeros((10, 1)), obs_ms=0, ready_ms=5)  # the previous plan: 0 until 100 ms
    assert run.values(10) == (0.0,)
    # the new chunk: observation at 20 ms, ready at 45 (3 actions of delay), taken over at the tick at 50 ms:
    # its actions 0-2 (20, 30, 40 ms) are past and dropped; 3-7 (50..90 ms) overlap the previous plan
    run.newest = chunk(np.ones((10, 1)), obs_ms=20, ready_ms=45)
    got = [run.values(t)[0] for t in range(50, 120, 10)]
    expected = [1 - soft(i, 3, 8) for i in range(3, 10)]
    np.testing.assert_allclose(got, expected, atol=1e-6)
    assert got[0] > 0.1 and got[4] < 1.0 and got[5:] == [1.0, 1.0]  # blended, rising, then the new chunk alone
    assert all(a < b for a, b in zip(got[:6], got[1:6]))
    assert run.tick(120).outcome is Outcome.STARVED


def test_rtc_freezes_the_actions_due_while_the_chunk_was_computed():
    """Ready at 46 ms (delay ceil(26 / 10) = 3 actions), taken over at a tick at 47 ms whose index is 2: action 2
    was due while inference ran, so the robot stays on the previous plan for it (weight 1)."""
    run = Run(execution="rtc")
    run.newest = chunk(np.full((10, 1), 5.0), obs_ms=0, ready_ms=5)
    run.tick(7)
    run.newest = chunk(np.ones((10, 1)), obs_ms=20, ready_ms=46)
    assert run.values(47) == (5.0,)  # frozen
    assert run.values(57) == pytest.approx((5.0 * soft(3, 3, 8) + (1 - soft(3, 3, 8)),))


def test_rtc_without_a_plan_to_stitch_onto_is_the_chunk_from_its_take_over():
    run = Run(execution="rtc")
    run.newest = chunk(ramp(0, 6), obs_ms=0, ready_ms=25)
    assert [run.values(t) for t in (30, 40, 50)] == [(3.0,), (4.0,), (5.0,)]


def test_rtc_weights_match_the_paper_and_are_monotone():
    weights = rtc_weights(2, 3, 9, 10)  # actions 2..11, delay 3, overlap up to 9
    np.testing.assert_allclose(weights, [soft(i, 3, 9) for i in range(2, 12)])
    assert weights[0] == 1.0 and weights[-1] == 0.0 and np.all(np.diff(weights) <= 0)


# --- the execution horizon: the next chunk at s, the old chunk's last H - s actions to blend over ------------------

def test_the_execution_horizon_is_half_the_chunk_when_the_mode_blends_and_the_whole_chunk_otherwise():
    assert [execution_rows(mode, 8, 0) for mode in ("sync", "chunk", "ensemble", "rtc")] == [8, 8, 4, 4]
    assert [execution_rows("rtc", 7, 0), execution_rows("ensemble", 2, 0)] == [4, 1]
    assert execution_rows("ensemble", 1, 0) == 1
    assert [execution_rows(mode, 8, 6) for mode in ("chunk", "rtc")] == [6, 6] and execution_rows("rtc", 8, 20) == 8
    assert [held_rows(mode, 8, 3) for mode in ("chunk", "ensemble", "rtc")] == [3, 8, 8]


@pytest.mark.parametrize("execution", ["ensemble", "rtc"])
def test_a_blending_mode_wants_the_next_chunk_at_s_and_goes_on_to_the_chunk_s_end_when_it_is_late(execution):
    """The gate is asked for the next chunk by action s = 4 of 8 (switch_ns); the rest of the chunk is held, so a
    late chunk does not starve the robot before action 8. chunk mode with s = 4 ends there (the test above)."""
    run = Run(execution=execution)
    run.newest = chunk(ramp(0, 8), obs_ms=0, ready_ms=5)
    assert run.timeline.horizon(run.newest, 8, run.knobs, P) == Horizon(80 * MS, 70 * MS, 40 * MS)
    assert [run.values(t) for t in range(10, 80, 10)] == [(float(i),) for i in range(1, 8)]
    assert run.timeline.horizon(run.newest, 8, run.knobs, P) == Horizon(80 * MS, 70 * MS, 40 * MS)
    assert run.tick(80).outcome is Outcome.STARVED
    explicit = Run(execution=execution, execution_horizon=6)
    explicit.newest = chunk(ramp(0, 8), obs_ms=0, ready_ms=5)
    assert explicit.timeline.horizon(explicit.newest, 8, explicit.knobs, P).switch_ns == 60 * MS


def every_s_ticks(execution: str, chunks: list[np.ndarray], **values) -> np.ndarray:
    """Commands under ``execution`` of chunks of 8 actions (P = 10 ms) handed over one every 4 ticks: chunk k
    observed at 95 + 40 k ms and ready 4 ms later (d = 1 action), so taken over at the tick of 100 + 40 k ms,
    which is the end of the previous chunk's execution horizon (s = 4 of 8 in the blending modes by default).
    One command a tick from 100 ms until the last chunk runs out."""
    run = Run(execution=execution, **values)
    commands = []
    for k, rows in enumerate(chunks):
        run.newest = chunk(rows, obs_ms=95 + 40 * k, ready_ms=99 + 40 * k)
        ticks = 8 if k == len(chunks) - 1 else 4
        commands += [run.values(t)[0] for t in range(100 + 40 * k, 100 + 40 * k + 10 * ticks, 10)]
    assert run.timeline.starved_ticks == 0 and run.timeline.accepted == len(chunks)
    return np.asarray(commands)


def test_with_h_8_and_a_chunk_every_s_4_ticks_rtc_differs_from_chunk_over_the_overlap_exactly_by_the_weights():
    """Chunk k is taken over at its action 0 (index floor(5 / 10)), which was due while it was computed (d = 1):
    frozen. The previous plan holds its times up to the previous chunk's 8th action, 4 actions after its
    execution horizon: e = 4, the overlap H - s, blended with the soft mask; chunk commands chunk k alone.
    ensemble commands the mean of the two chunks covering each tick (chunk k and k - 1, whose actions 4-7
    overlap chunk k's 0-3)."""
    rng = np.random.default_rng(3)
    chunks = [rng.uniform(-1, 1, (8, 1)).astype(np.float32) for _ in range(6)]
    rtc, plain, ensemble = (every_s_ticks(mode, chunks) for mode in ("rtc", "chunk", "ensemble"))
    weights = [soft(i, 1, 4) for i in range(4)]
    np.testing.assert_allclose(weights, [1.0, 0.48760, 0.18880, 0.04130], atol=5e-5)
    np.testing.assert_array_equal(plain[:4], chunks[0][:4, 0])
    np.testing.assert_allclose(rtc[:4], plain[:4])  # nothing to blend with
    for k in range(1, len(chunks)):
        for i in range(4):
            tick = 4 * k + i
            old, new = float(chunks[k - 1][4 + i, 0]), float(chunks[k][i, 0])
            assert plain[tick] == new
            assert rtc[tick] - plain[tick] == pytest.approx(weights[i] * (old - new), abs=1e-9)
            assert ensemble[tick] == pytest.approx(ensemble_mean([np.array([old]), np.array([new])], 0.01)[0])
    np.testing.assert_allclose(rtc[-4:], chunks[-1][4:, 0])  # past the overlap, the last chunk alone
    np.testing.assert_allclose(ensemble[-4:], chunks[-1][4:, 0])


def test_a_chunk_that_disagrees_with_the_running_plan_is_commanded_more_smoothly_by_rtc_and_ensemble():
    """Chunks that sample one smooth path (a velocity command, 0.5 sin(2 pi t / 0.8 s)), with chunk 3 and those after
    it shifted by 0.6 (a new plan, discontinuous with the old), or every chunk shifted by its own random offset (a
    model that disagrees with itself): chunk jumps where the chunks meet, rtc and ensemble ease over the overlap.
    Jerk is evaluate's (RMS over ticks of the second difference / dt^2)."""
    rng = np.random.default_rng(5)

    def path(k: int, offset: float) -> np.ndarray:
        t = (95 + 40 * k + 10 * np.arange(8)) / 1000.0
        return (0.5 * np.sin(2 * np.pi * t / 0.8) + offset).astype(np.float32)[:, None]

    for offsets in ([0.0] * 3 + [0.6] * 5, rng.uniform(-0.3, 0.3, 8)):  # jerk rtc / chunk 0.41, ensemble 0.71-0.74
        chunks = [path(k, offset) for k, offset in enumerate(offsets)]
        rms = {mode: float(np.sqrt(np.mean(jerk(every_s_ticks(mode, chunks)[:, None], 0.01) ** 2)))
               for mode in ("chunk", "ensemble", "rtc")}
        assert rms["rtc"] < 0.6 * rms["chunk"] and rms["ensemble"] < 0.8 * rms["chunk"], rms
    same = [path(k, 0.0) for k in range(8)]  # chunks that agree: every mode commands the path itself
    smooth = {mode: every_s_ticks(mode, same) for mode in ("chunk", "ensemble", "rtc")}
    np.testing.assert_allclose(smooth["rtc"], smooth["chunk"], atol=1e-6)
    np.testing.assert_allclose(smooth["ensemble"], smooth["chunk"], atol=1e-6)



# --- chunk safety --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("execution", ["sync", "chunk", "ensemble", "rtc"])
def test_a_nan_inside_a_chunk_rejects_all_of_it_and_execution_goes_on_with_the_previous_chunk(execution):
    run = Run(execution=execution)
    run.newest = chunk(ramp(0, 8, dof=2), obs_ms=0, ready_ms=5)
    good = run.values(10)
    bad = ramp(100, 8, dof=2)
    bad[3, 1] = np.nan  # not in its first row
    run.newest = chunk(bad, obs_ms=10, ready_ms=15)
    seen = [run.tick(t) for t in range(20, 150, 10)]
    assert run.timeline.rejected["nonfinite"] == 1 and run.timeline.accepted == 1
    assert "action 3 holds nan in dimension 1" in run.timeline.last_rejection
    fresh = [c.values for c in seen if c.outcome is Outcome.FRESH]
    assert fresh and all(math.isfinite(v) and v < 100 for values in fresh for v in values)  # never the bad chunk
    assert good == ((0.0, 0.0) if execution == "sync" else (1.0, 1.0))  # sync executes a chunk's first action


@pytest.mark.parametrize("execution", ["chunk", "ensemble", "rtc"])
def test_a_chunk_that_jumps_from_the_running_command_is_rejected_and_the_old_one_goes_on(execution):
    run = Run(execution=execution, safety_max_jump=[0.5])
    run.newest = chunk(ramp(0, 8) * 0.1, obs_ms=0, ready_ms=5)
    assert run.values(10) == pytest.approx((0.1,))
    # 1.8 above 0.2 at its first executed action (rtc: 0.58 above it once blended toward the running plan)
    run.newest = chunk(np.full((8, 1), 2.0), obs_ms=10, ready_ms=15)
    assert run.values(20) == pytest.approx((0.2,)) and run.timeline.rejected["jump"] == 1
    run.newest = chunk(np.full((8, 1), 0.6), obs_ms=20, ready_ms=25)  # within 0.5 of 0.3: accepted
    assert run.timeline.accepted == 1
    assert run.values(30)[0] >= 0.3 and run.timeline.accepted == 2


def test_ensemble_checks_the_blend_it_commands_not_only_the_new_chunk():
    """Two chunks that each keep within max_step 0.3: the old one at rest, the new one rising 0.3 a tick from 0. Their
    mean rises 0.15 a tick, but where the old chunk ends the mean jumps to the new chunk's action alone: 0.6 in
    one tick. Checking the new chunk alone would let that step through; the blend is what is checked, so the
    chunk is rejected and the old one goes on. Limits loose enough for the step let it through, as blended."""
    rising = (0.3 * np.clip(np.arange(8) - 1, 0, None)).astype(np.float32)[:, None]  # 0, 0, 0.3, ..., 1.8
    for max_step, accepted in ((0.3, 1), (0.7, 2)):
        run = Run(execution="ensemble", safety_max_step=[max_step])
        run.newest = chunk(np.zeros((8, 1)), obs_ms=0, ready_ms=5)
        run.tick(40)
        run.newest = chunk(rising, obs_ms=40, ready_ms=45)
        commands = [run.values(t) for t in range(50, 120, 10)]
        assert run.timeline.accepted == accepted
        if accepted == 1:  # the old chunk to its end, then a stop
            assert run.timeline.rejected["step"] == 1
            assert "step 0.6015 in dimension 0 (at executed action 2)" in run.timeline.last_rejection
            assert commands[:3] == [(0.0,)] * 3 and commands[3:] == [None] * 4
        else:
            steps = [abs(b[0] - a[0]) for a, b in zip(commands, commands[1:])]
            assert max(steps) == steps[2] == pytest.approx(0.6, abs=0.01)


@pytest.mark.parametrize("execution", ["ensemble", "rtc"])
def test_what_a_blending_mode_commands_keeps_every_limit_from_tick_to_tick_over_a_long_stream(execution):
    """Random chunks (random walks from a random offset, some steep), one every 4 ticks, some late: between two
    consecutive ticks commanding actions the change is within max_step (max_jump at a tick where a new chunk
    takes over) and, for positions, the second difference within max_acceleration dt^2 wherever no chunk took
    over inside it. What is commanded, blended, is what was checked."""
    rng = np.random.default_rng(11)
    max_jump, max_step, max_acceleration = 0.4, 0.12, 600.0  # positions: 0.06 second difference at 10 ms
    run = Run(execution=execution, safety_values_are="positions", safety_max_jump=[max_jump],
              safety_max_step=[max_step], safety_max_acceleration=[max_acceleration])
    ticks = []  # (values, taken over at this tick)
    for cycle in range(150):
        obs = 100 + 40 * cycle - 5
        bends = rng.uniform(-1, 1, (8, 2)) * rng.choice([0.01, 0.03, 0.09])
        rows = (rng.uniform(-0.3, 0.3) + np.cumsum(np.cumsum(bends, axis=0), axis=0)).astype(np.float32)
        late = 20 * (cycle % 7 == 3)  # now and then a chunk is ready two ticks after the switch
        run.newest = chunk(rows, obs_ms=obs, ready_ms=obs + late + 4)
        for t in range(100 + 40 * cycle, 140 + 40 * cycle, 10):
            before = run.timeline.accepted
            command = run.tick(t)
            ticks.append((np.array(command.values) if command.outcome is Outcome.FRESH else None,
                          run.timeline.accepted > before))
    assert 20 < run.timeline.accepted < 130 and run.timeline.rejected["step"] + run.timeline.rejected["jump"] > 10
    for (a, _), (b, took_over) in zip(ticks, ticks[1:]):
        if a is not None and b is not None:
            assert np.abs(b - a).max() <= (max_jump if took_over else max_step) + 1e-6
    for (a, _), (b, over_b), (c, over_c) in zip(ticks, ticks[1:], ticks[2:]):
        if a is not None and b is not None and c is not None and not (over_b or over_c):
            assert np.abs(c - 2 * b + a).max() <= max_acceleration * 0.01**2 + 1e-6


def test_after_a_stop_there_is_no_running_command_to_jump_from():
    run = Run(execution="chunk", safety_max_jump=[0.1])
    run.newest = chunk(np.full((3, 1), 0.9), obs_ms=0, ready_ms=5)  # the first chunk: nothing runs yet
    assert run.values(10) == (pytest.approx(0.9),)
    assert run.tick(30).outcome is Outcome.STARVED
    run.newest = chunk(np.full((3, 1), -0.9), obs_ms=30, ready_ms=35)
    assert run.values(40) == (pytest.approx(-0.9),) and run.timeline.rejected["jump"] == 0


@pytest.mark.parametrize("limits, rows, reason", [
    (dict(safety_max_step=[0.25]), [[0.0], [0.2], [0.5]], "step"),
    (dict(safety_max_velocity=[30.0], safety_values_are="positions"), [[0.0], [0.2], [0.5]], "velocity"),
    (dict(safety_max_velocity=[0.4], safety_values_are="velocities"), [[0.0], [0.2], [-0.5]], "velocity"),
    (dict(safety_max_acceleration=[500.0], safety_values_are="positions"), [[0.0], [0.0], [0.06]], "acceleration"),
    (dict(safety_max_acceleration=[25.0], safety_values_are="velocities"), [[0.0], [0.2], [0.5]], "acceleration"),
    (dict(safety_max_step=[1.0, 0.1]), [[0.0, 0.0], [0.5, 0.05], [0.6, 0.3]], "step"),  # per dimension
])
def test_step_velocity_and_acceleration_limits_reject_a_chunk_per_dimension(limits, rows, reason):
    run = Run(execution="chunk", **limits)
    rows = np.asarray(rows, dtype=np.float32)
    run.newest = chunk(rows, obs_ms=0, ready_ms=1)
    assert run.tick(2).outcome is Outcome.NONE and run.timeline.rejected[reason] == 1
    assert run.timeline.last_rejection.startswith(f"{reason}: ")
    eased = Run(execution="chunk", **{k: v if k.endswith("values_are") else [x * 10 for x in v]
                                       for k, v in limits.items()})
    eased.newest = chunk(rows, obs_ms=0, ready_ms=1)
    assert eased.values(2) == tuple(float(v) for v in rows[0]) and eased.timeline.accepted == 1


def test_values_are_auto_reads_joint_trajectories_as_positions():
    """The same chunk: within a 30 /s velocity limit as velocities (its values), beyond it as positions (its
    changes: 0.5 in 10 ms is 50 /s)."""
    rows = [[0.0], [0.5], [1.0]]
    for command_type, rejected in (("float32_multi_array", 0), ("joint_trajectory", 1)):
        values = dict(execution="chunk", command_type=command_type, safety_max_velocity=[30.0])
        if command_type == "joint_trajectory":
            values["joint_names"] = ["j"]
        run = Run(**values)
        run.newest = chunk(rows, obs_ms=0, ready_ms=1)
        run.tick(2)
        assert run.timeline.rejected["velocity"] == rejected


def test_nothing_from_a_rejected_chunk_ever_reaches_a_command_over_a_long_stream():
    """Random chunks, some holding a NaN, some jumping, some too steep: in every mode each fresh command is finite
    and within the clip limits, and (chunk mode) equal to an action of an accepted chunk."""
    rng = np.random.default_rng(4)
    for execution in ("sync", "chunk", "ensemble", "rtc"):
        run = Run(execution=execution, action_min=[-1.0], action_max=[1.0], safety_max_jump=[0.6],
                  safety_max_step=[0.3])
        accepted_values: set[float] = set()
        for cycle in range(60):
            obs = cycle * 40
            rows = np.cumsum(rng.uniform(-0.2, 0.2, (12, 2)), axis=0) + rng.uniform(-0.5, 0.5)
            kind = cycle % 4
            if kind == 1:
                rows[rng.integers(1, 12), rng.integers(0, 2)] = np.nan
            elif kind == 2:
                rows[6:] += 0.8  # a step of 0.8 inside the chunk
            before = run.timeline.accepted
            run.newest = chunk(rows, obs_ms=obs, ready_ms=obs + 25)
            commands = [run.tick(t) for t in range(obs + 30, obs + 70, 10)]  # the first tick offers the chunk
            if run.timeline.accepted > before:
                accepted_values |= set(np.clip(rows, -1, 1).astype(np.float32).astype(float).ravel())
            for command in commands:
                if command.outcome is Outcome.FRESH:
                    assert all(math.isfinite(v) and -1.0 <= v <= 1.0 for v in command.values)
                    if execution == "chunk":
                        assert set(command.values) <= accepted_values
        assert run.timeline.rejected["nonfinite"] == 15, execution
        assert run.timeline.rejected["step"] >= (0 if execution == "sync" else 10), execution  # sync: A[0] alone


def test_limits_that_do_not_fit_the_action_are_a_configuration_error():
    with pytest.raises(ConfigError, match="chunk_safety.max_step has 3 values but the action has 2 dimensions"):
        check_fits_action(knobs(**{"safety_max_step": [0.1, 0.2, 0.3]}), 2)
    run = Run(execution="chunk", safety_max_jump=[0.1, 0.2, 0.3])
    run.newest = chunk(ramp(0, 4, dof=2), obs_ms=0, ready_ms=1)
    assert run.tick(2).outcome is Outcome.NONE and run.timeline.rejected["config_error"] == 1


# --- the figures and the configuration ------------------------------------------------------------------------

def test_distinct_commands_are_counted_per_second():
    run = Run(execution="chunk")
    run.newest = chunk(ramp(0, 300), obs_ms=0, ready_ms=5)  # a new value every tick for 3 s
    for t in range(10, 2010, 10):
        run.tick(t)
    figures = run.timeline.figures(round(2000 * MS), run.knobs)
    assert figures["distinct_commands_hz"] == pytest.approx(100.0, rel=0.06)
    assert figures["execution"] == "chunk" and figures["chunks_accepted"] == 1 and figures["starvation_events"] == 0
    held = Run(execution="sync", action_timeout_ms=60000.0)
    held.newest = chunk([[1.0]], obs_ms=0, ready_ms=5)
    for t in range(10, 2010, 10):
        held.tick(t)
    assert held.timeline.figures(round(2000 * MS), held.knobs)["distinct_commands_hz"] < 1.0  # one action, held


@pytest.mark.parametrize("params, message", [
    ({"execution": "diffusion"}, "execution must be one of \\['auto', 'sync', 'chunk', 'ensemble', 'rtc'\\]"),
    ({"execution_horizon": -1}, "execution_horizon=-1 is below the minimum 0"),
    ({"execution_horizon": 2.5}, "execution_horizon must be of type int"),
    ({"chunk_safety": {"max_jump": [-0.1]}}, "chunk_safety.max_jump\\[0\\]=-0.1 is below the minimum 0"),
    ({"chunk_safety": {"values_are": "torques"}}, "values_are must be one of"),
])
def test_a_bad_execution_setting_is_refused_with_its_name_and_exit_2_from_the_cli(tmp_path, capsys, params, message):
    raw = {"action_publisher": {"ros__parameters": params}}
    with pytest.raises(ConfigError, match=message):
        parse_settings(raw, "robot.yaml")
    from vla_edge_ros.cli import main

    path = tmp_path / "robot.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["plan", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "robot.yaml" in err and len(err.strip().splitlines()) == 1
