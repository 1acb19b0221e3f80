"""Deadline-aware admission: start a reasoning block only when it is predicted to finish in time.

A refused block is cheap (the action publisher keeps serving the last action); a started block that
overruns the control deadline is a *miss*, and misses are what this gate exists to drive to zero.
Costs are learned online per block kind. No ROS here, so the reasoning node, offline replay and
benchmarks run the same gate. One frame's cycle, as the reasoning loop drives it::

    cycle = gate.start_cycle(frame.receive_ns)  # stale, or the whole cycle would not fit: skip frame
    if not cycle:
        continue
    # a VL checkpoint first runs its vision tower as a block of its own (BlockKind.VISION_ENCODE),
    # admitted and recorded like the prefill below: its cost is learned apart from the prefill's
    block = gate.admit(BlockKind.ENCODE_PREFILL, cycle.deadline_ns, within=cycle.verdict)
    if not block:
        continue
    encode_and_prefill(frame)
    gate.record(block)
    for _ in range(action_tokens):
        step = gate.admit(BlockKind.DECODE, cycle.deadline_ns, within=cycle.verdict)
        if not step:
            break
        decode_step()
        gate.record(step)
    else:
        gate.record(cycle)  # action ready: cycle cost, and frame -> action latency into the histogram

A cycle cut short by a refusal is not recorded, so ``warmup + admitted - completed`` of kind ``cycle``
counts cycles that were started but produced no action.

Cost estimate (per kind, the Jacobson/Karels estimator TCP uses for its retransmit timer): an EMA of
measured durations and an EMA of their absolute deviation from the estimate; predicted cost =
``mean + k * deviation``. A block is admitted when ``now + predicted <= deadline``. For ``cycle`` the
measured cost is cycle start -> action ready (what starting a cycle now would still cost); the
histogram holds frame receive -> action ready (what the robot experiences).

Probing: an estimate only moves when its kind is measured, so an estimate inflated by a slow spell
(start-up, a busy machine) would refuse every later block and never learn that things got better.
- After ``probe_after`` refusals in a row, a block (or cycle) that fits on its *mean* cost, without
  the margin, starts anyway as a ``probe``; the blocks inside a probe cycle are judged the same way.
  A probe can only miss where an average block would, so misses stay rare while the estimate heals.
- A kind whose mean alone overruns is either too slow for the deadline or was measured in a slow
  spell that has passed; only running it tells which. After ``4 * probe_after`` refusals in a row it
  starts once anyway as a ``recovery`` probe, and the blocks inside a recovery cycle start unless the
  deadline has already passed. Each recovery that does not bring the estimate back doubles the wait
  (up to ``64 * probe_after`` refusals, about 21 s at 30 Hz with the default 10), so a model that is
  simply too slow costs one late action every so often while the publisher holds its safe stop, and a
  machine that got fast again is noticed within seconds. Without this, one slow spell would stop the
  robot for good.

Cold start: a kind with fewer than ``warmup`` measurements has no trusted estimate (a first sample
gives a mean but no spread). Its blocks are admitted without a prediction unless the deadline has
already passed (then any work is a certain miss), and are counted as ``warmup``, not ``admitted``.
Their overruns count as misses like any other (the robot saw them) and also as ``warmup_missed``, so
a summary separates the price of learning from the gate's own mistakes. When warm-up ends the
estimate is seeded from the *median* of the warm-up samples and their mean absolute deviation from
it: the first cycles pay one-off costs (page faults, allocator growth, a DDS graph still forming)
and an EMA seeded with such an outlier would take dozens of samples to forget it, refusing all the
while. A configured prior cost was not chosen: a prior measured on other hardware silently refuses
or overcommits; warm-up is visible.

Chunks: a gate that plans for the horizon. A chunked model's cycle gives H actions, executed one a control
period by the publisher's action timeline (``action_timeline.py``), so the robot is fine as long as the next
chunk is ready before the commands the timeline holds run out; a cycle's deadline is that moment, not a
fixed ``deadline_ms`` after its frame. When the timeline executes chunks (``execution`` other than sync; a
checkpoint of H = 1 under ``auto`` is sync), whoever drives the gate passes the timeline's ``Horizon`` to
``start_cycle`` and ``start_at_ns``: where its commands end (``E``), where the next chunk should take over
(``S``, the end of the execution horizon: s actions of the newest chunk; ``E`` itself in ``chunk``, whose plan
ends there) and when a new chunk's last executable action starts. In the blending modes (``rtc``,
``ensemble``) the newest chunk's actions beyond s are held too: they are the overlap the next chunk is blended
over (RTC's H - s), and the robot's reserve when that chunk is late. So:

- the reasoner waits until ``start_at_ns``, ``S - m - predicted cycle`` (m: ``horizon_margin_ms``), before taking
  a frame, so that the next chunk is ready by ``S``: a chunk computed earlier would replace one that still had
  time to run, from an older frame than needed (RTC starts an inference at the execution horizon s, LeRobot's
  async client when its queue falls below a fraction of the chunk; here the chunk is to be *ready* by s);
- a cycle predicted to be ready by ``S - m`` has that as its deadline;
- one predicted to be ready after it but before ``E - m`` (a model too slow for s: the next chunk takes over
  later and blends over fewer actions) has ``E - m`` as its deadline, counted ``shortened``; finishing after
  either deadline is a miss (after ``E - m`` the robot starves in between);
- with nothing held (before the first chunk, after starvation, or within m of the end), or when the cycle is
  predicted to be ready only after the held commands run out, the deadline is the start of the new chunk's
  own last executable action (its frame's receive time + (H - 1) control periods in the blending modes,
  (s - 1) in ``chunk``), minus m: a chunk ready by then still has an action for the next tick, so it is
  started (counted ``late`` when commands were still held); one predicted later would find all its actions
  past and be rejected as late, so it is refused.

Why a cycle that cannot beat the held commands is not refused, unlike one that cannot meet ``deadline_ms``:
refusing it does not keep the robot from stopping, it makes the stop longer. The next frame brings no new
deadline, the same ``E`` with a frame period less to reach it, so every frame until ``E`` would be refused
too, and the chunk that ends the stop starts only after it. On the virtual clock at 30 Hz with 16-action
chunks and cycles drawn uniformly from 140-260 ms (predicted at mean + 3 deviations, about 270 ms), refusing
them starved 25.2 % of the ticks after the first chunk (286 refusals, 23.6 distinct commands a second);
starting them starves 0.1 % (30.0 a second). At 12 actions: 53.6 % against 21.5 %.

The first cycles are warm-up cycles as for any kind (admitted unless their deadline has passed, and the
reasoner does not wait), so the first chunk comes whatever the model costs, as today.

Without a horizon (H = 1, or ``sync``) nothing of this applies: the deadline is ``deadline_ms`` after the
frame, exactly as before. ``snapshot().horizon`` counts the cycles judged each way (planned on the held
commands, of which those past ``S``; started with nothing held; started late) and keeps the horizon left (to
``E``), the predicted cycle and their slack at the last start.

Percentiles come from a fixed-edge histogram, not a ring of recent samples: memory is constant, it
covers the whole never-ending run (a ring's p99 would describe only its last window), and a query
costs one pass over the buckets. The price is resolution: a percentile is reported as the upper edge
of the bucket holding it, capped at the exact maximum, i.e. a conservative bound at most one bucket
above the truth. Default edges are geometric, 5 % apart, from 0.05 ms to about 2 s.
"""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from ..config import GateKnobs
from .clock import NS_PER_MS

