"""The action timeline: from the chunks of actions the model gives, one command at every control tick.

The model answers an observation, received at ``t_obs``, with a chunk of H actions A[0..H-1]; action i is
meant for t_obs + i P, P the control period (1 / ``control_rate_hz``). A real model takes longer than P
to answer, so by the time a chunk is ready (at r) its first actions are already in the past, and the
next chunk is computed while this one executes. The timeline is what the publisher keeps between them:

    reasoning thread: observation at t_obs -> inference -> chunk ready at r -> ActionSlot.put
    each control tick at now: timeline.command(slot.latest(), now, knobs, P)
        1. a chunk not seen before is offered: checked (``chunk_safety.py``) on what of it would be executed,
           then accepted, or rejected with a counted reason, and then nothing of it is ever used;
        2. the tick's action is picked by the execution mode (``action_publisher.execution``);
        3. ``ActionOutput`` clips and maps it to the command type, or gives that type's safe stop.

Indices. At time t a chunk's index is floor((t - t_obs) / P): the action whose period holds t. The tick at
which a chunk is first offered is its take-over tick, k0 its index there: actions [0, k0) are already
in the past.

The execution horizon s (``execution_horizon``; above H: H) is how many of a chunk's actions, counted from its
observation, are executed before the next chunk should take over: the admission gate starts the next inference
so that it is ready by t_obs + s P (``horizon``, ``admission.py``). What the rest of the chunk is for depends on
the mode:

- ``chunk``: nothing: its plan is A[k0:s] and ends at t_obs + s P (a starved tick after it). 0 (the default)
  is s = H, the whole chunk.
- ``rtc`` and ``ensemble``: the actions A[s:H] are held too. They are the overlap the next chunk is blended
  toward (RTC's H - s actions of the previous chunk; ACT's ensemble of every chunk covering a tick), and, when
  the next chunk is late, what the robot goes on executing: these modes starve only past t_obs + H P. 0 (the
  default) is s = ceil(H / 2): the next chunk is asked for half a chunk early, leaving half of the old one
  (8 ticks of 16, 267 ms at 30 Hz) to blend over. With one reasoning thread a chunk can be ready by s only if
  s P holds two cycles (its own, and the one before it, whose chunk must be in before its frame is taken),
  the margin m and the age of the frame when taken: s = 8 of 16 at 30 Hz serves a cycle of up to
  (267 - 10) / 2, about 128 ms. A slower model does not starve for it: its cycles run back to back, each
  next chunk takes over later and the overlap shrinks toward H P - 2 cycles (with H = 16 at 30 Hz, one tick
  or none at 250 ms: two cycles and the wait for a frame put the next chunk 500-517 ms after the held chunk's
  frame, in its last action; no s gives more). A larger s asks less of the model and leaves less overlap; a
  smaller one asks for chunks more often (a cycle every s P - m - cycle, down to a frame: every 133 ms for a
  100 ms model with H = 16 and s = 8, 2.8 times as many cycles as ``chunk``, which waits for the chunk's end).
  H / 2 is what LeRobot's async-inference examples use (``chunk_size_threshold`` 0.5). In the RTC paper s
  counts from the chunk's observation to the *start* of the next inference (so d <= s <= H - d); here the
  next chunk is to be *ready* by s, so that all of A[s:H] is overlap.

The modes, after a chunk is accepted (``auto``: rtc for a chunk of H > 1, sync for H = 1):

- ``sync``: the newest accepted chunk's first action, fresh while it is at most ``action_timeout_ms`` old
  (since r), then STALE: the rule from before chunks, exactly. Only A[0] is checked and executed.
- ``chunk``: the newest chunk at once: the plan becomes A[k0:s], the previous plan is dropped.
- ``ensemble`` (ACT's temporal ensembling): every accepted chunk that holds an action for the tick (its
  index in [0, H): each chunk's whole span, as ACT averages every prediction made for a step; within s
  instead, a chunk ready by the previous one's s would share no tick with it) takes part, oldest first; chunk
  j of them weighs exp(-m j), m = ``ensemble_decay``, and the tick commands the weighted mean. m > 0 favours
  older chunks, as ACT's 0.01 does.
- ``rtc`` (real-time chunking, Black, Galliker and Levine, arXiv 2506.07339): the new chunk is stitched
  onto the plan being executed, on the new chunk's indices i from k0:
    - i < k0: already in the past, dropped (the robot executed the previous plan there);
    - k0 <= i < d, d = ceil((r - t_obs) / P) the inference delay in actions: due while the chunk was being
      computed, so committed to the previous plan: frozen (weight 1 on the previous plan);
    - d <= i < e, e the end of the overlap with the previous plan (where it ends: the previous chunk's H-th
      action, so H - s actions after the switch when the chunk came at s): blended W_i prev + (1 - W_i) A[i],
      with the paper's soft mask W_i = c_i (exp(c_i) - 1) / (exp(1) - 1), c_i = (e - i) / (e - d + 1), which
      decays from nearly 1 to nearly 0 over the overlap;
    - i >= e: A[i] alone (the previous plan holds nothing there).
  The previous plan is sampled at the new chunk's times (the action it would command then). The paper's
  own method guides a flow-matching denoiser toward the frozen prefix at inference time ("training-free
  guidance"); a one-shot head (``mlp``) has no denoising steps to guide, so only this inference-time
  blending of the executed plan is implemented: the chunk itself is not made consistent with the prefix.

What chunk, ensemble and rtc command is computed when a chunk is accepted, as a plan on the new chunk's grid
(ensemble samples every chunk at the new chunk's times, as rtc samples the previous plan), and each tick
commands the plan's action for its time: what is commanded is what was checked. A live change of
``execution`` (between those three), ``execution_horizon`` or ``ensemble_decay`` applies from the next chunk;
to or from sync at once.

The admission gate plans on what the timeline holds (``horizon``: where its commands end, and where the
execution horizon ends, read by the reasoning thread): a chunked model's next cycle starts when the execution
horizon's end comes within the predicted cycle, and must be ready by then (``admission.py``).

Starvation: in ``chunk``, ``ensemble`` and ``rtc``, a tick that no accepted chunk holds an action for
commands the safe stop (outcome STARVED; NONE before the first chunk), counted per tick and per event
(a run of starved ticks). ``action_timeout_ms`` plays no part there: a chunk's horizon is its timeout.

Chunk safety judges what would be commanded from the take-over tick on, if no other chunk came: A[0] (sync),
A[k0:s] (chunk), the ensembled plan (ensemble), the stitched plan (rtc), against the command being executed
(the action the last tick commanded; none after a stop). A blend of two sequences that each pass is not
safe by itself (ensemble's weights change where a chunk starts or ends, and a step of the mean there can
exceed every chunk's own steps), so the blend is what is checked. A chunk that fails is rejected and the
timeline goes on with what it held, down to a stop when that runs out. A chunk offered when all its
executable actions are past is rejected as ``late``.

A cleared slot (``None``: reasoning stopped, or no chunk yet) drops everything held: the next tick is a
stop, never the rest of an old chunk. One thread owns a timeline (the publisher's timer, or the offline
driver); ``figures`` reads plain counters and may be called from another.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from ..config import ConfigError, OutputKnobs
from .action_output import ActionOutput, Command, Outcome, age_outcome
from .action_slot import TimedAction
from .admission import Horizon
from .chunk_safety import REASONS, rejection
from .clock import NS_PER_MS
from .event_window import NS_PER_S, EventWindow

TIMELINE_REASONS = REASONS + ("late", "config_error")  # why a chunk can be rejected
DISTINCT_WINDOW_S = 2.0  # the rate of distinct commands is measured over this window


def distinct_command(values: tuple[float, ...] | None, previous: tuple[float, ...] | None) -> bool:
    """Whether a tick's command (None: nothing sent) is a new one, not the previous tick's again: what the rate of
    distinct commands counts, live (``figures``) and in evaluation alike. A safe stop after motion is one."""
    return values is not None and values != previous


BLENDING = ("ensemble", "rtc")  # the modes that blend a new chunk with what the timeline holds


def resolve_execution(execution: str, chunk_rows: int) -> str:
    """The mode ``execution`` means for chunks of ``chunk_rows`` actions: auto is rtc for H > 1, sync for H = 1."""
    if execution == "auto":
        return "rtc" if chunk_rows > 1 else "sync"
    return execution


def execution_rows(mode: str, chunk_rows: int, horizon: int) -> int:
    """The execution horizon s of chunks of ``chunk_rows`` actions in ``mode`` (resolved) under ``execution_horizon``
    ``horizon``: the actions, from the chunk's observation, executed before the next chunk should take over. 0:
    ceil(H / 2) when the mode blends (the rest is the overlap, module doc), H otherwise."""
    if horizon > 0:
        return min(chunk_rows, horizon)
    return max(1, -(-chunk_rows // 2)) if mode in BLENDING else chunk_rows


def held_rows(mode: str, chunk_rows: int, horizon: int) -> int:
    """How many of a chunk's first actions the timeline may command: all H when the mode blends (those beyond s
    are the overlap, and the reserve when the next chunk is late), s otherwise."""
    return chunk_rows if mode in BLENDING else execution_rows(mode, chunk_rows, horizon)


@dataclass(frozen=True)
class Plan:
    """Actions on a grid: ``values[k]`` [dof] is commanded from ``start_ns + k period_ns`` for one period."""

    values: np.ndarray
    start_ns: int
    period_ns: int

    @property
    def end_ns(self) -> int:
        return self.start_ns + len(self.values) * self.period_ns

    def index(self, t_ns: int) -> int:
        return (t_ns - self.start_ns) // self.period_ns

    def at(self, t_ns: int) -> np.ndarray | None:
        """The action for time ``t_ns``, None outside the plan."""
        k = self.index(t_ns)
        return self.values[k] if 0 <= k < len(self.values) else None


def rtc_weights(first: int, delay: int, end: int, count: int) -> np.ndarray:
    """The weight on the previous plan of new actions ``first .. first + count - 1``: 1 below ``delay``
    (frozen), the RTC soft mask from ``delay`` to ``end`` (the overlap's end), 0 from ``end`` on."""
    i = np.arange(first, first + count, dtype=np.float64)
    c = (end - i) / max(1, end - delay + 1)
    soft = c * np.expm1(c) / math.expm1(1.0)
    return np.where(i < delay, 1.0, np.where(i < end, soft, 0.0))


def rtc_stitch(previous: Plan | None, own: Plan, first: int, delay: int) -> np.ndarray:
    """The plan rtc executes from ``own``'s action ``first`` on (module doc): frozen to ``previous`` below
    ``delay``, blended toward it over the rest of their overlap, ``own`` alone after it."""
    new = own.values[first:].astype(np.float64)
    if previous is None or len(new) == 0:
        return new
    times = own.start_ns + (first + np.arange(len(new))) * own.period_ns
    index = np.maximum(0, (times - previous.start_ns) // previous.period_ns)  # before it: its first action
    inside = index < len(previous.values)
    end = first + int(inside.sum())  # the previous plan covers a prefix of these times
    prev = previous.values[np.minimum(index, len(previous.values) - 1)].astype(np.float64)
    weight = rtc_weights(first, delay, end, len(new))[:, None]
    return np.where(inside[:, None], weight * prev + (1.0 - weight) * new, new)


def ensemble_mean(actions: list[np.ndarray], decay: float) -> np.ndarray:
    """ACT's temporal ensemble of the actions several chunks hold for one tick, oldest first: weights exp(-m j)."""
    weights = np.exp(-decay * np.arange(len(actions), dtype=np.float64))
    return (weights[:, None] * np.asarray(actions, dtype=np.float64)).sum(axis=0) / weights.sum()


def ensemble_plan(held: list[Plan], own: Plan, first: int, decay: float) -> np.ndarray:
    """What ensemble commands from ``own``'s action ``first`` on, at ``own``'s times, until it ends: the mean
    (``ensemble_mean``) of every plan in ``held`` (older chunks, oldest first) holding an action then, and
    ``own``'s action, newest. ``own`` ends last, so it holds an action for each of those times."""
    times = own.start_ns + np.arange(first, len(own.values)) * own.period_ns
    rows = []
    for t, action in zip(times.tolist(), own.values[first:]):
        covering = [a for a in (plan.at(t) for plan in held) if a is not None]
        rows.append(ensemble_mean([*covering, action], decay))
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), own.values.shape[1])


