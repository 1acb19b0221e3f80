"""``vla-edge replay BAG...``: compare memory policies on recorded data, deterministically by default.

Each bag of a batch runs on its own: a bag that cannot be used (BagError: unreadable, no camera topic,
no frame that decodes) is reported on stderr and the next one runs; the exit status is 2 when any bag
failed, or when the model's output was not finite on any frame (its report is written, and flags it). A config or model error is no bag's fault and ends the command at once. ``--out`` is checked
before any bag is opened. Progress goes to stderr; with ``--json`` stdout holds
one JSON document and nothing else.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..bags import BagError
from ..config import load_settings
from ..memory import POLICIES
from ..tools.parallel import progress_bar, run_figures, run_line
from ..tools.replay.runner import read_bag, replay_bags
from .args import add_parallel_arguments, cost_model, subset_of

BATCH_SCHEMA = "vla_edge_ros.replay-batch/1"


def output_dirs(out: Path, bags: list[Path], option: str = "--out", what: str = "a report") -> list[Path]:
    """The directory of each bag (``out`` itself for one bag) for ``what``, after making sure that ``out`` is,
    or can be made, a directory this process writes to; ValueError naming ``option`` and saying why not.
    Nothing is created yet."""
    dirs = [out] if len(bags) == 1 else [out / f"{index:02d}_{bag.stem}" for index, bag in enumerate(bags)]
    for path in (out, *dirs):
        if path.exists() and not path.is_dir():
            raise ValueError(f"{option} {path} exists and is not a directory; name a directory for {what}")
    existing = next(path for path in (out, *out.parents) if path.exists())
    if not existing.is_dir():
        raise ValueError(f"{option} {out}: cannot write {what} there: {existing} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise ValueError(f"{option} {out}: cannot write {what} there: {existing}: {exc.strerror or exc}") from None
    return dirs


def cmd_replay(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    dirs = output_dirs(args.out, args.bags)
    debug_dirs = None
    if args.debug_frames is not None:
        if args.realtime:
            raise ValueError("--debug-frames cannot go with --realtime: drawing would take the reasoner's wall time, "
                             "which it never does live; replay on the virtual clock")
        debug_dirs = output_dirs(args.debug_frames, args.bags, "--debug-frames", "debug images")
    elif args.debug_video:
        raise ValueError("--debug-video needs --debug-frames DIR, the directory the videos go to")
    failed: dict[Path, str] = {}
    ready, outs, debugs = [], [], []
    for bag, out, debug in zip(args.bags, dirs, debug_dirs or dirs):
        try:
            ready.append(read_bag(bag, settings, args.image_topic, args.command_topic))
            outs.append(out)
            debugs.append(debug)
        except BagError as exc:
            failed[bag] = str(exc)
    reports, summaries = {}, []
    if ready:  # when no bag opened, their errors are the whole output: no progress bar, no run line
        reports, failures, summary = replay_bags(
            ready, outs, settings, args.policy, args.cost, args.out, realtime=args.realtime, workers=args.workers,
            ray_address=args.ray, resume=args.resume, debug_dirs=debugs if debug_dirs else None,
            debug_video=args.debug_video, bar=progress_bar("replay"))
        failed.update(failures)
        summaries.append(summary)
    invalid = {bag: _invalid_outputs(reports[bag]) for bag in args.bags if bag in reports}
    for bag in args.bags:
        if bag in failed:
            print(f"vla-edge replay: error: {failed[bag]}", file=sys.stderr, flush=True)
        elif not args.json:
            _print_summary(reports[bag], dirs[args.bags.index(bag)])
    run = run_figures(summaries, args.ray)
    if args.json:
        print(json.dumps({"schema": BATCH_SCHEMA, "reports": [reports[bag] for bag in args.bags if bag in reports],
                          "failed": [{"bag": str(bag), "error": failed[bag]} for bag in args.bags if bag in failed]},
                         indent=2))
    elif summaries:
        print(run_line(run, run.pop("seconds")))
    for bag, line in invalid.items():
        if line:
            print(f"vla-edge replay: error: {bag}: {line}", file=sys.stderr, flush=True)
    if failed and len(args.bags) > 1:
        print(f"vla-edge replay: {len(failed)} of {len(args.bags)} bags failed: "
              f"{', '.join(str(bag) for bag in args.bags if bag in failed)}", file=sys.stderr)
    return 2 if failed or any(invalid.values()) else 0


def _invalid_outputs(report: dict[str, Any]) -> str:
    """One line on the frames whose model output was not finite (NaN or Inf), or "" when there were none."""
    counts = {name: policy["invalid"] for name, policy in report["policies"].items() if policy["invalid"]}
    if not counts:
        return ""
    each = ", ".join(f"{count} of {report['policies'][name]['decoded_frames']} frames under {name}"
                     for name, count in counts.items())
    return f"the model's output was not finite (NaN or Inf) on {each}: no action came of them (see the report)"


def _print_summary(report: dict[str, Any], out: Path) -> None:
    print((out / "report.md").read_text())
    for name, policy in report["policies"].items():
        speed = policy["replay"]
        print(f"{name}: replayed {policy['frames']} frames at {speed['frames_per_s']:.1f} frames/s = "
              f"{speed['x_realtime']:.2f}x the bag's real time ({report['bag']['rate_hz']:.1f} Hz)")
    chunks = ", chunks_*.csv" if any("chunks_file" in policy for policy in report["policies"].values()) else ""
    print(f"wrote {out / 'report.json'}, report.md, predictions_*.csv{chunks}, decisions_*.txt and plots", flush=True)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="replay bags through the pipeline under each memory policy; write a report")
    p.add_argument("bags", nargs="+", type=Path, metavar="BAG",
                   help="rosbag2 directory, .mcap, .db3 or ROS 1 .bag")
    p.add_argument("--config", type=Path, help="YAML config (default: built-in defaults)")
    p.add_argument("--policy", type=subset_of(POLICIES), default=list(POLICIES),
                   help=f"comma-separated policies to compare ({','.join(POLICIES)})")
    p.add_argument("--image-topic", help="camera topic (default: the bag's only Image/CompressedImage topic)")
    p.add_argument("--command-topic", help="recorded command topic to compare actions with (default: auto)")
    p.add_argument("--cost", type=cost_model, default=cost_model("measured"),
                   help="block costs: measured (default) or fixed:encode=4ms,decode=1ms (deterministic)")
    p.add_argument("--realtime", action="store_true", help="pace by the wall clock instead of a virtual clock")
    p.add_argument("--out", type=Path, default=Path("replay_report"),
                   help="report directory (created; with several bags, one subdirectory NN_STEM per bag)")
    p.add_argument("--debug-frames", type=Path, metavar="DIR",
                   help="also write each cycle's debug image (the live vla/debug_image picture) into DIR: "
                        "POLICY/frame_NNNNNN.png per cycle (with several bags, one subdirectory NN_STEM per bag)")
    p.add_argument("--debug-video", action="store_true",
                   help="with --debug-frames: one POLICY.mp4 (mp4v) at the camera's rate instead of PNG files")
    p.add_argument("--json", action="store_true",
                   help="print only a JSON document to stdout: every bag's report.json content, and the failed bags")
    add_parallel_arguments(p)
    p.set_defaults(func=cmd_replay)
