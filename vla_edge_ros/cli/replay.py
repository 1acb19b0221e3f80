"""``vla-edge replay BAG...``: compare memory policies on recorded data, deterministically by default."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..config import load_settings
from ..memory import POLICIES
from ..tools.replay import replay_bag
from .args import cost_model, subset_of


def cmd_replay(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    for index, bag in enumerate(args.bags):
        if not bag.exists():
            raise ValueError(f"{bag}: no such file or directory")
        out = args.out if len(args.bags) == 1 else args.out / f"{index:02d}_{bag.stem}"
        report = replay_bag(bag, settings, args.policy, args.cost, out, image_topic=args.image_topic,
                            command_topic=args.command_topic, realtime=args.realtime)
        print((out / "report.md").read_text())
        for name, policy in report["policies"].items():
            speed = policy["replay"]
            print(f"{name}: replayed {policy['frames']} frames at {speed['frames_per_s']:.1f} frames/s = "
                  f"{speed['x_realtime']:.2f}x the bag's real time ({report['bag']['rate_hz']:.1f} Hz)")
        print(f"wrote {out / 'report.json'}, report.md, decisions_*.txt and plots")
        if args.json:
            print(json.dumps(report["policies"], indent=2))
    return 0


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
    p.add_argument("--out", type=Path, default=Path("replay_report"), help="report directory")
    p.add_argument("--json", action="store_true", help="also print the per-policy report as JSON")
    p.set_defaults(func=cmd_replay)
