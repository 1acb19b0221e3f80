"""Replay one bag through one memory policy, exactly as the live pipeline would have run it.

The same objects as live, through the runtime's ``Driver``: the robot's state read and paired with each
frame (``observation.py``: the newest good state within ``state_max_age_ms`` of the frame's stamp, or no
observation, counted as ``no_state``), the frame buffer (so frames that arrive while the reasoner is busy
overwrite each other and count as dropped), the admission gate, the engine and the reasoning cycle. Only
the clock differs (``runtime/clock.py``). Every frame's fate
is one ``FrameRecord``: a line of the decisions file (which a deterministic replay reproduces byte for
byte: the gate's verdicts, the actions and what the memory kept) and a row of the predictions CSV; a
chunked model's (H > 1) whole chunk goes to the chunks CSV.
With a ``DebugTarget``, each cycle's debug image is written too (``debug_frames.py``).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from ...config import Settings
from ...model.checkpoint import Checkpoint
from ...runtime.action_output import clip
from ...runtime.admission import Verdict
from ...runtime.block_costs import CostModel
from ...runtime.clock import NS_PER_MS, VirtualClock, WallClock
from ...runtime.debug_image import FrameCopies, Layout, draw_debug_image, layout_for
from ...runtime.driver import Cycle, Driver
from ...runtime.image_codec import ImageDecodeError, frame_from_message
from ...runtime.loader import load_engine
from ...runtime.observation import Settled
from .debug_frames import DebugFrames, DebugTarget
from .memory_view import MemoryRecord, MemoryView

CYCLE_OUTCOMES = ("admitted", "refused", "missed", "stale", "invalid")  # a cycle ran on the frame
# invalid: the model's output held NaN or Inf; no action came of it (the live publisher would send none)
OUTCOMES = (*CYCLE_OUTCOMES, "dropped", "no_state", "bad_frame")
# dropped: overwritten unread; no_state: no observation, for want of a state within state_max_age_ms;
# bad_frame: undecodable


@dataclass(frozen=True)
class RecordedFrame:
    """A camera message as recorded: when it arrived (bag time), its header stamp, the message itself."""

    arrival_ns: int
    stamp_ns: int
    msg: object
    compressed: bool


@dataclass(frozen=True)
class RecordedState:
    """A robot state message as recorded (JointState or Odometry, as ``camera_subscriber.state_type`` says)."""

    arrival_ns: int
    stamp_ns: int
    msg: object


@dataclass(frozen=True)
class FrameRecord:
    """What became of one camera message under one policy."""

    index: int  # in the camera topic, from 0
    arrival_ns: int  # bag receive time
    outcome: str  # one of OUTCOMES
    detail: str = ""  # the gate's verdict and any refused block; why a frame was bad, had no state or no valid output
    done_ns: int | None = None  # clock when its cycle ended
    ready_ns: int | None = None  # when its action was ready (a missed cycle may have one, late)
    action: np.ndarray | None = None  # clipped as the action publisher would
    memory: MemoryRecord | None = None  # the policy's memory after its cycle (None: no cycle ran)
    chunk: np.ndarray | None = None  # a chunked model's actions [H, dof], clipped; row 0 is ``action`` (H = 1: None)

    @property
    def latency_ms(self) -> float | None:
        """Camera arrival to action ready."""
        return None if self.action is None else (self.ready_ns - self.arrival_ns) / NS_PER_MS


@dataclass
class PolicyRun:
    """Everything one policy did over the bag; report.py, predictions.py and plots.py turn it into files."""

    policy: str
    frames: list[FrameRecord] = field(default_factory=list)  # in arrival order
    action_dims: int = 0
    chunk: int = 1  # H, the actions a cycle gives (``vla.action.chunk``)
    control_period_ns: int = 0  # action i of a chunk is meant for the frame's arrival + i periods
    write_unit: str = "frames"  # what ``MemoryRecord.writes`` and ``evictions`` count
    figure_names: tuple[str, ...] = ()  # the policy's own figures in ``MemoryRecord.figures``
    buffer_dropped: int = 0  # the frame buffer's own count of frames overwritten unread
    state_messages: int = 0  # state messages read (none when the model reads no state)
    state_dropped: dict[str, int] = field(default_factory=dict)  # those refused, per reason (robot_state.REASONS)
    tokens_seen: int = 0
    kv_tokens: int = 0
    wall_s: float = 0.0

    @property
    def counts(self) -> Counter:
        """Frames by outcome, and ``frames`` in all."""
        counts = Counter(record.outcome for record in self.frames)
        counts["frames"] = len(self.frames)
        return counts

    @property
    def decode_errors(self) -> Counter:
        return Counter(record.detail for record in self.frames if record.outcome == "bad_frame")

    @property
    def actions(self) -> list[FrameRecord]:
        return [record for record in self.frames if record.action is not None]

    @property
    def cycles(self) -> list[FrameRecord]:
        return [record for record in self.frames if record.memory is not None]

    def to_json(self) -> dict:
        """Plain JSON values (a unit's result file), from which ``from_json`` rebuilds this run exactly."""
        frames = [{**record.__dict__, "action": None if record.action is None else record.action.tolist(),
                   "chunk": None if record.chunk is None else record.chunk.tolist(),
                   "memory": None if record.memory is None else record.memory.__dict__} for record in self.frames]
        return {**self.__dict__, "frames": frames}

    @classmethod
    def from_json(cls, data: dict) -> PolicyRun:
        frames = [FrameRecord(**{**f, "action": None if f["action"] is None else np.asarray(f["action"]),
                                 "chunk": None if f.get("chunk") is None else np.asarray(f["chunk"]),
                                 "memory": None if f["memory"] is None else MemoryRecord(**{
                                     k: tuple(v) if isinstance(v, list) else v for k, v in f["memory"].items()})})
                  for f in data["frames"]]
        return cls(**{**data, "frames": frames, "figure_names": tuple(data["figure_names"])})


def replay_policy(messages: Iterable[RecordedFrame | RecordedState], settings: Settings, policy: str,
                  costs: CostModel, *, realtime: bool = False, checkpoint: Checkpoint | None = None,
                  debug: DebugTarget | None = None, progress: Callable[[int], None] = lambda frames_done: None
                  ) -> PolicyRun:
    """Run ``messages`` (camera frames, and the robot's states when the model reads one from
    ``camera_subscriber.state_topic``; in arrival order, read once, lazily) through a fresh engine with
    ``policy`` (``checkpoint``: the model's weights, when a worker has them loaded already; ``debug``: where
    each cycle's debug image goes)."""
    settings = settings.replace("reasoning", {"kv.policy": policy, "kv_store.dir": ""})
    engine = load_engine(settings, checkpoint=checkpoint).engine
    camera, publisher, node = settings["camera_subscriber"], settings["action_publisher"], settings["reasoning"]
    size = (camera["frame_height"], camera["frame_width"])
    upcoming = iter(messages)
    following = next(upcoming, None)
    if following is None:
        raise ValueError("no camera frames to replay")
    clock = WallClock(following.arrival_ns) if realtime else VirtualClock(following.arrival_ns)
    driver = Driver(engine, settings, clock, None if realtime else costs, size)
    pictures = None if debug is None else DebugFrames(debug, policy)
    driver.feed.enabled = pictures is not None
    layout = layout_for(size, node["debug_image.width"], publisher["command_type"])
    copies = FrameCopies()
    view = MemoryView(engine.policy)
    horizon = engine.config.action.chunk
    run = PolicyRun(policy, action_dims=engine.config.action.dof, chunk=horizon, control_period_ns=driver.period_ns,
                    write_unit=view.write_unit, figure_names=view.figure_names)
    arrivals: list[int] = []
    records: dict[int, FrameRecord] = {}  # frame index -> what became of it; absent: overwritten unread
    pending: dict[int, int] = {}  # the buffer's unread frame: its sequence number -> frame index
    wall_start = time.perf_counter()

    indices: dict[int, int] = {}  # debug image: the buffer's sequence number -> frame index, oldest first

    unsettled: deque[int] = deque()  # frames handed to the assembler, neither written nor refused yet (oldest first)

    def settle(settled: list[Settled]) -> None:
        """The camera node's part: each set of frames the assembler settled (replay feeds one camera, so the oldest
        unsettled frame) is written, the newest unread observation (the buffer counts the one it overwrites as
        dropped) and kept for the debug image, or refused for want of its state, as live."""
        for outcome in settled:
            index = unsettled.popleft()
            if outcome.written is None:
                records[index] = FrameRecord(index, arrivals[index], "no_state", outcome.reason)
                continue
            pending.clear()
            pending[outcome.written.seq] = index
            if pictures is not None:
                copies.add(outcome.written.seq, outcome.written.image, layout, driver.feed.latest())
                indices[outcome.written.seq] = index

    while True:
        while following is not None and following.arrival_ns <= clock():
            if isinstance(following, RecordedState):  # the camera node's state callback: read, counted if refused
                settle(driver.state(following.msg, following.stamp_ns, following.arrival_ns))
            else:
                arrivals.append(following.arrival_ns)
                try:
                    image = frame_from_message(following.msg, following.compressed, size)
                except ImageDecodeError as exc:  # it never reaches the assembler
                    records[len(arrivals) - 1] = FrameRecord(len(arrivals) - 1, following.arrival_ns, "bad_frame",
                                                             exc.reason)
                else:
                    unsettled.append(len(arrivals) - 1)
                    settle(driver.camera(image, following.stamp_ns, following.arrival_ns))
            following = next(upcoming, None)
        cycle = driver.reason()
        if cycle is None:
            if following is None:
                break
            clock.wait_until(following.arrival_ns)
            continue
        index = pending.pop(cycle.frame.seq)
        chunk = None if cycle.result.chunk is None else np.stack(
            [clip(row, publisher["action_min"], publisher["action_max"]) for row in cycle.result.chunk])
        records[index] = FrameRecord(
            index, arrivals[index], _outcome(cycle), _detail(cycle), clock(), cycle.result.ready_ns,
            None if chunk is None else chunk[0], view.after_cycle(index), chunk if horizon > 1 else None)
        if pictures is not None:
            pictures.add(index, _picture(driver, cycle, copies, indices, layout, node["deadline_ms"]))
        progress(len(arrivals))
    if pictures is not None:
        pictures.close()
    for index in unsettled:  # held for a state that never came
        records[index] = FrameRecord(index, arrivals[index], "no_state", "the bag ended before the robot state "
                                     "stamped with the frame")
    run.frames = [records.get(i, FrameRecord(i, t, "dropped")) for i, t in enumerate(arrivals)]
    run.buffer_dropped = driver.buffer.stats().dropped
    if driver.buffer.state_dim:
        run.state_messages, run.state_dropped = driver.states.received, dict(driver.states.dropped)
    stats = engine.memory_stats()
    run.tokens_seen = engine.prompt_ids.size + stats.frames_seen * engine.observation_tokens
    run.kv_tokens = stats.kv_tokens
    run.wall_s = time.perf_counter() - wall_start
    return run


def _picture(driver: Driver, cycle: Cycle, copies: FrameCopies, indices: dict[int, int], layout: Layout,
             deadline_ms: float) -> np.ndarray:
    """The debug image of the cycle just run, its frames named by their index in the bag as the report names
    them; ``indices`` forgets the frames no later picture can show (older than any the memory still holds)."""
    view = driver.feed.latest()
    named = replace(view, frame_id=indices[view.frame_id], strip=tuple(indices[seq] for seq in view.strip))
    image = draw_debug_image(cycle.frame.image, named, copies.thumbnails(view.strip), layout, driver.knobs, deadline_ms)
    oldest = min(view.strip, default=view.frame_id)
    while indices and next(iter(indices)) < min(oldest, view.frame_id):
        del indices[next(iter(indices))]
    return image


def _outcome(cycle: Cycle) -> str:
    result = cycle.result
    if result.invalid:
        return "invalid"
    if result.missed:
        return "missed"
    if result.action is not None:
        return "admitted"
    return "stale" if result.verdict is Verdict.STALE else "refused"


def _detail(cycle: Cycle) -> str:
    result = cycle.result
    return (result.verdict.value + (f" {result.refused_block.value}" if result.refused_block else "")
            + (f": {result.invalid}" if result.invalid else ""))
