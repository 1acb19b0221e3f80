"""``vla-edge make-bag`` writes sample bags; ``vla-edge play`` publishes a bag over DDS with /clock."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..bags import Bag
from ..bags.odometry import STATE_TOPIC
from ..bags.scenarios import SCENARIOS, BagSpec, write_bag
from ..bags.writer import COMPRESSIONS, STORAGES
from .args import count


def _size(text: str) -> tuple[int, int]:
    width, _, height = text.lower().partition("x")
    try:
        return int(width), int(height)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT, e.g. 640x480, got {text!r}") from exc


def _describe(bag: Bag) -> str:
    return "\n".join(f"  {info.name:<32} {info.msgtype:<34} {info.count:>7} messages" for info in bag.topics.values())


def cmd_make_bag(args: argparse.Namespace) -> int:
    spec = BagSpec(scenario=args.scenario, seconds=args.seconds, seed=args.seed, rate_hz=args.rate_hz,
                   size=args.size, images=args.images, image_topic=args.image_topic,
                   command_topic=args.command_topic, state_topic=args.state_topic)
    began = time.monotonic()
    out = write_bag(spec, args.out, storage=args.storage, compression=args.compression, force=args.force)
    elapsed = time.monotonic() - began
    size = sum(p.stat().st_size for p in out.rglob("*")) if out.is_dir() else out.stat().st_size
    width, height = spec.frame_size
    with Bag(out) as bag:
        print(f"wrote {out} ({size / 1e6:.1f} MB) in {elapsed:.1f} s: {args.scenario}, {width}x{height}, "
              f"{bag.duration_s:.2f} s at {args.rate_hz:g} Hz, seed {args.seed}")
        print(_describe(bag))
    return 0


def cmd_play(args: argparse.Namespace) -> int:
    from ..nodes.bag_player import BagPlayer, StartWhen
    from ..nodes.ros_session import ros_session

    start = StartWhen(args.wait_subscribers, args.wait_timeout, args.delay)
    with Bag(args.bag) as bag, ros_session():
        player = BagPlayer(bag, args.topics, rate=args.rate, clock_hz=args.clock)
        args.stop.running = True  # from here a signal stops playback (play sees it), even before play is called
        try:
            print(f"playing {bag.path} ({bag.duration_s:.2f} s) at x{args.rate:g}"
                  f"{', looping' if args.loop else ''}, /clock at {args.clock:g} Hz:\n{_describe(bag)}", flush=True)
            if start.subscribers:
                print(f"waiting up to {start.timeout_s:g} s for {start.subscribers} subscriber(s) on each of "
                      f"{', '.join(player.topics)}", flush=True)
            if start.delay_s:
                print(f"starting {start.delay_s:g} s after that", flush=True)
            began = time.monotonic()

            def progress() -> None:
                print(f"bag time {(player.bag_time_ns - bag.start_ns) / 1e9:7.2f} / {bag.duration_s:.2f} s, "
                      f"{player.published} messages published", flush=True)

            player.play(loop=args.loop, every_second=progress, stop=args.stop, start=start)
            print(f"played {player.published} messages (passes completed: {player.passes}) in "
                  f"{time.monotonic() - began:.1f} s", flush=True)
        finally:
            player.destroy_node()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("make-bag",
                       help="write a deterministic sample bag: camera frames, ground-truth commands, odometry")
    p.add_argument("--scenario", required=True, choices=SCENARIOS)
    p.add_argument("--out", required=True, type=Path,
                   help="a rosbag2 directory, or a single .mcap, .db3 (rosbag2 storage) or .bag (ROS 1) file")
    p.add_argument("--storage", choices=STORAGES, help="storage of a directory --out (default mcap)")
    p.add_argument("--compression", choices=COMPRESSIONS, default="none",
                   help="zstd per message or per file (directories), or per chunk (mcap zstd, ROS 1 lz4)")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rate-hz", type=float, default=30.0)
    p.add_argument("--size", type=_size, help="WIDTHxHEIGHT (default 640x480 for moving, 64x64 for cue-recall)")
    images = p.add_mutually_exclusive_group()
    images.add_argument("--raw", dest="images", action="store_const", const="raw", help="sensor_msgs/Image (default)")
    images.add_argument("--compressed", dest="images", action="store_const", const="compressed",
                        help="JPEG sensor_msgs/CompressedImage on IMAGE_TOPIC/compressed")
    images.add_argument("--both", dest="images", action="store_const", const="both")
    p.set_defaults(images="raw")
    p.add_argument("--image-topic", default="/camera/image_raw")
    p.add_argument("--command-topic", default="/vla/command")
    p.add_argument("--state-topic", default=STATE_TOPIC,
                   help=f"the robot's nav_msgs/Odometry, that of a robot executing the commanded velocity (default "
                        f"{STATE_TOPIC}; '' writes none)")
    p.add_argument("--force", action="store_true", help="replace an existing output bag")
    p.set_defaults(func=cmd_make_bag)

    p = sub.add_parser("play", help="publish a bag's camera and command topics over DDS with /clock (no rosbag2)")
    p.add_argument("bag", type=Path, help="a rosbag2 directory, a .mcap or .db3 file, or a ROS 1 .bag")
    p.add_argument("--rate", type=float, default=1.0, help="playback speed factor")
    p.add_argument("--loop", action="store_true", help="start over at the end, until Ctrl-C or SIGTERM")
    p.add_argument("--clock", type=float, default=100.0, metavar="HZ", help="/clock rate in Hz (0: no /clock)")
    p.add_argument("--topics", nargs="+", help="topics to publish (default: every camera and command topic)")
    p.add_argument("--wait-subscribers", type=lambda text: count(text, minimum=0), default=0, metavar="N",
                   help="publish nothing until every played topic has N matched subscribers (default 0: start now)")
    p.add_argument("--wait-timeout", type=float, default=30.0, metavar="S",
                   help="give up (exit 2) when the subscribers have not matched after S seconds (default 30)")
    p.add_argument("--delay", type=float, default=0.0, metavar="S",
                   help="then wait S seconds more before the first message, so that a node that has just matched "
                        "finishes discovery too (default 0)")
    p.set_defaults(func=cmd_play)