_MAX_RECOVERY_DOUBLINGS = 4  # recovery waits go 4, 8, 16, 32, 64 x probe_after refusals


class BlockKind(str, Enum):
    """What a gate decision is about; a str, so ``stats.kinds["decode"]`` works."""

    ENCODE_PREFILL = "encode_prefill"  # encode one frame and prefill its tokens (VL: the prefill alone)
    VISION_ENCODE = "vision_encode"  # a VL checkpoint's vision tower on one frame, before its prefill
    DECODE = "decode"  # one decode step of the action
    CYCLE = "cycle"  # the whole cycle, decided once per frame by start_cycle
    PROMPT = "prompt"  # a new instruction's prompt, prefilled or loaded from the KV store (start_required)


class Verdict(str, Enum):
    """Why a block may or may not start; the reason shows in logs and counters."""

    ADMITTED = "admitted"  # predicted to finish by the deadline
    WARMUP = "warmup"  # started without a trusted estimate (cold start)
    REFUSED = "refused"  # predicted to overrun, so not started
    PROBE = "probe"  # started on its mean cost after a run of refusals, to re-measure (see module doc)
    RECOVERY = "recovery"  # started although its mean overran, after a long run of refusals (module doc)
    STALE = "stale"  # the frame was already past its deadline: its cycle is skipped


