"""The admission gate refuses what would overrun, counts what did, and stays bounded forever.

Every test drives the gate with a scripted clock, so each decision and each number is exact.
"""

from __future__ import annotations

import sys

import pytest

from vla_edge_ros.config import ConfigError, GateKnobs
from vla_edge_ros.runtime.admission import AdmissionGate, BlockKind, Horizon, LatencyHistogram, Verdict
from vla_edge_ros.runtime.clock import NS_PER_MS

DECODE = BlockKind.DECODE


class FakeClock:
    """Monotonic ns that only move when a test says so."""

    def __init__(self) -> None:
        self.ns = 1_000 * NS_PER_MS

    def __call__(self) -> int:
        return self.ns

    def advance(self, ms: float) -> None:
        self.ns += round(ms * NS_PER_MS)

    def after(self, ms: float) -> int:
        return self.ns + round(ms * NS_PER_MS)


_NAMES = {"alpha": "ema_alpha", "k": "margin_k", "deadline_ms": "deadline_ms", "warmup": "warmup_cycles",
          "horizon_margin_ms": "horizon_margin_ms"}


def knobs(**settings) -> GateKnobs:
    """Gate knobs by short names (alpha, k, deadline_ms, warmup, horizon_margin_ms); the others keep the schema's
    defaults."""
    return GateKnobs.of({_NAMES[name]: value for name, value in settings.items()})


def make_gate(probe_after: int = 10, bucket_edges_ms=None, **settings) -> tuple[AdmissionGate, FakeClock]:
    clock = FakeClock()
    extra = {} if bucket_edges_ms is None else {"bucket_edges_ms": bucket_edges_ms}
    return AdmissionGate(knobs(**settings), clock=clock, probe_after=probe_after, **extra), clock


def run_block(gate: AdmissionGate, clock: FakeClock, cost_ms: float, kind: BlockKind = DECODE,
              slack_ms: float = 1e6) -> bool:
    """Admit a block with a far deadline, let it cost ``cost_ms``, record it; return whether it missed."""
    decision = gate.admit(kind, clock.after(slack_ms))
    assert decision, decision
    clock.advance(cost_ms)
    return gate.record(decision)


def trained(**settings) -> tuple[AdmissionGate, FakeClock]:
    """A decode estimate of mean 10 ms, deviation 3 ms (alpha 0.5, samples 10, 14, 8: see the EMA test)."""
    gate, clock = make_gate(alpha=0.5, warmup=1, **settings)
    for cost in (10.0, 14.0, 8.0):
        run_block(gate, clock, cost)
    return gate, clock


def test_admits_a_block_predicted_to_finish_by_the_deadline():
    gate, clock = make_gate(warmup=1, k=2.0)
    run_block(gate, clock, 10.0)  # mean 10 ms, deviation 0
    decision = gate.admit(DECODE, clock.after(10.0))  # now + 10 ms <= deadline, exactly
    assert decision and decision.verdict is Verdict.ADMITTED
    assert decision.predicted_ns == 10 * NS_PER_MS
    clock.advance(10.0)
    assert gate.record(decision) is False  # finishing at the deadline is in time
    stats = gate.snapshot().kinds["decode"]
    assert (stats.warmup, stats.admitted, stats.refused, stats.missed, stats.completed) == (1, 1, 0, 0, 2)


def test_refuses_a_block_predicted_to_overrun_and_learns_nothing_from_it():
    gate, clock = make_gate(warmup=1)
    run_block(gate, clock, 10.0)
    decision = gate.admit(DECODE, clock.after(9.999))
    assert not decision and decision.verdict is Verdict.REFUSED
    with pytest.raises(ValueError, match="refused, never started"):
        gate.record(decision)
    stats = gate.snapshot()
    assert (stats.kinds["decode"].refused, stats.refused, stats.missed, stats.kinds["decode"].completed) == (1, 1, 0, 1)


