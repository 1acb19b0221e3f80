"""Replay one bag through one memory policy, exactly as the live pipeline would have run it.

The same objects as live, through the runtime's ``Driver``: the frame buffer (so frames that
arrive while the reasoner is busy overwrite each other and count as dropped), the admission gate,
the engine and the reasoning cycle. Only the clock differs (``runtime/clock.py``). Every frame's fate is logged as one
decision line, which is what a deterministic replay reproduces byte for byte.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from ...config import Settings
from ...runtime.action_output import clip
from ...runtime.admission import Verdict
from ...runtime.block_costs import CostModel
from ...runtime.clock import NS_PER_MS, VirtualClock, WallClock
from ...runtime.driver import Driver
from ...runtime.image_codec import ImageDecodeError, frame_from_message
from ...runtime.loader import load_engine


@dataclass(frozen=True)
class RecordedFrame:
    """A camera message as recorded: when it arrived (bag time), its header stamp, the message itself."""

    arrival_ns: int
    stamp_ns: int
    msg: object
    compressed: bool


@dataclass
class PolicyRun:
    """Everything one policy did over the bag; report.py turns it into numbers and plots."""

    policy: str
    decisions: list[str] = field(default_factory=list)  # one line per frame, in arrival order
    latencies_ms: list[float] = field(default_factory=list)
    actions: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (ready ns, clipped action)
    events: list[tuple[int, str]] = field(default_factory=list)  # (bag ns, admitted|refused|missed|stale)
    memory: list[tuple[int, int, int, int]] = field(default_factory=list)  # (bag ns, bytes, writes, evictions)
    counts: Counter = field(default_factory=Counter)
    decode_errors: Counter = field(default_factory=Counter)
    tokens_seen: int = 0
    kv_tokens: int = 0
    wall_s: float = 0.0


def replay_policy(frames: Iterable[RecordedFrame], settings: Settings, policy: str, costs: CostModel, *,
                  realtime: bool = False, progress: Callable[[int], None] = lambda frames_done: None) -> PolicyRun:
    """Run ``frames`` (in arrival order; read once, lazily) through a fresh engine with ``policy``."""
    settings = settings.replace("reasoning", {"kv.policy": policy, "kv_store.dir": ""})
    engine = load_engine(settings).engine
    camera, publisher = settings["camera_subscriber"], settings["action_publisher"]
    size = (camera["frame_height"], camera["frame_width"])
    upcoming = iter(frames)
    following = next(upcoming, None)
    if following is None:
        raise ValueError("no camera frames to replay")
    start = following.arrival_ns
    clock = WallClock(start) if realtime else VirtualClock(start)
    driver = Driver(engine, settings, clock, None if realtime else costs, size)
    run = PolicyRun(policy)
    arrivals: list[int] = []
    fate: dict[int, str] = {}  # frame index -> what became of it; absent: overwritten unread (dropped)
    pending: dict[int, int] = {}  # the buffer's unread frame: its sequence number -> frame index
    wall_start = time.perf_counter()
    while True:
        while following is not None and following.arrival_ns <= clock():
            _deliver(following, len(arrivals), driver, size, run, fate, pending)
            arrivals.append(following.arrival_ns)
            following = next(upcoming, None)
        cycle = driver.reason()
        if cycle is None:
            if following is None:
                break
            clock.wait_until(following.arrival_ns)
            continue
        index = pending.pop(cycle.frame.seq)
        result = cycle.result
        now = clock()
        if result.action is not None:
            run.latencies_ms.append((result.ready_ns - cycle.frame.receive_ns) / NS_PER_MS)
            run.actions.append((result.ready_ns, clip(result.action, publisher["action_min"], publisher["action_max"])))
        outcome = ("missed" if result.missed else "admitted" if result.action is not None
                   else "stale" if result.verdict is Verdict.STALE else "refused")
        detail = f" {result.refused_block.value}" if result.refused_block else ""
        if result.ready_ns is not None:
            detail += f" ready_ms={(result.ready_ns - start) / NS_PER_MS:.3f}"
        fate[index] = f"{outcome} {result.verdict.value}{detail}"
        run.counts[outcome] += 1
        run.events.append((now, outcome))
        stats = engine.memory_stats()
        run.memory.append((now, stats.memory_bytes, stats.writes, stats.evictions))
        progress(len(arrivals))
    run.counts["frames"] = len(arrivals)
    run.counts["dropped"] = driver.buffer.stats().dropped
    run.decisions = [f"{i} t_ms={(t - start) / NS_PER_MS:.3f} {fate.get(i, 'dropped')}" for i, t in enumerate(arrivals)]
    stats = engine.memory_stats()
    run.tokens_seen = engine.prompt_ids.size + stats.frames_seen * engine.tokens_per_frame
    run.kv_tokens = stats.kv_tokens
    run.wall_s = time.perf_counter() - wall_start
    return run


def _deliver(recorded: RecordedFrame, index: int, driver: Driver, size: tuple[int, int], run: PolicyRun,
             fate: dict[int, str], pending: dict[int, int]) -> None:
    """The camera node's part: decode (bad frames are counted and never reach the buffer), then write."""
    try:
        image = frame_from_message(recorded.msg, recorded.compressed, size)
    except ImageDecodeError as exc:
        run.decode_errors[exc.reason] += 1
        fate[index] = f"bad_frame {exc.reason}"
        return
    pending.clear()  # an unread frame is overwritten by this one (the buffer counts it as dropped)
    pending[driver.camera(image, recorded.stamp_ns, recorded.arrival_ns)] = index