@dataclass(frozen=True)
class Horizon:
    """What the action timeline will execute, for a gate that plans on it (see the module doc)."""

    end_ns: int | None  # when the commands it holds run out with no new chunk; None: it holds none
    last_ns: int  # from a new chunk's observation to its last executable action: (H - 1) or (s - 1) control periods
    switch_ns: int | None = None  # when the next chunk should take over (the execution horizon's end); None: end_ns

    @property
    def target_ns(self) -> int | None:
        """When the next chunk should be ready: the execution horizon's end, never after the commands run out."""
        if self.end_ns is None or self.switch_ns is None:
            return self.end_ns
        return min(self.switch_ns, self.end_ns)


@dataclass(frozen=True)
class Decision:
    """One answer of the gate; truthy when the block may start. Pass it back to ``record``."""

    kind: BlockKind
    verdict: Verdict
    started_ns: int  # clock at the decision; a recorded block's duration is measured from here
    deadline_ns: int
    predicted_ns: float | None  # the cost the decision relied on; None in warm-up and when stale
    received_ns: int | None = None  # cycles only: the frame's receive time, for its latency

    def __bool__(self) -> bool:
        return self.verdict in (Verdict.ADMITTED, Verdict.WARMUP, Verdict.PROBE, Verdict.RECOVERY)


def geometric_edges_ms(first: float = 0.05, last: float = 2000.0, ratio: float = 1.05) -> tuple[float, ...]:
    """Bucket edges with constant relative resolution, so sub-ms decode steps and 30 ms cycles both resolve."""
    count = math.ceil(math.log(last / first) / math.log(ratio)) + 1
    return tuple(round(first * ratio**i, 6) for i in range(count))


DEFAULT_EDGES_MS = geometric_edges_ms()


class LatencyHistogram:
    """Counts per fixed bucket ``(edge[i-1], edge[i]]`` plus one overflow bucket: constant memory forever."""

    def __init__(self, edges_ms: Sequence[float] = DEFAULT_EDGES_MS) -> None:
        edges = [_finite("bucket edge", e) for e in edges_ms]
        if not edges or edges[0] <= 0 or any(b <= a for a, b in zip(edges, edges[1:])):
            raise ValueError(f"bucket edges must be positive and strictly increasing, got {list(edges_ms)!r}")
        self.edges_ms = tuple(edges)
        self._edges_ns = [round(e * NS_PER_MS) for e in edges]
        self.counts = [0] * (len(edges) + 1)
        self.total = 0
        self.max_ns = 0

    def add(self, duration_ns: int) -> None:
        self.counts[bisect_left(self._edges_ns, duration_ns)] += 1
        self.total += 1
        self.max_ns = max(self.max_ns, duration_ns)

    def percentile_ms(self, q: float) -> float | None:
        """Nearest-rank percentile as its bucket's upper edge (capped at the maximum); None when empty."""
        if not 0 < q <= 100:
            raise ValueError(f"percentile must be in (0, 100], got {q!r}")
        if self.total == 0:
            return None
        rank = max(1, math.ceil(q * self.total / 100))
        max_ms = self.max_ns / NS_PER_MS
        seen = 0
        for edge, count in zip(self.edges_ms, self.counts):
            seen += count
            if seen >= rank:
                return min(edge, max_ms)
        return max_ms  # the rank lies in the overflow bucket, whose only known bound is the maximum