def test_an_admitted_block_that_overruns_is_a_miss_not_a_refusal():
    gate, clock = make_gate(warmup=1, k=0.0)
    run_block(gate, clock, 10.0)
    decision = gate.admit(DECODE, clock.after(12.0))
    assert decision.verdict is Verdict.ADMITTED
    clock.advance(15.0)
    assert gate.record(decision) is True
    stats = gate.snapshot()
    decode = stats.kinds["decode"]
    assert (decode.admitted, decode.missed, decode.warmup_missed, decode.refused) == (1, 1, 0, 0)
    assert stats.missed == 1 and stats.refused == 0


def test_a_frame_past_its_deadline_is_skipped_as_stale():
    gate, clock = make_gate(deadline_ms=33.0)
    decision = gate.start_cycle(clock.after(-33.001))
    assert not decision and decision.verdict is Verdict.STALE
    assert decision.deadline_ns == clock.ns - NS_PER_MS // 1000
    on_time = gate.start_cycle(clock.after(-33.0))  # exactly at its deadline: not stale yet
    assert on_time.verdict is Verdict.WARMUP
    stats = gate.snapshot()
    assert stats.stale == 1
    assert (stats.kinds["cycle"].refused, stats.kinds["cycle"].warmup, stats.missed) == (0, 1, 0)


def test_cold_start_admits_warmup_blocks_without_an_estimate_and_counts_them_apart():
    gate, clock = make_gate(warmup=2, k=0.0)
    for _ in range(2):  # no trusted estimate yet: started even though each costs more than the slack
        decision = gate.admit(DECODE, clock.after(1.0))
        assert decision.verdict is Verdict.WARMUP and decision.predicted_ns is None
        clock.advance(5.0)
        assert gate.record(decision) is True
    after_warmup = gate.admit(DECODE, clock.after(1.0))  # now the 5 ms estimate refuses it
    assert after_warmup.verdict is Verdict.REFUSED and after_warmup.predicted_ns == 5 * NS_PER_MS
    # even in warm-up, a block whose deadline has already passed would be a certain miss
    assert gate.admit(BlockKind.ENCODE_PREFILL, clock.after(-0.001)).verdict is Verdict.REFUSED
    decode = gate.snapshot().kinds["decode"]
    assert (decode.warmup, decode.admitted, decode.refused, decode.missed, decode.warmup_missed) == (2, 0, 1, 2, 2)
    assert gate.snapshot().kinds["encode_prefill"].mean_ms is None


def test_ema_and_deviation_after_a_known_sequence():
    gate, clock = trained(k=2.0)
    # alpha 0.5; deviation is updated against the estimate before the sample is absorbed:
    #   10 -> mean 10, dev 0
    #   14 -> dev 0.5*0 + 0.5*|14-10| = 2,  mean 0.5*10 + 0.5*14 = 12
    #    8 -> dev 0.5*2 + 0.5*|8-12|  = 3,  mean 0.5*12 + 0.5*8  = 10
    decode = gate.snapshot().kinds["decode"]
    assert decode.mean_ms == pytest.approx(10.0)
    assert decode.deviation_ms == pytest.approx(3.0)
    assert decode.predicted_ms == pytest.approx(16.0)  # 10 + 2 * 3
    assert gate.admit(DECODE, clock.after(100.0)).predicted_ns == pytest.approx(16 * NS_PER_MS)

    # a cycle's cost is cycle start -> action ready; its latency is frame receive -> action ready
    cycle = gate.start_cycle(clock.after(-5.0))
    clock.advance(10.0)
    gate.record(cycle)
    stats = gate.snapshot()
    assert stats.kinds["cycle"].mean_ms == pytest.approx(10.0)
    assert stats.latency.max_ms == pytest.approx(15.0)


def test_margin_k_zero_admits_what_k_one_refuses():
    for k, expected in ((0.0, Verdict.ADMITTED), (1.0, Verdict.REFUSED)):
        gate, clock = trained(k=k)  # mean 10, deviation 3
        assert gate.admit(DECODE, clock.after(12.0)).verdict is expected  # 10 <= 12 but 10 + 3 > 12


