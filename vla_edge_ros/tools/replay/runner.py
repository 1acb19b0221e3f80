"""``vla-edge replay``: every requested policy over the same bag, side by side, into one report."""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...bags.reader import Bag, BagError
from ...config import Settings
from ...runtime.block_costs import CostModel
from ...runtime.loader import load_model
from ...runtime.observation import require_one_camera
from ...runtime.reasoner import block_kinds
from ..parallel import Job, RunSummary, Unit, run_units
from .bag_summary import topic_summary
from .commands import RecordedCommands
from .debug_frames import DebugTarget
from .report import SCHEMA, write_report
from .session import PolicyRun, RecordedFrame, replay_policy


def recorded_frames(bag: Bag, topic: str) -> Iterator[RecordedFrame]:
    """The camera messages of ``topic`` in arrival order, read lazily (a bag may not fit in memory)."""
    for message in bag.messages([topic]):
        stamp = message.msg.header.stamp
        yield RecordedFrame(message.time_ns, stamp.sec * 1_000_000_000 + stamp.nanosec, message.msg,
                            message.msgtype.endswith("/CompressedImage"))


@dataclass(frozen=True)
class BagInput:
    """What the report of one bag needs besides its runs, read once here (the units read the frames)."""

    path: Path
    image_topic: str
    bag_info: dict[str, Any]
    commands: RecordedCommands


def read_bag(path: Path, settings: Settings, image_topic: str | None = None,
             command_topic: str | None = None) -> BagInput:
    """The bag's matched topics, its summary and recorded commands; BagError when it cannot be used."""
    with Bag(path) as bag:
        image = bag.image_topic(image_topic)
        command = bag.command_topic(command_topic)
        total = bag.topics[image].count
        if total == 0:
            raise BagError(f"{path}: the camera topic {image} holds no messages")
        commands = RecordedCommands.read(bag, command, settings)
        info = {"path": str(path), "duration_s": bag.duration_s, "start_ns": bag.start_ns, "image_topic": image,
                "frames": total, "rate_hz": (total - 1) / bag.duration_s if bag.duration_s else 0.0,
                "command_topic": command, "command_type": commands.msgtype, "topics": topic_summary(bag, image, command)}
    return BagInput(path, image, info, commands)


@dataclass(frozen=True)
class ReplayContext:
    settings: Settings
    costs: CostModel
    realtime: bool


@dataclass(frozen=True)
class ReplayUnit:
    """One unit: one bag under one policy (``bag``: its place in the batch, for the key)."""

    bag: int
    path: Path
    image_topic: str
    policy: str
    debug: DebugTarget | None = None  # where its debug images go, if anywhere

    @property
    def key(self) -> str:
        return f"bag{self.bag:03d}_{self.policy}"


def prepare(context: ReplayContext) -> dict[str, Any]:
    """A worker's state: the checkpoint, read once for every bag and policy it replays."""
    return {"context": context, "checkpoint": load_model(context.settings)}


def run_unit(state: dict[str, Any], unit: ReplayUnit) -> dict[str, Any]:
    """One bag under one policy, from its frames alone (a fresh engine, buffer, gate and clock)."""
    context = state["context"]
    with Bag(unit.path) as bag:
        run = replay_policy(recorded_frames(bag, unit.image_topic), context.settings, unit.policy, context.costs,
                            realtime=context.realtime, checkpoint=state["checkpoint"], debug=unit.debug)
    return run.to_json()