@dataclass(frozen=True)
class Pick:
    """What the timeline holds for one tick: the action (FRESH) or why there is none."""

    outcome: Outcome
    values: np.ndarray | None
    age_ms: float | None  # age of the newest accepted chunk, None before one


class ActionTimeline:
    """Chunks in, one command a tick out, under the live ``OutputKnobs`` (see the module doc)."""

    def __init__(self, output: ActionOutput) -> None:
        self.output = output
        self.accepted = 0
        self.rejected: Counter = Counter()  # reason -> chunks
        self.last_rejection = ""  # words of the latest rejection
        self.starvation_events = 0
        self.starved_ticks = 0
        self._distinct = EventWindow(DISTINCT_WINDOW_S)
        self._clear()

    def _clear(self) -> None:
        self._seen: TimedAction | None = None  # the latest chunk offered, accepted or not
        self._newest: TimedAction | None = None  # the newest accepted chunk
        self._held: list[Plan] = []  # each accepted chunk, all H actions on its own grid, oldest first (ensemble)
        self._plan: Plan | None = None  # what chunk, ensemble and rtc command, from the newest chunk's take-over
        self._executing: np.ndarray | None = None  # the action the last tick commanded; None after a stop
        self._last_values: tuple[float, ...] | None = None
        self._starved = False
        self.mode = "sync"  # the mode in effect (``execution`` resolved for the newest chunk)

    def reset(self) -> None:
        """A new episode, or the node (re)activated: nothing held; the counters go on."""
        self._clear()

    def command(self, newest: TimedAction | None, now_ns: int, knobs: OutputKnobs, period_ns: int) -> Command:
        """The command for the tick at ``now_ns``, ``newest`` the newest chunk reasoning has handed over (None:
        none, or withdrawn), ``period_ns`` the control period."""
        if newest is None:
            if self._seen is not None:
                self._clear()
        elif newest is not self._seen:
            self._seen = newest
            self._offer(newest, now_ns, knobs, period_ns)
        pick = self._pick(now_ns, knobs)
        dof = None if self._newest is None else self._newest.chunk.shape[1]
        command = self.output.command(pick.outcome, pick.values, pick.age_ms, knobs, dof)
        self._executing = None if command.safe_stop else pick.values
        self._count(command, now_ns)
        return command

    def stop(self) -> Command:
        """The explicit stop a node sends as it goes down (sized by the newest chunk)."""
        return self.output.stop(None if self._newest is None else self._newest.chunk.shape[1])

    def _offer(self, chunk: TimedAction, now_ns: int, knobs: OutputKnobs, period_ns: int) -> None:
        values = chunk.chunk
        rows = values.shape[0]
        mode = resolve_execution(knobs.execution, rows)
        whole = Plan(values, chunk.obs_ns, period_ns)
        own = Plan(values[:held_rows(mode, rows, knobs.execution_horizon)], chunk.obs_ns, period_ns)
        first = max(0, own.index(now_ns))
        held = [plan for plan in self._held if plan.end_ns > now_ns]
        if mode == "sync":
            executed = values[:1]
        elif mode == "rtc":
            delay = max(0, -(-(chunk.ready_ns - chunk.obs_ns) // period_ns))
            executed = rtc_stitch(self._plan, own, first, delay)
        elif mode == "ensemble":
            executed = ensemble_plan(held, own, first, knobs.ensemble_decay)
        else:
            executed = own.values[first:]
        try:
            refused = rejection(values, executed, self._executing, knobs.chunk_safety, knobs.command_type,
                                period_ns / NS_PER_S)
        except ConfigError as exc:
            refused = "config_error", str(exc)
        if refused is None and mode != "sync" and len(executed) == 0:
            refused = "late", f"all {len(own.values)} executable actions were past when it was ready"
        if refused is not None:
            reason, words = refused
            self.rejected[reason] += 1
            self.last_rejection = f"{reason}: {words}"
            return
        self.accepted += 1
        self.mode = mode
        self._newest = chunk
        self._held = held + [whole]
        plan_values = own.values[first:] if mode == "sync" else executed
        self._plan = Plan(np.asarray(plan_values, dtype=np.float64), own.start_ns + first * period_ns, period_ns) \
            if len(plan_values) else None

    def _pick(self, now_ns: int, knobs: OutputKnobs) -> Pick:
        newest = self._newest
        if newest is None:
            return Pick(Outcome.NONE, None, None)
        age_ms = (now_ns - newest.ready_ns) / NS_PER_MS
        mode = resolve_execution(knobs.execution, newest.chunk.shape[0])
        self.mode = mode
        if mode == "sync":
            outcome, age_ms = age_outcome(newest, now_ns, knobs.action_timeout_ms)
            return Pick(outcome, newest.values if outcome is Outcome.FRESH else None, age_ms)
        values = None if self._plan is None else self._plan.at(now_ns)
        if values is None:
            return Pick(Outcome.STARVED, None, age_ms)
        return Pick(Outcome.FRESH, np.asarray(values, dtype=np.float64), age_ms)

    def _count(self, command: Command, now_ns: int) -> None:
        starved = command.outcome is Outcome.STARVED
        self.starved_ticks += starved
        self.starvation_events += starved and not self._starved
        self._starved = starved
        if distinct_command(command.values, self._last_values):
            self._distinct.add("distinct", now_ns)
        self._last_values = command.values

    def _end_ns(self, knobs: OutputKnobs) -> int | None:
        """When the actions held run out with no new chunk (sync: when the newest action goes stale); None when
        nothing is held. Reads each reference once: the reasoning thread calls it (``horizon``) while the
        publisher's thread replaces them."""
        newest, mode, plan = self._newest, self.mode, self._plan
        if newest is None:
            return None
        if mode == "sync":
            return newest.ready_ns + round(knobs.action_timeout_ms * NS_PER_MS)
        return None if plan is None else plan.end_ns

    def horizon_left_ms(self, now_ns: int, knobs: OutputKnobs) -> float:
        """How long the timeline can still command actions without a new chunk (sync: until the newest action
        goes stale), 0 when it cannot."""
        end = self._end_ns(knobs)
        return 0.0 if end is None else max(0, end - now_ns) / NS_PER_MS

    def horizon(self, newest: TimedAction | None, chunk_rows: int, knobs: OutputKnobs,
                period_ns: int) -> Horizon | None:
        """What the admission gate plans a model of ``chunk_rows`` actions a chunk on (``admission.py``), with
        ``newest`` the chunk reasoning handed over last; None when ``execution`` is sync for such chunks (the gate
        keeps its fixed deadline). A chunk handed over but not yet offered to a tick counts as accepted: what the
        timeline holds ends s periods (H when the mode blends) after its observation, and it is the newest, so
        nothing held ends later. The switch, where the next chunk should take over, is the newest chunk's
        execution horizon (s periods after its observation) when the mode blends; in chunk it is the end."""
        mode = resolve_execution(knobs.execution, chunk_rows)
        if mode == "sync":
            return None
        last = (held_rows(mode, chunk_rows, knobs.execution_horizon) - 1) * period_ns
        if newest is None:  # none handed over yet, or withdrawn: the timeline stops at its next tick
            return Horizon(None, last)
        if newest is not self._seen:
            end = newest.obs_ns + held_rows(mode, newest.chunk.shape[0], knobs.execution_horizon) * period_ns
        else:
            end, newest = self._end_ns(knobs), self._newest
        if newest is None or mode not in BLENDING:
            return Horizon(end, last)
        return Horizon(end, last, newest.obs_ns + execution_rows(mode, newest.chunk.shape[0],
                                                                  knobs.execution_horizon) * period_ns)

    def figures(self, now_ns: int, knobs: OutputKnobs) -> dict[str, object]:
        """The timeline's state and counters as plain values (diagnostics, the status line, summaries)."""
        return {"execution": self.mode, "horizon_left_ms": self.horizon_left_ms(now_ns, knobs),
                "chunks_accepted": self.accepted, "chunks_rejected": sum(self.rejected.values()),
                **{f"rejected_{reason}": self.rejected[reason] for reason in TIMELINE_REASONS},
                "starvation_events": self.starvation_events, "starved_ticks": self.starved_ticks,
                "distinct_commands_hz": self._distinct.rate_hz("distinct", now_ns)}