def test_live_reconfiguration_applies_to_the_next_decision():
    gate, clock = trained(k=0.0, deadline_ms=33.0)
    assert gate.admit(DECODE, clock.after(12.0)).verdict is Verdict.ADMITTED
    gate.configure(knobs(alpha=0.5, warmup=1, k=1.0, deadline_ms=33.0))
    assert gate.admit(DECODE, clock.after(12.0)).verdict is Verdict.REFUSED

    gate.configure(knobs(alpha=1.0, warmup=1, k=1.0, deadline_ms=33.0))  # the next sample replaces the mean
    run_block(gate, clock, 20.0)
    decode = gate.snapshot().kinds["decode"]
    assert (decode.mean_ms, decode.deviation_ms) == (pytest.approx(20.0), pytest.approx(10.0))  # |20 - 10|

    started = gate.start_cycle(clock.after(-6.0))
    assert started.deadline_ns == clock.after(27.0)
    gate.configure(knobs(alpha=1.0, warmup=1, k=1.0, deadline_ms=5.0))
    assert gate.start_cycle(clock.after(-6.0)).verdict is Verdict.STALE
    assert started.deadline_ns == clock.after(27.0)  # a started cycle keeps its deadline
    stats = gate.snapshot()
    assert (stats.alpha, stats.k, stats.deadline_ms) == (1.0, 1.0, 5.0)


@pytest.mark.parametrize("settings, reason", [
    ({"alpha": 0.0}, r"ema_alpha=0.0 is below the minimum 0.001"),
    ({"alpha": 1.5}, r"ema_alpha=1.5 is above the maximum 1"),
    ({"alpha": float("nan")}, "ema_alpha must be a finite number"),
    ({"alpha": "0.5"}, "ema_alpha must be of type float"),
    ({"k": -0.5}, "margin_k=-0.5 is below the minimum 0"),
    ({"k": float("inf")}, "margin_k must be a finite number"),
    ({"deadline_ms": 0.0}, "deadline_ms=0.0 is below the minimum 1"),
    ({"deadline_ms": True}, "deadline_ms must be of type float"),
    ({"warmup": 0}, "warmup_cycles=0 is below the minimum 1"),
    ({"warmup": 2.5}, "warmup_cycles must be of type int"),
])
def test_bad_values_never_reach_the_gate(settings, reason):
    """The gate takes its knobs as a group the schema has checked: a bad value is refused with a reason
    before a gate (or a live change to one) can be made of it."""
    with pytest.raises(ConfigError, match=reason):
        knobs(**settings)


def test_bad_histogram_edges_and_clock_are_rejected():
    with pytest.raises(ValueError, match="strictly increasing"):
        LatencyHistogram((1.0, 3.0, 2.0))
    with pytest.raises(ValueError, match="clock must be a callable"):
        AdmissionGate(knobs(), clock=123)


def test_latency_percentiles_on_a_known_sample():
    gate, clock = make_gate(bucket_edges_ms=(1.0, 2.0, 3.0, 4.0, 5.0, 10.0), deadline_ms=1000.0, k=0.0)
    sample = [0.5] * 50 + [1.5] * 40 + [4.5] * 9 + [30.0]  # the last one lands in the overflow bucket
    for latency in sample:
        cycle = gate.start_cycle(clock.ns)
        clock.advance(latency)
        gate.record(cycle)
    latency = gate.snapshot().latency
    # nearest rank: p50 is the 50th smallest, in (0, 1] -> 1.0; p99 is the 99th, in (4, 5] -> 5.0
    assert (latency.count, latency.p50_ms, latency.p99_ms, latency.max_ms) == (100, 1.0, 5.0, 30.0)

    hist = LatencyHistogram((1.0, 2.0))
    assert hist.percentile_ms(50) is None
    hist.add(round(0.3 * NS_PER_MS))
    assert hist.percentile_ms(50) == 0.3  # its bucket's edge, 1.0, capped at the maximum seen
    hist.add(2 * NS_PER_MS)  # a value on an edge belongs to the bucket that edge closes
    assert hist.counts == [1, 1, 0] and hist.percentile_ms(50) == 1.0
    hist.add(7 * NS_PER_MS)
    assert (hist.percentile_ms(50), hist.percentile_ms(100)) == (2.0, 7.0)  # overflow: the maximum