class CostEstimate:
    """EMA of one kind's durations and of their absolute deviation from the estimate, in ns.

    The first ``warmup`` samples are kept and, once all are in, seed the EMA with their median and
    mean absolute deviation from it (see the module doc); after that, memory is three numbers.
    """

    __slots__ = ("mean_ns", "deviation_ns", "count", "_warmup_samples")

    def __init__(self) -> None:
        self.mean_ns = 0.0
        self.deviation_ns = 0.0
        self.count = 0
        self._warmup_samples: list[int] = []

    def update(self, duration_ns: int, alpha: float, warmup: int = 1) -> None:
        self.count += 1
        if self._warmup_samples is not None and self.count <= warmup:
            self._warmup_samples.append(duration_ns)
            ordered = sorted(self._warmup_samples)
            middle = len(ordered) // 2
            median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
            self.mean_ns = float(median)
            self.deviation_ns = sum(abs(d - median) for d in ordered) / len(ordered)
            return
        self._warmup_samples = None
        # deviation first, against the estimate the gate actually used for this block
        self.deviation_ns += alpha * (abs(duration_ns - self.mean_ns) - self.deviation_ns)
        self.mean_ns += alpha * (duration_ns - self.mean_ns)

    def predict_ns(self, k: float) -> float:
        return self.mean_ns + k * self.deviation_ns


@dataclass
class _Counts:
    admitted: int = 0
    warmup: int = 0
    refused: int = 0
    missed: int = 0
    warmup_missed: int = 0
    probes: int = 0
    recoveries: int = 0
    refused_in_a_row: int = 0
    recovery_backoff: int = 0  # recoveries since the last admission: each doubles the wait for the next


@dataclass(frozen=True)
class KindStats:
    admitted: int  # started on an estimate
    warmup: int  # started during warm-up, without one
    refused: int  # not started: predicted to overrun
    missed: int  # started (either way) and finished after the deadline
    warmup_missed: int  # the part of ``missed`` that were warm-up blocks
    completed: int  # recorded measurements
    probes: int  # started on the mean cost after a run of refusals, to re-measure the estimate
    recoveries: int  # started although the mean overran, after a long run of refusals
    mean_ms: float | None
    deviation_ms: float | None
    predicted_ms: float | None  # what the next decision would use (None before any measurement)


@dataclass(frozen=True)
class LatencyStats:
    """Frame receive -> action ready, over every completed cycle of the run."""

    count: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None


@dataclass
class HorizonStats:
    """The cycles started on a chunk's horizon, and the last one's plan: the predicted cycle against the horizon."""

    deadline: str = "fixed"  # the last cycle's: fixed (deadline_ms), switch (the execution horizon's end), held (the
    #                          commands held), own (its chunk's)
    margin_ms: float = 0.0  # horizon_margin_ms
    planned: int = 0  # cycles predicted to be ready before the commands held run out: on the switch or the held end
    shortened: int = 0  # of those, the ones predicted after the execution horizon's end: their deadline is the held end
    empty: int = 0  # cycles judged with no commands held (first chunk, after starvation): by their chunk's own end
    late: int = 0  # cycles judged when the commands held would run out first: by their chunk's own end, not refused
    left_ms: float | None = None  # the last cycle's horizon left at its start (None: nothing was held)
    predicted_ms: float | None = None  # what that cycle was predicted to cost (None in warm-up)
    slack_ms: float | None = None  # left - margin - predicted at that start: below 0 the robot is expected to starve
    slack_min_ms: float | None = None  # the least slack of any planned cycle since the gate was made


