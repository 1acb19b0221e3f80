"""What the debug image costs the reasoning cycle live: `vla-edge run --sim` with vla/debug_image off and on.

Each run is `vla-edge run --sim cue-reach --duration D` in its own process (the simulated robot closes the
loop: its camera in, the commands out), with ``reasoning.debug_image.enabled`` false or true (rate 5 Hz,
640 px wide: the defaults), interleaved off, on, off, on, ... so that a change in the machine's load hits
both alike. A listener process subscribes to vla/debug_image in every run, on and off, as rviz or Foxglove
would (the transfer is part of the cost, and the off runs carry the same extra process). All processes of
the bench share a DDS domain leased like the tests' (test/ros_graph.py), so nothing else on the host hears
them or is heard.

    .venv/bin/python bench/bench_debug_image.py [--duration 60] [--pairs 2]

First, in this process, what each thread spends on it, per call (median and p99 over many calls): the
reasoning thread's hand-off around one cycle of the shipped model (``DebugFeed.before_cycle`` +
``after_cycle``, per memory policy, the memory full), the camera callback's copy of one frame
(``FrameCopies.add``), and the executor's drawing of one picture and its message. Then the live runs: one
row per run (the reasoning cycle's latency p50 / p99 from the run summary, frame arrival to action ready;
actions, refused, missed; debug images published and received; the CPU seconds the `vla-edge run` process
used; the 1-minute load average before and after) and the ratio of the mean p99 with the debug image on to
off, overall and per pair. ``--pairs 0`` skips the live runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test"))
from ros_graph import leased_domain  # noqa: E402  (the tests' domain leases: no crosstalk on a shared host)

LISTENER = r'''
import json, signal
import rclpy
from rclpy.signals import SignalHandlerOptions
from sensor_msgs.msg import Image
from vla_edge_ros.nodes.debug_image import QOS
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(True))  # the bench's end of the run: report, then exit
rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
node = rclpy.create_node("debug_image_listener")
received = []
node.create_subscription(Image, "vla/debug_image", lambda m: received.append(len(m.data)), QOS)
while not stop:
    rclpy.spin_once(node, timeout_sec=0.1)
print(json.dumps({"received": len(received), "bytes": max(received, default=0)}))
'''


def _timed(call: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(median, p99) of ``call``'s wall time in microseconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        call()
        times.append((time.perf_counter_ns() - start) / 1e3)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, round(0.99 * len(times)))]


def micro(repeats: int = 300) -> None:
    """Each thread's cost of the debug image, per call, in this process."""
    from vla_edge_ros.config import OutputKnobs, defaults
    from vla_edge_ros.nodes.synthetic_camera import image_message
    from vla_edge_ros.runtime.cycle_view import DebugFeed
    from vla_edge_ros.runtime.debug_image import FrameCopies, draw_debug_image, layout_for
    from vla_edge_ros.runtime.frame_buffer import Frame
    from vla_edge_ros.runtime.loader import load_engine
    from vla_edge_ros.runtime.reasoner import CycleResult
    from vla_edge_ros.runtime.admission import Verdict
    from vla_edge_ros.worlds.synthetic import SyntheticCamera
    from std_msgs.msg import Header

    settings = defaults()
    camera = SyntheticCamera(96, 96, seed=0)
    print("reasoning thread, per cycle (models/sim, memory full): hand-off / the cycle itself, us")
    for policy in ("fifo", "cosine", "aura", "dms"):
        engine = load_engine(settings.replace("reasoning", {"kv.policy": policy, "kv_store.dir": ""})).engine
        feed, hand_off, cycle = DebugFeed(), [], []
        feed.enabled = True
        for seq in range(repeats):
            image = camera.frame()
            start = time.perf_counter_ns()
            feed.before_cycle(engine.policy)
            begun = time.perf_counter_ns()
            action, _ = engine.decode_action(engine.add_frame(image))
            ended = time.perf_counter_ns()
            feed.after_cycle(Frame(image, seq, seq, seq), CycleResult(Verdict.ADMITTED, action, seq, False))
            hand_off.append((begun - start + time.perf_counter_ns() - ended) / 1e3)
            cycle.append((ended - begun) / 1e3)
        tail = hand_off[repeats // 2:]  # the memory is full by then
        print(f"  {policy:6}  hand-off median {statistics.median(tail):6.1f}  max {max(tail):7.1f}   "
              f"cycle median {statistics.median(cycle[repeats // 2:]):8.0f}")
    output = OutputKnobs.of(settings["action_publisher"])
    for shape in ((96, 96, 3), (480, 640, 3)):
        frames = [SyntheticCamera(shape[0], shape[1], seed=1).frame() for _ in range(8)]
        layout = layout_for(shape, 640, output.command_type)
        copies = FrameCopies()
        counter = iter(range(10**9))
        copy = _timed(lambda: copies.add(next(counter), frames[0], layout, None), repeats)
        view = feed.latest()
        thumbnails = [frames[i % 8] for i in range(len(view.strip))]
        picture = _timed(lambda: image_message(draw_debug_image(frames[0], view, thumbnails, layout, output, 33.0),
                                               Header()), repeats // 3)
        print(f"camera {shape[1]}x{shape[0]}, picture 640x{layout.height}: camera callback copy median {copy[0]:.0f} "
              f"p99 {copy[1]:.0f} us; executor picture + message median {picture[0] / 1e3:.2f} p99 "
              f"{picture[1] / 1e3:.2f} ms", flush=True)


def run_once(enabled: bool, duration_s: float, directory: Path, index: int, domain: int) -> dict:
    """One `vla-edge run --sim cue-reach` with the debug image ``enabled``; its figures."""
    config = directory / f"run{index}.yaml"
    config.write_text("reasoning:\n  ros__parameters:\n    debug_image:\n"
                      f"      enabled: {'true' if enabled else 'false'}\n")
    summary = directory / f"run{index}.json"
    env = {**os.environ, "ROS_DOMAIN_ID": str(domain)}
    listener = subprocess.Popen([sys.executable, "-c", LISTENER], env=env, stdout=subprocess.PIPE, text=True)
    load_before = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = subprocess.run([sys.executable, "-m", "vla_edge_ros", "run", "--sim", "cue-reach", "--duration",
                          str(duration_s), "--config", str(config), "--summary-json", str(summary)], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if run.returncode != 0:
        listener.terminate()
        raise SystemExit(f"vla-edge run exited {run.returncode}:\n{run.stderr}")
    load_after = os.getloadavg()[0]
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the run's process is reaped, the listener not yet
    listener.terminate()
    heard = listener.communicate()[0]
    reasoning = json.loads(summary.read_text())["reasoning"]
    return {"debug_image": "on" if enabled else "off", "p50_ms": reasoning["latency_p50_ms"],
            "p99_ms": reasoning["latency_p99_ms"], "actions": reasoning["actions"], "refused": reasoning["refused"],
            "missed": reasoning["missed"], "published": reasoning["debug_images_published"],
            "received": json.loads(heard)["received"], "load_before": load_before, "load_after": load_after,
            "cpu_s": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per run")
    parser.add_argument("--pairs", type=int, default=2, help="off/on pairs, interleaved (0: only the per-call costs)")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}", flush=True)
    micro()
    if args.pairs == 0:
        return
    rows = []
    with leased_domain() as domain, tempfile.TemporaryDirectory(prefix="bench-debug-image-") as tmp:
        print(f"live: DDS domain {domain}, {args.duration:g} s per run", flush=True)
        print("debug_image  p50_ms  p99_ms  actions  refused  missed  published  received  cpu_s  load_before  "
              "load_after", flush=True)
        for index in range(2 * args.pairs):
            row = run_once(index % 2 == 1, args.duration, Path(tmp), index, domain)
            rows.append(row)
            print(f"{row['debug_image']:>11}  {row['p50_ms']:6.1f}  {row['p99_ms']:6.1f}  {row['actions']:7d}  "
                  f"{row['refused']:7d}  {row['missed']:6d}  {row['published']:9d}  {row['received']:8d}  "
                  f"{row['cpu_s']:5.1f}  {row['load_before']:11.2f}  {row['load_after']:10.2f}", flush=True)
            time.sleep(2.0)  # the previous run's processes are gone before the next starts
    p99 = {mode: statistics.mean(r["p99_ms"] for r in rows if r["debug_image"] == mode) for mode in ("off", "on")}
    pairs = [on["p99_ms"] / off["p99_ms"] for off, on in zip(rows[::2], rows[1::2])]
    print(f"mean p99: off {p99['off']:.2f} ms, on {p99['on']:.2f} ms, on / off = {p99['on'] / p99['off']:.3f}; "
          f"per pair on / off: {', '.join(f'{r:.3f}' for r in pairs)} (median {statistics.median(pairs):.3f})")


if __name__ == "__main__":
    main()