def test_memory_stays_constant_over_a_long_run():
    gate, clock = make_gate(warmup=1, k=0.0, deadline_ms=1000.0)
    costs = (0.3, 1.7, 12.0, 0.9, 25.0, 4.0, 60.0)

    def sizes() -> dict[str, tuple[int, int]]:
        """Length and size of every container the gate and its histogram hold."""
        return {f"{type(owner).__name__}.{name}": (len(value), sys.getsizeof(value))
                for owner in (gate, gate._latency) for name, value in vars(owner).items()
                if isinstance(value, (list, dict, tuple))}

    def run(recordings: int) -> None:
        for i in range(recordings // 2):
            cycle = gate.start_cycle(clock.ns)
            step = gate.admit(DECODE, cycle.deadline_ns)
            clock.advance(costs[i % len(costs)])
            gate.record(step, clock.ns)
            gate.record(cycle, clock.ns)

    run(1_000)
    before = sizes()
    run(100_000)
    assert sizes() == before
    assert gate.snapshot().latency.count == gate._latency.total


def test_a_starved_estimate_is_re_measured_by_a_probe():
    """Refusals alone never update an estimate; after probe_after of them a block that fits on its mean runs."""
    clock = FakeClock()
    gate = AdmissionGate(knobs(alpha=0.5, k=3.0, deadline_ms=33.0, warmup=1), probe_after=3, clock=clock)
    for duration in (10.0, 30.0):  # mean 20 ms, deviation 10: predicted 50 ms with the margin
        decision = gate.admit(DECODE, clock.after(1000.0))
        clock.advance(duration)
        gate.record(decision)
    verdicts = [gate.admit(DECODE, clock.after(33.0)).verdict for _ in range(8)]
    assert verdicts == [Verdict.REFUSED] * 3 + [Verdict.PROBE] + [Verdict.REFUSED] * 3 + [Verdict.PROBE]
    assert gate.snapshot().kinds["decode"].probes == 2
    # a block whose mean alone overruns is refused even when a probe is due
    assert all(gate.admit(DECODE, clock.after(15.0)).verdict is Verdict.REFUSED for _ in range(6))
    # probes that complete quickly pull the estimate back under the deadline
    for _ in range(12):
        decision = gate.admit(DECODE, clock.after(33.0))
        if decision:
            clock.advance(5.0)
            gate.record(decision)
    assert gate.admit(DECODE, clock.after(33.0)).verdict is Verdict.ADMITTED


def test_a_starved_cycle_is_probed_too():
    clock = FakeClock()
    gate = AdmissionGate(knobs(alpha=0.5, k=3.0, deadline_ms=33.0, warmup=1), probe_after=2, clock=clock)
    cycle = gate.start_cycle(clock())
    clock.advance(20.0)
    gate.record(cycle)
    gate.record(gate.start_cycle(clock()), clock.after(4.0))  # mean 12, deviation 8: 36 ms with the margin
    assert [gate.start_cycle(clock()).verdict for _ in range(3)] == [Verdict.REFUSED, Verdict.REFUSED, Verdict.PROBE]


def test_probe_after_must_be_positive():
    with pytest.raises(ValueError, match="probe_after"):
        AdmissionGate(knobs(), probe_after=0)


def test_blocks_of_a_probe_cycle_are_judged_on_their_mean():
    clock = FakeClock()
    gate = AdmissionGate(knobs(alpha=0.5, k=3.0, warmup=1), clock=clock)
    for duration in (10.0, 30.0):  # mean 20, deviation 10: with the margin, 50 ms
        decision = gate.admit(DECODE, clock.after(1000.0))
        clock.advance(duration)
        gate.record(decision)
    assert gate.admit(DECODE, clock.after(30.0)).verdict is Verdict.REFUSED
    assert gate.admit(DECODE, clock.after(30.0), within=Verdict.PROBE).verdict is Verdict.ADMITTED
    assert gate.admit(DECODE, clock.after(15.0), within=Verdict.PROBE).verdict is Verdict.REFUSED


def test_warm_up_seeds_the_estimate_with_the_median_so_one_slow_first_cycle_is_forgotten():
    gate, clock = make_gate(alpha=0.1, k=3.0, warmup=3)
    for cost in (300.0, 10.0, 12.0):  # a one-off 300 ms first block, then the real cost
        run_block(gate, clock, cost)
    decode = gate.snapshot().kinds["decode"]
    assert decode.mean_ms == pytest.approx(12.0)  # median of 10, 12, 300
    assert decode.deviation_ms == pytest.approx((2.0 + 0.0 + 288.0) / 3)  # mean |sample - median|
    run_block(gate, clock, 20.0)  # from here on, the EMA
    assert gate.snapshot().kinds["decode"].mean_ms == pytest.approx(12.0 + 0.1 * 8.0)


def starved_by_a_slow_spell(probe_after: int = 2) -> tuple[AdmissionGate, FakeClock]:
    """A decode estimate of 50 ms (mean alone over a 33 ms deadline), measured while the machine was slow."""
    gate, clock = make_gate(alpha=0.5, k=3.0, warmup=1, probe_after=probe_after)
    run_block(gate, clock, 50.0)
    return gate, clock


def test_a_kind_whose_mean_overruns_is_retried_as_a_recovery_with_doubling_waits():
    gate, clock = starved_by_a_slow_spell(probe_after=2)
    verdicts = [gate.admit(DECODE, clock.after(33.0)).verdict for _ in range(8 + 1 + 16 + 1)]
    # first recovery after 4 x probe_after refusals, the next after 8 x (the first did not help: not recorded)
    assert verdicts == [Verdict.REFUSED] * 8 + [Verdict.RECOVERY] + [Verdict.REFUSED] * 16 + [Verdict.RECOVERY]
    decode = gate.snapshot().kinds["decode"]
    assert (decode.recoveries, decode.probes, decode.refused) == (2, 0, 24)


def test_a_recovery_that_runs_fast_brings_the_gate_back_and_resets_the_backoff():
    gate, clock = starved_by_a_slow_spell(probe_after=2)
    for _ in range(8):
        assert not gate.admit(DECODE, clock.after(33.0))
    recovery = gate.admit(DECODE, clock.after(33.0))
    assert recovery.verdict is Verdict.RECOVERY
    clock.advance(4.0)  # the machine is fast again
    assert gate.record(recovery) is False
    # mean 27, deviation 23: the margin still refuses, but the mean fits, so ordinary probes take over
    verdicts = []
    for _ in range(40):
        decision = gate.admit(DECODE, clock.after(33.0))
        verdicts.append(decision.verdict)
        if decision:
            clock.advance(4.0)
            gate.record(decision)
    assert Verdict.RECOVERY not in verdicts and Verdict.PROBE in verdicts and verdicts[-1] is Verdict.ADMITTED
    assert gate._counts[DECODE].recovery_backoff == 0


def test_blocks_of_a_recovery_cycle_start_unless_their_deadline_has_passed():
    gate, clock = starved_by_a_slow_spell()
    assert gate.admit(DECODE, clock.after(33.0)).verdict is Verdict.REFUSED
    assert gate.admit(DECODE, clock.after(33.0), within=Verdict.RECOVERY).verdict is Verdict.RECOVERY
    assert gate.admit(DECODE, clock.after(-1.0), within=Verdict.RECOVERY).verdict is Verdict.REFUSED
    # a kind still in warm-up is decided by warm-up rules, inside a recovery cycle too
    assert gate.admit(BlockKind.ENCODE_PREFILL, clock.after(33.0), within=Verdict.RECOVERY).verdict is Verdict.WARMUP


# --- chunks: a gate that plans for the horizon -----------------------------------------------------------


def cycle_trained(cost_ms: float, **settings) -> tuple[AdmissionGate, FakeClock]:
    """A gate whose cycle estimate is exactly ``cost_ms`` (one warm-up cycle of that cost, no deviation)."""
    gate, clock = make_gate(warmup=1, **settings)
    cycle = gate.start_cycle(clock())
    clock.advance(cost_ms)
    gate.record(cycle)
    return gate, clock


def test_with_chunks_the_deadline_is_where_the_held_commands_run_out_minus_the_margin():
    """A 250 ms cycle, 33 ms deadline_ms: refused on the fixed deadline, admitted while 300 ms of chunk are held,
    with the deadline at the chunk's end less horizon_margin_ms (10 ms by default)."""
    gate, clock = cycle_trained(250.0)
    assert gate.start_cycle(clock()).verdict is Verdict.REFUSED  # today's rule: 250 ms > 33 ms
    held = Horizon(end_ns=clock.after(300), last_ns=500 * NS_PER_MS)
    cycle = gate.start_cycle(clock(), held)
    assert cycle.verdict is Verdict.ADMITTED and cycle.deadline_ns == clock.after(290)
    horizon = gate.snapshot().horizon
    assert (horizon.planned, horizon.empty, horizon.left_ms, horizon.predicted_ms, horizon.slack_ms) == (
        1, 0, 300.0, 250.0, 40.0)


def test_a_cycle_that_cannot_beat_the_held_commands_still_starts_and_one_whose_chunk_would_be_past_is_refused():
    """Predicted past the held end (255 ms left, 10 ms margin, 250 ms cycle): refusing would only lengthen the stop
    (the next frame has the same end, a frame period nearer), so it starts, judged by its own chunk's last action
    and counted late. A cycle whose own chunk would be past when ready is refused."""
    gate, clock = cycle_trained(250.0)
    short = Horizon(end_ns=clock.after(255), last_ns=500 * NS_PER_MS)
    cycle = gate.start_cycle(clock(), short)
    assert cycle.verdict is Verdict.ADMITTED and cycle.deadline_ns == clock.after(490)
    horizon = gate.snapshot().horizon
    assert (horizon.deadline, horizon.planned, horizon.late, horizon.empty) == ("own", 0, 1, 0)
    assert horizon.slack_ms == pytest.approx(-5.0) and horizon.left_ms == 255.0
    useless = Horizon(end_ns=clock.after(255), last_ns=240 * NS_PER_MS)  # its last action starts before it is ready
    assert gate.start_cycle(clock(), useless).verdict is Verdict.REFUSED
    assert gate.snapshot().kinds["cycle"].refused == 1


def test_the_reasoner_waits_until_the_horizon_left_falls_to_the_predicted_cycle_plus_margin():
    gate, clock = cycle_trained(250.0, horizon_margin_ms=20.0)
    held = Horizon(end_ns=clock.after(500), last_ns=500 * NS_PER_MS)
    assert gate.start_at_ns(held) == clock.after(500 - 20 - 250)
    clock.advance(230)
    assert gate.start_at_ns(held) == clock()  # now, and admitted with the margin to spare exactly
    cycle = gate.start_cycle(clock(), held)
    assert cycle.verdict is Verdict.ADMITTED and cycle.deadline_ns == clock.after(250)
    assert gate.snapshot().horizon.slack_ms == 0.0
    assert gate.start_at_ns(None) == clock()  # no horizon (sync, H = 1): at once, as ever


def test_with_nothing_held_the_new_chunks_own_last_action_is_the_deadline():
    """Before the first chunk or after starvation the robot is stopping: a chunk ready while it still has an action
    for the next tick is better than that, so the deadline is when its last executed action starts (the frame's
    time + (s - 1) periods), less the margin."""
    gate, clock = cycle_trained(250.0)
    frame = clock.after(-20)  # received 20 ms ago
    empty = Horizon(end_ns=None, last_ns=400 * NS_PER_MS)
    assert gate.start_at_ns(empty) == clock()
    cycle = gate.start_cycle(frame, empty)
    assert cycle.verdict is Verdict.ADMITTED and cycle.deadline_ns == frame + 390 * NS_PER_MS
    within_margin = Horizon(end_ns=clock.after(5), last_ns=400 * NS_PER_MS)  # runs out within the 10 ms margin
    assert gate.start_cycle(frame, within_margin).deadline_ns == frame + 390 * NS_PER_MS
    too_short = Horizon(end_ns=None, last_ns=200 * NS_PER_MS)  # its chunk would be past before it is ready
    assert gate.start_cycle(frame, too_short).verdict is Verdict.REFUSED
    assert gate.start_cycle(clock.after(-400), empty).verdict is Verdict.STALE
    assert gate.snapshot().horizon.empty == 4 and gate.snapshot().horizon.left_ms is None


def test_the_first_cycles_are_warm_up_cycles_on_the_horizon_too():
    """No estimate yet: admitted unless the deadline has passed, and the reasoner never waits."""
    gate, clock = make_gate(warmup=3)
    held = Horizon(end_ns=clock.after(100), last_ns=500 * NS_PER_MS)
    assert gate.start_at_ns(held) == clock()
    assert gate.start_cycle(clock(), held).verdict is Verdict.WARMUP
    assert gate.snapshot().horizon.predicted_ms is None and gate.snapshot().horizon.slack_ms is None


def test_the_horizon_margin_is_live():
    gate, clock = cycle_trained(250.0)
    held = Horizon(end_ns=clock.after(300), last_ns=500 * NS_PER_MS)
    assert gate.start_cycle(clock(), held).deadline_ns == clock.after(290)
    gate.configure(knobs(warmup=1, horizon_margin_ms=60.0))
    assert gate.start_at_ns(held) == clock()  # 300 - 60 < 250: at once, and late
    assert gate.start_cycle(clock(), held).deadline_ns == clock.after(440)
    assert gate.snapshot().horizon.late == 1


def test_a_blending_mode_is_planned_on_the_execution_horizon_and_a_slower_cycle_on_the_held_end():
    """rtc / ensemble hold the chunk to its end E (500 ms left) but want the next chunk by the end of the execution
    horizon S (300 ms left), so that the rest of the chunk is the overlap it blends over: the reasoner waits until
    S - margin - predicted and the cycle's deadline is S - margin. A cycle predicted past S but before E is planned
    on E (shortened: it blends over less); one past E starts late, by its own chunk's last action."""
    gate, clock = cycle_trained(250.0)
    blending = Horizon(end_ns=clock.after(500), last_ns=700 * NS_PER_MS, switch_ns=clock.after(300))
    assert blending.target_ns == clock.after(300)
    assert gate.start_at_ns(blending) == clock.after(300 - 10 - 250)
    clock.advance(40)
    cycle = gate.start_cycle(clock(), blending)
    assert cycle.verdict is Verdict.ADMITTED and cycle.deadline_ns == blending.switch_ns - 10 * NS_PER_MS
    horizon = gate.snapshot().horizon
    assert (horizon.deadline, horizon.planned, horizon.shortened, horizon.left_ms, horizon.slack_ms) == (
        "switch", 1, 0, 460.0, 200.0)  # left and slack: to E, where the robot would starve
    clock.advance(100)  # 160 ms left to S, 360 to E
    cycle = gate.start_cycle(clock(), blending)
    assert cycle.verdict is Verdict.ADMITTED and cycle.deadline_ns == blending.end_ns - 10 * NS_PER_MS
    horizon = gate.snapshot().horizon
    assert (horizon.deadline, horizon.planned, horizon.shortened, horizon.late) == ("held", 2, 1, 0)
    clock.advance(200)  # 160 ms left to E
    frame = clock()
    assert gate.start_cycle(frame, blending).deadline_ns == frame + 690 * NS_PER_MS
    assert gate.snapshot().horizon.late == 1
    assert Horizon(clock.after(100), 0, clock.after(300)).target_ns == clock.after(100)  # never past E
