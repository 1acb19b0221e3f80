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
from ...config import ObservationKnobs, Settings
from ...runtime.block_costs import CostModel
from ...model.checkpoint import Checkpoint
from ...model.config import load_model_config
from ...runtime.loader import check_observation, load_model
from ...runtime.reasoner import block_kinds
from ..parallel import Job, RunSummary, Unit, run_units
from .bag_state import StateSource, state_source, with_state
from .bag_summary import topic_summary
from .commands import RecordedCommands
from .debug_frames import DebugTarget
from .report import SCHEMA, write_report
from .session import PolicyRun, RecordedFrame, RecordedState, replay_policy


def recorded_messages(bag: Bag, image_topic: str, state_topic: str | None = None
                      ) -> Iterator[RecordedFrame | RecordedState]:
    """The camera messages of ``image_topic`` and the state messages of ``state_topic`` in arrival order, read
    lazily (a bag may not fit in memory). Of a state and a frame received at the same instant the state comes
    first, whatever the storage's order (ROS 1 orders them by connection): the order the simulated robot
    publishes them in, which pairs each frame with the state it was seen in."""
    held: list[RecordedFrame] = []  # the frames of the latest instant, until its states are through
    for message in bag.messages([image_topic, *([state_topic] if state_topic else [])]):
        if held and message.time_ns > held[0].arrival_ns:
            yield from held
            held.clear()
        stamp = message.msg.header.stamp
        stamp_ns = stamp.sec * 1_000_000_000 + stamp.nanosec
        if message.topic == image_topic:
            held.append(RecordedFrame(message.time_ns, stamp_ns, message.msg,
                                      message.msgtype.endswith("/CompressedImage")))
        else:
            yield RecordedState(message.time_ns, stamp_ns, message.msg)
    yield from held


@dataclass(frozen=True)
class BagInput:
    """What the report of one bag needs besides its runs, read once here (the units read the frames)."""

    path: Path
    image_topic: str
    bag_info: dict[str, Any]
    commands: RecordedCommands
    state: StateSource | None = None  # where the robot's state is, for a model that reads one


def read_bag(path: Path, settings: Settings, image_topic: str | None = None,
             command_topic: str | None = None) -> BagInput:
    """The bag's matched topics, its summary and recorded commands; BagError when it cannot be used, ValueError
    when the configuration cannot read a state from any bag (``bag_state.py``)."""
    knobs = ObservationKnobs.of(settings["camera_subscriber"])
    reads = load_model_config(settings["reasoning"]["model_dir"]).state
    with Bag(path) as bag:
        image = bag.image_topic(image_topic)
        state = state_source(bag, knobs, reads)
        state_topic = None if state is None else state.topic
        command = bag.command_topic(command_topic, exclude=state_topic)
        total = bag.topics[image].count
        if total == 0:
            raise BagError(f"{path}: the camera topic {image} holds no messages")
        commands = RecordedCommands.read(bag, command, settings)
        info = {"path": str(path), "duration_s": bag.duration_s, "start_ns": bag.start_ns, "image_topic": image,
                "frames": total, "rate_hz": (total - 1) / bag.duration_s if bag.duration_s else 0.0,
                "command_topic": command, "command_type": commands.msgtype,
                "state": None if state is None else {"topic": state.topic, "state_type": state.state_type,
                                                     "found": state.found},
                "topics": topic_summary(bag, image, command, state_topic)}
    return BagInput(path, image, info, commands, state)


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
    state: StateSource | None = None  # where the robot's state is, for a model that reads one

    @property
    def key(self) -> str:
        return f"bag{self.bag:03d}_{self.policy}"


def prepare(context: ReplayContext) -> dict[str, Any]:
    """A worker's state: the checkpoint, read once for every bag and policy it replays."""
    return {"context": context, "checkpoint": load_model(context.settings)}


def run_unit(state: dict[str, Any], unit: ReplayUnit) -> dict[str, Any]:
    """One bag under one policy, from its frames alone (a fresh engine, buffer, gate and clock)."""
    context, source = state["context"], unit.state
    with Bag(unit.path) as bag:
        run = replay_policy(recorded_messages(bag, unit.image_topic, None if source is None else source.topic),
                            with_state(context.settings, source), unit.policy, context.costs,
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
    checkpoint = load_model(settings)
    for bag in bags:  # before any unit: an observation replay cannot feed fails them all
        check_replay_observation(with_state(settings, bag.state), checkpoint)
    costs.require(block_kinds(checkpoint.config))  # before any unit: a missing cost fails them all
    context = ReplayContext(settings, costs, realtime)
    targets = [None if debug_dirs is None else DebugTarget(debug_dirs[i], debug_video, bag.bag_info["rate_hz"])
               for i, bag in enumerate(bags)]
    identity = hashlib.sha256(json.dumps([SCHEMA, settings.values, costs.describe(), realtime,
                                          [str(b.path) for b in bags], targets,  # a resumed unit drew its images
                                          [b.state for b in bags]], sort_keys=True, default=str).encode()).hexdigest()
    units = [ReplayUnit(i, bag.path, bag.image_topic, policy, targets[i], bag.state) for i, bag in enumerate(bags)
             for policy in policies]
    keys = [[ReplayUnit(i, bag.path, bag.image_topic, policy).key for policy in policies] for i, bag in enumerate(bags)]
    for bag in bags:
        state = "" if bag.state is None else f" with the robot's state from {bag.state.describe()}"
        log(f"{bag.path.name}: replaying {bag.bag_info['frames']} frames of {bag.image_topic}{state} under "
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
                _check_observed(bag.path, bag.image_topic, runs[0])
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


def check_replay_observation(settings: Settings, checkpoint: Checkpoint) -> None:
    """ValueError unless replay can feed the configured observation to ``checkpoint``: one camera (more are not
    replayed yet) and the state exactly as the checkpoint reads it (``runtime.loader.check_observation``)."""
    knobs = ObservationKnobs.of(settings["camera_subscriber"])
    if knobs.extra_image_topics:
        raise ValueError(f"{settings.source}: camera_subscriber: replay feeds one camera, and this configuration's "
                         f"observation has {knobs.cameras} (extra_image_topics): not yet")
    try:
        check_observation(knobs, checkpoint)
    except ValueError as exc:
        raise ValueError(f"{settings.source}: camera_subscriber: {exc}") from exc


def _check_observed(path: Path, topic: str, run: PolicyRun) -> None:
    """BagError when no frame made an observation: none decoded, or none had a state to pair with. Neither
    depends on the policy, so the first run tells."""
    counts = run.counts
    bad = run.decode_errors
    if bad and sum(bad.values()) == counts["frames"]:
        reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(bad.items()))
        raise BagError(f"{path}: none of the {counts['frames']} frames on {topic} could be decoded ({reasons}); "
                       "nothing was replayed")
    decoded = counts["frames"] - counts["bad_frame"]
    if counts["no_state"] == decoded:
        last = next(record.detail for record in reversed(run.frames) if record.outcome == "no_state")
        dropped = ", ".join(f"{reason}: {count}" for reason, count in run.state_dropped.items() if count)
        raise BagError(f"{path}: none of the {decoded} decoded frames on {topic} had a robot state to pair with "
                       f"(last: {last}; {run.state_messages} state messages, dropped {dropped or 'none'}); "
                       "nothing was replayed")
