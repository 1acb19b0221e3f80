"""What the reasoning node's diagnostics say: is the robot getting actions, and if not, why.

Every frame the reasoner takes ends one way: ``acted`` (an action in time), ``refused`` (the gate did
not start it, or stopped it between blocks), ``stale`` (already past its deadline when taken),
``missed`` (started, and finished late), ``invalid`` (the model's output held NaN or Inf, so no action
came of it) or ``failed`` (the cycle raised). Over the last ``diagnostics.window_s`` the share of frames
without an action (refused + stale) and the share that missed are held against their WARN and ERROR
thresholds; any invalid output in the window, and a failure in the last second, is an ERROR: a model
that outputs NaN is broken, not slow.
The message says what the robot is getting and why: when the gate refuses, the cycle cost it predicts
against the deadline. Nothing here reads a clock: the caller passes ``now_ns``. The reasoning thread
records while the diagnostics timer judges, so both hold a lock (for microseconds).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import IntEnum

from ..config import DiagnosticsKnobs
from .admission import AdmissionStats, Verdict
from .event_window import EventWindow
from .reasoner import CycleResult

OUTCOMES = ("acted", "refused", "stale", "missed", "invalid", "failed")
FAILURE_HOLD_NS = 1_000_000_000  # a failed cycle keeps the status at ERROR this long


class Level(IntEnum):
    """diagnostic_msgs/DiagnosticStatus levels."""

    OK = 0
    WARN = 1
    ERROR = 2


def outcome_of(result: CycleResult) -> str:
    """The one way a cycle ended (see the module doc)."""
    if result.invalid:
        return "invalid"
    if result.missed:
        return "missed"
    if result.action is not None:
        return "acted"
    return "stale" if result.verdict is Verdict.STALE else "refused"


@dataclass(frozen=True)
class Health:
    level: Level
    message: str
    shares: dict[str, float]  # outcome -> share of the window's frames


class ReasoningHealth:
    """Outcomes over a sliding window, judged against ``DiagnosticsKnobs``."""

    def __init__(self, knobs: DiagnosticsKnobs) -> None:
        self._lock = threading.Lock()
        self.knobs = knobs
        self.window = EventWindow(knobs.window_s)
        self._last_failure_ns: int | None = None

    def configure(self, knobs: DiagnosticsKnobs) -> None:
        """New thresholds; a new window length starts the window afresh."""
        with self._lock:
            if knobs.window_s != self.knobs.window_s:
                self.window = EventWindow(knobs.window_s)
            self.knobs = knobs

    def record(self, outcome: str, now_ns: int) -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown cycle outcome {outcome!r}, expected one of {OUTCOMES}")
        with self._lock:
            self.window.add(outcome, now_ns)
            if outcome == "failed":
                self._last_failure_ns = now_ns

    def judge(self, now_ns: int, gate: AdmissionStats) -> Health:
        with self._lock:
            counts, knobs, last_failure = self.window.counts(now_ns), self.knobs, self._last_failure_ns
        total = sum(counts[o] for o in OUTCOMES)
        shares = {o: counts[o] / total if total else 0.0 for o in OUTCOMES}
        window = f"{knobs.window_s:g} s"
        no_action = shares["refused"] + shares["stale"]
        level, reasons = Level.OK, []
        if last_failure is not None and now_ns - last_failure < FAILURE_HOLD_NS:
            level = Level.ERROR
            reasons.append(f"cycles failing ({counts['failed']} in the last {window})")
        if counts["invalid"]:
            level = Level.ERROR
            reasons.append(f"model output not finite (NaN or Inf) on {shares['invalid']:.0%} of frames over the "
                           f"last {window} ({counts['invalid']} frames): no action from them")
        if total and no_action > knobs.refused_warn_share:
            level = max(level, Level.ERROR if no_action > knobs.refused_error_share else Level.WARN)
            reasons.append(f"no action for {no_action:.0%} of frames over the last {window} "
                           f"({counts['refused']} refused, {counts['stale']} stale): {_why_refused(gate)}")
        if total and shares["missed"] > knobs.missed_warn_share:
            level = max(level, Level.ERROR if shares["missed"] > knobs.missed_error_share else Level.WARN)
            cycle = gate.kinds["cycle"]
            mean = f"{cycle.mean_ms:.1f} ms" if cycle.mean_ms is not None else "unmeasured"
            deadline = f"{gate.deadline_ms:g} ms" if gate.horizon.deadline == "fixed" else _deadline(gate)
            reasons.append(f"missing the deadline on {shares['missed']:.0%} of frames over the last {window} "
                           f"(cycle mean {mean}, deadline {deadline})")
        if not reasons:
            reasons.append(f"acting on {shares['acted']:.0%} of frames within the deadline over the last {window}"
                           if total else "waiting for frames")
        return Health(level, "; ".join(reasons), shares)


def _deadline(gate: AdmissionStats) -> str:
    """The last cycle's deadline in words: the fixed one, or one on a chunk's horizon (``admission.py``)."""
    horizon = gate.horizon
    if horizon.deadline == "switch" and horizon.left_ms is not None:
        return (f"the end of the execution horizon, less the {horizon.margin_ms:g} ms margin (the chunk held had "
                f"{horizon.left_ms:.1f} ms left at the start)")
    if horizon.deadline == "held" and horizon.left_ms is not None:
        return f"the chunk's end ({horizon.left_ms:.1f} ms left at the start, less the {horizon.margin_ms:g} ms margin)"
    if horizon.deadline == "own":
        return (f"the new chunk's last action, less the {horizon.margin_ms:g} ms margin (the chunk held runs out "
                "first, or none is held)")
    return f"the {gate.deadline_ms:g} ms deadline"


def _why_refused(gate: AdmissionStats) -> str:
    """The gate's reason in numbers: the predicted cycle cost against the deadline."""
    cycle = gate.kinds["cycle"]
    if cycle.predicted_ms is None:
        return f"no cycle cost measured yet against {_deadline(gate)}"
    return (f"predicted cycle {cycle.predicted_ms:.1f} ms (mean {cycle.mean_ms:.1f} + {gate.k:g} x "
            f"{cycle.deviation_ms:.1f}) against {_deadline(gate)}")