def replay_bags(bags: Sequence[BagInput], outs: Sequence[Path], settings: Settings, policies: Sequence[str],
                costs: CostModel, units_dir: Path, *, realtime: bool = False, workers: int | None = None,
                ray_address: str | None = None, resume: bool = False, debug_dirs: Sequence[Path] | None = None,
                debug_video: bool = False, bar: Callable[[int, int], None] = lambda done, total: None,
                log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
                ) -> tuple[dict[Path, dict[str, Any]], dict[Path, str], RunSummary]:
    """Replay every bag under every policy (one unit each: tools/parallel.py) and write each bag's report into
    its ``out`` as soon as its units are in (here, while the workers replay the other bags); returns (reports
    by bag, failures by bag, how the run went), in the order of ``bags``. A bag whose runs failed, or none of
    whose frames decoded, is a failure; the others are reported. ``debug_dirs``: each bag's directory for the
    debug images of its cycles (``debug_frames.py``; one MP4 per policy with ``debug_video``)."""
    require_one_camera(settings, "replay")  # before any unit: every one would make no observation
    costs.require(block_kinds(load_model(settings).config))  # before any unit: a missing cost fails them all
    context = ReplayContext(settings, costs, realtime)
    targets = [None if debug_dirs is None else DebugTarget(debug_dirs[i], debug_video, bag.bag_info["rate_hz"])
               for i, bag in enumerate(bags)]
    identity = hashlib.sha256(json.dumps([SCHEMA, settings.values, costs.describe(), realtime,
                                          [str(b.path) for b in bags], targets],  # a resumed unit drew its images
                                         sort_keys=True, default=str).encode()).hexdigest()
    units = [ReplayUnit(i, bag.path, bag.image_topic, policy, targets[i]) for i, bag in enumerate(bags)
             for policy in policies]
    keys = [[ReplayUnit(i, bag.path, bag.image_topic, policy).key for policy in policies] for i, bag in enumerate(bags)]
    for bag in bags:
        log(f"{bag.path.name}: replaying {bag.bag_info['frames']} frames of {bag.image_topic} under "
            f"{', '.join(policies)} ({costs.describe()})")
    node = settings["reasoning"]
    config = {"source": settings.source, "model_dir": node["model_dir"], "deadline_ms": node["deadline_ms"],
              "kv_capacity_tokens": node["kv_capacity_tokens"], "cost_model": costs.describe(), "realtime": realtime}
    results: dict[str, dict[str, Any]] = {}
    reports, failed = {}, {}

    def report_when_complete(key: str, result: dict[str, Any]) -> None:
        results[key] = result
        i = next(i for i, bag_keys in enumerate(keys) if key in bag_keys)
        if all(k in results for k in keys[i]):
            bag, runs = bags[i], [PolicyRun.from_json(results[k]) for k in keys[i]]
            try:
                _check_decoded(bag.path, bag.image_topic, runs[0])
            except BagError as exc:
                failed[bag.path] = str(exc)
                return
            for run in runs:
                log(f"{bag.path.name} {run.policy}: {run.counts['frames']} frames in {run.wall_s:.1f} s = "
                    f"{run.counts['frames'] / run.wall_s:.1f} frames/s, {bag.bag_info['duration_s'] / run.wall_s:.2f}x "
                    "the bag's real time")
            reports[bag.path] = write_report(outs[i], bag.bag_info, config, runs, bag.commands)

    summary = run_units(Job(prepare, run_unit, context, identity), [Unit(u.key, u) for u in units], units_dir,
                        workers=workers, ray_address=ray_address, resume=resume, progress=bar,
                        on_result=report_when_complete)
    for bag, bag_keys in zip(bags, keys):
        errors = [summary.failed[key] for key in bag_keys if key in summary.failed]
        if errors:  # a BagError names its bag already
            failed[bag.path] = errors[0] if errors[0].startswith(f"{bag.path}: ") else f"{bag.path}: {errors[0]}"
    return ({bag.path: reports[bag.path] for bag in bags if bag.path in reports},
            {bag.path: failed[bag.path] for bag in bags if bag.path in failed}, summary)


def replay_bag(path: Path, settings: Settings, policies: Sequence[str], costs: CostModel, out: Path, *,
               image_topic: str | None = None, command_topic: str | None = None, realtime: bool = False,
               log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> dict[str, Any]:
    """Replay one bag under each policy, here, and write the report into ``out``; returns report.json's
    content. BagError when the bag cannot be used, including when not one of its camera frames decodes."""
    bag = read_bag(path, settings, image_topic, command_topic)
    with tempfile.TemporaryDirectory(prefix="vla-replay-units-") as units:  # no resume here: nothing left behind
        reports, failed, _ = replay_bags([bag], [out], settings, policies, costs, Path(units), realtime=realtime,
                                         log=log)
    if failed:
        raise BagError(failed[path])
    return reports[path]


def _check_decoded(path: Path, topic: str, run: PolicyRun) -> None:
    """BagError when no frame decoded: decoding does not depend on the policy, so the first run tells."""
    bad = run.decode_errors
    if bad and sum(bad.values()) == run.counts["frames"]:
        reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(bad.items()))
        raise BagError(f"{path}: none of the {run.counts['frames']} frames on {topic} could be decoded ({reasons}); "
                       "nothing was replayed")