@dataclass(frozen=True)
class AdmissionStats:
    """A consistent copy of the gate's counters and settings, for diagnostics and the run summary."""

    deadline_ms: float
    alpha: float
    k: float
    warmup: int
    stale: int
    kinds: dict[str, KindStats]
    latency: LatencyStats
    horizon: HorizonStats = field(default_factory=HorizonStats)

    @property
    def missed(self) -> int:
        return sum(s.missed for s in self.kinds.values())

    @property
    def refused(self) -> int:
        return sum(s.refused for s in self.kinds.values())


def _finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


class AdmissionGate:
    """Admits blocks predicted to meet their cycle's deadline and accounts for every outcome.

    Thread-safe: the reasoning thread decides and records while diagnostics read ``snapshot`` and a
    parameter callback calls ``configure``; new settings apply from the next decision on.
    """

    def __init__(self, knobs: GateKnobs, *, probe_after: int = 10,
                 bucket_edges_ms: Sequence[float] = DEFAULT_EDGES_MS, clock: Callable[[], int] = time.monotonic_ns) -> None:
        if not callable(clock):
            raise ValueError(f"clock must be a callable returning monotonic ns, got {clock!r}")
        self._clock = clock
        self._set(knobs)
        if not isinstance(probe_after, int) or probe_after < 1:
            raise ValueError(f"probe_after={probe_after!r} must be an integer >= 1")
        self._probe_after = probe_after
        self._estimates = {kind: CostEstimate() for kind in BlockKind}
        self._counts = {kind: _Counts() for kind in BlockKind}
        self._latency = LatencyHistogram(bucket_edges_ms)
        self._stale = 0
        self._horizon = HorizonStats()
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, values: Mapping[str, Any], *, clock: Callable[[], int] = time.monotonic_ns) -> AdmissionGate:
        """The gate of a reasoning node's settings (``deadline_ms``, ``ema_alpha``, ``margin_k``, ``warmup_cycles``)."""
        return cls(GateKnobs.of(values), clock=clock)

    def configure(self, knobs: GateKnobs) -> None:
        """Change settings live (the schema checked them). ``deadline_ms`` applies to cycles started
        afterwards: a started cycle keeps the deadline it began with."""
        with self._lock:
            self._set(knobs)

    def _set(self, knobs: GateKnobs) -> None:
        self._alpha, self._k = knobs.ema_alpha, knobs.margin_k
        self._deadline_ms, self._warmup = knobs.deadline_ms, knobs.warmup_cycles
        self._margin_ns = round(knobs.horizon_margin_ms * NS_PER_MS)

    def now_ns(self) -> int:
        """The gate's clock (monotonic live, virtual in replay)."""
        return self._clock()

    def start_cycle(self, received_ns: int, horizon: Horizon | None = None) -> Decision:
        """Decide whether to work on a frame received at ``received_ns``; its deadline rides in the Decision.
        ``horizon``: what the action timeline executes, when it executes chunks (module doc); None: the fixed
        ``deadline_ms``."""
        with self._lock:
            now = self._clock()
            if horizon is None:
                deadline = received_ns + round(self._deadline_ms * NS_PER_MS)
                self._horizon.deadline = "fixed"
            else:
                deadline = self._horizon_deadline(now, received_ns, horizon)
            if now > deadline:
                self._stale += 1
                return Decision(BlockKind.CYCLE, Verdict.STALE, now, deadline, None, received_ns)
            return self._decide(BlockKind.CYCLE, now, deadline, received_ns)

    def _horizon_deadline(self, now: int, received_ns: int, horizon: Horizon) -> int:
        """The cycle's deadline on the horizon (module doc), its plan kept for ``snapshot``."""
        stats, end = self._horizon, horizon.end_ns
        estimate = self._estimates[BlockKind.CYCLE]
        predicted = estimate.predict_ns(self._k) if estimate.count >= self._warmup else None
        stats.predicted_ms = None if predicted is None else predicted / NS_PER_MS
        stats.margin_ms = self._margin_ns / NS_PER_MS
        held = None if end is None else end - self._margin_ns
        stats.left_ms = None if end is None or held < now else (end - now) / NS_PER_MS
        stats.slack_ms = None if stats.left_ms is None or predicted is None else (held - now - predicted) / NS_PER_MS
        if stats.slack_ms is not None:
            stats.slack_min_ms = stats.slack_ms if stats.slack_min_ms is None else min(stats.slack_min_ms,
                                                                                       stats.slack_ms)
        if held is not None:
            switch = horizon.target_ns - self._margin_ns
            if switch >= now + (predicted or 0):
                stats.deadline, stats.planned = ("switch" if switch < held else "held"), stats.planned + 1
                return switch
            if held >= now + (predicted or 0):
                stats.deadline, stats.planned, stats.shortened = "held", stats.planned + 1, stats.shortened + 1
                return held
        if stats.left_ms is None:
            stats.empty += 1
        else:
            stats.late += 1
        stats.deadline = "own"
        return received_ns + horizon.last_ns - self._margin_ns

    def start_at_ns(self, horizon: Horizon | None) -> int:
        """When the next cycle should start (now or later; the reasoner waits until then before taking a frame):
        once the time to the horizon's target (the execution horizon's end, or where the commands held run out)
        falls to the predicted cycle plus ``horizon_margin_ms``. At once without a horizon, with nothing held, or
        while the cycle's cost is still being learned (warm-up)."""
        with self._lock:
            now = self._clock()
            estimate = self._estimates[BlockKind.CYCLE]
            if horizon is None or horizon.end_ns is None or estimate.count < self._warmup:
                return now
            return max(now, horizon.target_ns - self._margin_ns - math.ceil(estimate.predict_ns(self._k)))

    def admit(self, kind: BlockKind | str, deadline_ns: int, *, within: Verdict = Verdict.ADMITTED) -> Decision:
        """Decide whether a ``vision_encode``, ``encode_prefill`` or ``decode`` block of a cycle may start now.

        ``within`` is the verdict of the cycle the block belongs to. Inside a ``probe`` cycle a block
        is judged on its mean cost without the margin, so a block estimate inflated by a slow spell is
        re-measured too, while a block that would overrun even on average is still refused; inside a
        ``recovery`` cycle every block starts unless the deadline has already passed.
        """
        kind = BlockKind(kind)
        if kind is BlockKind.CYCLE:
            raise ValueError("a cycle starts through start_cycle(received_ns), which also detects stale frames")
        within = Verdict(within)
        with self._lock:
            now = self._clock()
            if within is Verdict.RECOVERY and self._estimates[kind].count >= self._warmup:
                if now <= deadline_ns:
                    self._counts[kind].recoveries += 1
                    return Decision(kind, Verdict.RECOVERY, now, deadline_ns, None)
                self._counts[kind].refused += 1
                return Decision(kind, Verdict.REFUSED, now, deadline_ns, None)
            return self._decide(kind, now, deadline_ns, None, 0.0 if within is Verdict.PROBE else self._k)

    def start_required(self, kind: BlockKind | str) -> Decision:
        """Start a block that must run whatever it costs (a new instruction's ``prompt``: the robot must take
        the new task), with the deadline's length as its budget: its cost is learned like any block's, and
        one that takes longer than a deadline counts as missed. Nothing is refused here; the frames after it
        are judged by the time it took."""
        kind = BlockKind(kind)
        if kind in (BlockKind.CYCLE, BlockKind.ENCODE_PREFILL, BlockKind.VISION_ENCODE, BlockKind.DECODE):
            raise ValueError(f"a {kind.value} block is admitted, never required: start_cycle / admit")
        with self._lock:
            now = self._clock()
            estimate, counts = self._estimates[kind], self._counts[kind]
            warm = estimate.count >= self._warmup
            if warm:
                counts.admitted += 1
            else:
                counts.warmup += 1
            return Decision(kind, Verdict.ADMITTED if warm else Verdict.WARMUP, now,
                            now + round(self._deadline_ms * NS_PER_MS), estimate.predict_ns(self._k) if warm else None)

    def _decide(self, kind: BlockKind, now: int, deadline: int, received_ns: int | None,
                k: float | None = None) -> Decision:
        estimate, counts = self._estimates[kind], self._counts[kind]
        if estimate.count < self._warmup:
            if now <= deadline:
                counts.warmup += 1
                return Decision(kind, Verdict.WARMUP, now, deadline, None, received_ns)
            counts.refused += 1
            return Decision(kind, Verdict.REFUSED, now, deadline, None, received_ns)
        predicted = estimate.predict_ns(self._k if k is None else k)
        if now + predicted <= deadline:
            counts.admitted += 1
            counts.refused_in_a_row = counts.recovery_backoff = 0
            return Decision(kind, Verdict.ADMITTED, now, deadline, predicted, received_ns)
        mean = estimate.predict_ns(0.0)
        if counts.refused_in_a_row >= self._probe_after and now + mean <= deadline:
            counts.refused_in_a_row = 0
            counts.probes += 1
            return Decision(kind, Verdict.PROBE, now, deadline, mean, received_ns)
        recovery_wait = self._probe_after * 2 ** (2 + min(counts.recovery_backoff, _MAX_RECOVERY_DOUBLINGS))
        if counts.refused_in_a_row >= recovery_wait and now <= deadline:
            counts.refused_in_a_row = 0
            counts.recovery_backoff += 1
            counts.recoveries += 1
            return Decision(kind, Verdict.RECOVERY, now, deadline, mean, received_ns)
        counts.refused_in_a_row += 1
        counts.refused += 1
        return Decision(kind, Verdict.REFUSED, now, deadline, predicted, received_ns)

    def record(self, decision: Decision, finished_ns: int | None = None) -> bool:
        """Account a started block that has finished (default: now); return whether it missed its deadline."""
        if not decision:
            raise ValueError(f"{decision.kind.value} block was {decision.verdict.value}, never started: "
                             "nothing to record")
        with self._lock:
            finished = self._clock() if finished_ns is None else finished_ns
            if finished < decision.started_ns:
                raise ValueError(f"finished at {finished} ns before it started at {decision.started_ns} ns; "
                                 "the clock must be monotonic")
            self._estimates[decision.kind].update(finished - decision.started_ns, self._alpha, self._warmup)
            missed = finished > decision.deadline_ns
            counts = self._counts[decision.kind]
            if missed:
                counts.missed += 1
                if decision.verdict is Verdict.WARMUP:
                    counts.warmup_missed += 1
            if decision.received_ns is not None:
                self._latency.add(finished - decision.received_ns)
            return missed

    def snapshot(self) -> AdmissionStats:
        """Copy counters, estimates and latency percentiles (one histogram pass) under the lock."""
        with self._lock:
            kinds = {kind.value: self._kind_stats(kind) for kind in BlockKind}
            hist = self._latency
            latency = LatencyStats(hist.total, hist.percentile_ms(50), hist.percentile_ms(99),
                                   hist.max_ns / NS_PER_MS if hist.total else None)
            return AdmissionStats(self._deadline_ms, self._alpha, self._k, self._warmup, self._stale, kinds, latency,
                                  replace(self._horizon))

    def _kind_stats(self, kind: BlockKind) -> KindStats:
        estimate, c = self._estimates[kind], self._counts[kind]
        measured = estimate.count > 0
        return KindStats(
            c.admitted, c.warmup, c.refused, c.missed, c.warmup_missed, estimate.count, c.probes, c.recoveries,
            estimate.mean_ns / NS_PER_MS if measured else None,
            estimate.deviation_ns / NS_PER_MS if measured else None,
            estimate.predict_ns(self._k) / NS_PER_MS if measured else None,
        )
