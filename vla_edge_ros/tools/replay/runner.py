"""``vla-edge replay``: every requested policy over the same bag, side by side, into one report."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ...bags.reader import Bag, BagError
from ...config import Settings
from ...runtime.block_costs import CostModel
from .bag_summary import topic_summary
from .commands import RecordedCommands
from .report import write_report
from .session import PolicyRun, RecordedFrame, replay_policy


def recorded_frames(bag: Bag, topic: str) -> Iterator[RecordedFrame]:
    """The camera messages of ``topic`` in arrival order, read lazily (a bag may not fit in memory)."""
    for message in bag.messages([topic]):
        stamp = message.msg.header.stamp
        yield RecordedFrame(message.time_ns, stamp.sec * 1_000_000_000 + stamp.nanosec, message.msg,
                            message.msgtype.endswith("/CompressedImage"))


def replay_bag(path: Path, settings: Settings, policies: Sequence[str], costs: CostModel, out: Path, *,
               image_topic: str | None = None, command_topic: str | None = None, realtime: bool = False,
               log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> dict[str, Any]:
    """Replay one bag under each policy and write the report into ``out``; returns report.json's content.

    BagError when the bag cannot be used, including when not one of its camera frames decodes (the
    report would hold nothing but that)."""
    with Bag(path) as bag:
        image = bag.image_topic(image_topic)
        command = bag.command_topic(command_topic)
        total = bag.topics[image].count
        if total == 0:
            raise BagError(f"{path}: the camera topic {image} holds no messages")
        topics = topic_summary(bag, image, command)
        commands = RecordedCommands.read(bag, command, settings)
        runs: list[PolicyRun] = []
        for policy in policies:
            log(f"{path.name}: replaying {total} frames of {image} under {policy} ({costs.describe()})")
            run = replay_policy(recorded_frames(bag, image), settings, policy, costs, realtime=realtime,
                                progress=_progress(policy, total, log))
            _check_decoded(path, image, run)
            runs.append(run)
            log(f"{policy}: {run.counts['frames']} frames in {run.wall_s:.1f} s = "
                f"{run.counts['frames'] / run.wall_s:.1f} frames/s, {bag.duration_s / run.wall_s:.2f}x the bag's "
                f"real time")
        node = settings["reasoning"]
        bag_info = {"path": str(path), "duration_s": bag.duration_s, "start_ns": bag.start_ns, "image_topic": image,
                    "frames": total, "rate_hz": (total - 1) / bag.duration_s if bag.duration_s else 0.0,
                    "command_topic": command, "command_type": commands.msgtype, "topics": topics}
        config = {"source": settings.source, "model_dir": node["model_dir"], "deadline_ms": node["deadline_ms"],
                  "kv_capacity_tokens": node["kv_capacity_tokens"], "cost_model": costs.describe(),
                  "realtime": realtime}
        return write_report(out, bag_info, config, runs, commands)


def _check_decoded(path: Path, topic: str, run: PolicyRun) -> None:
    """BagError when no frame decoded: decoding does not depend on the policy, so the first run tells."""
    bad = run.decode_errors
    if bad and sum(bad.values()) == run.counts["frames"]:
        reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(bad.items()))
        raise BagError(f"{path}: none of the {run.counts['frames']} frames on {topic} could be decoded ({reasons}); "
                       "nothing was replayed")


def _progress(policy: str, total: int, log: Callable[[str], None]) -> Callable[[int], None]:
    """Log a progress line at most every 2 s of wall time."""
    last = [time.monotonic()]

    def report(done: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 2.0:
            last[0] = now
            log(f"  {policy}: {done}/{total} frames ({100 * done / max(total, 1):.0f}%)")
    return report
