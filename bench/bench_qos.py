"""How many camera frames cross a process boundary, by encoding, QoS and DDS transport.

A publisher process sends 640x480 frames at 30 Hz (raw rgb8, 921,600 B, or JPEG of the same picture, a
few tens of kB); this process subscribes with the camera node's QoS (depth 1; best effort = sensor_data,
or reliable) and counts what arrives, with and without the camera node's decode in the callback.
Fast DDS's built-in transports are chosen per run with FASTDDS_BUILTIN_TRANSPORTS (DEFAULT: shared
memory + UDP; UDPv4; SHM; LARGE_DATA: shared memory + TCP for large samples, UDP for discovery), and the
package's config/fastdds_large_frames.xml (a 16 MB shared-memory segment, 4 MB UDP socket buffers) with
FASTDDS_DEFAULT_PROFILES_FILE.

    .venv/bin/python bench/bench_qos.py [--seconds 10] [--rate-hz 30]

Prints one row per case: frames sent, received, the share received, and the median latency.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PROFILE = "config/fastdds_large_frames.xml"  # the package's profile for raw frames between processes

PUBLISHER = r'''
import sys, time
import numpy as np, cv2, rclpy
from rclpy.qos import QoSProfile, ReliabilityPolicy, HistoryPolicy
from sensor_msgs.msg import Image, CompressedImage
encoding, reliability, rate, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
rclpy.init()
node = rclpy.create_node("qos_publisher")
qos = QoSProfile(depth=1, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.RELIABLE
                 if reliability == "reliable" else ReliabilityPolicy.BEST_EFFORT)
rng = np.random.default_rng(0)
frame = (rng.random((480, 640, 3)) * 255).astype(np.uint8)
frame = cv2.GaussianBlur(frame, (0, 0), 3)  # a camera-like picture: JPEG compresses it as it would a scene
if encoding == "raw":
    publisher = node.create_publisher(Image, "bench/image", qos)
    msg = Image(height=480, width=640, encoding="rgb8", step=640 * 3, data=frame.tobytes())
else:
    publisher = node.create_publisher(CompressedImage, "bench/image", qos)
    msg = CompressedImage(format="jpeg", data=cv2.imencode(".jpg", frame[:, :, ::-1])[1].tobytes())
deadline = time.monotonic() + 30.0  # discovery: until the subscriber has matched, then a second for its side
while publisher.get_subscription_count() < 1 and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(1.0)
sent, start = 0, time.monotonic()
while time.monotonic() - start < seconds:
    msg.header.stamp = node.get_clock().now().to_msg()
    msg.header.frame_id = str(sent)
    publisher.publish(msg)
    sent += 1
    time.sleep(max(0.0, start + sent / rate - time.monotonic()))
time.sleep(1.0)
print(sent, flush=True)
'''


def run_case(encoding: str, reliability: str, transport: str, decode: bool, rate_hz: float, seconds: float) -> dict:
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import CompressedImage, Image

    domain = 90 + os.getpid() % 50
    os.environ.pop("FASTDDS_BUILTIN_TRANSPORTS", None)
    os.environ.pop("FASTDDS_DEFAULT_PROFILES_FILE", None)
    if transport.endswith(".xml"):  # this process's participant and the publisher's use the same transports
        os.environ["FASTDDS_DEFAULT_PROFILES_FILE"] = str(ROOT / transport)
    else:
        os.environ["FASTDDS_BUILTIN_TRANSPORTS"] = transport
    env = {**os.environ, "ROS_DOMAIN_ID": str(domain)}
    context = Context()
    rclpy.init(context=context, domain_id=domain)
    node = rclpy.create_node("qos_subscriber", context=context)
    qos = QoSProfile(depth=1, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.RELIABLE
                     if reliability == "reliable" else ReliabilityPolicy.BEST_EFFORT)
    latencies: list[float] = []
    seen: set[str] = set()

    def on_message(msg) -> None:
        now = node.get_clock().now().nanoseconds
        if decode:
            if encoding == "raw":
                np.frombuffer(msg.data, np.uint8).reshape(480, 640, 3).copy()
            else:
                cv2.imdecode(np.frombuffer(msg.data, np.uint8), cv2.IMREAD_COLOR)
        seen.add(msg.header.frame_id)
        latencies.append((now - (msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec)) / 1e6)

    node.create_subscription(Image if encoding == "raw" else CompressedImage, "bench/image", on_message, qos)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    publisher = subprocess.Popen([sys.executable, "-c", PUBLISHER, encoding, reliability, str(rate_hz), str(seconds)],
                                 env=env, stdout=subprocess.PIPE, text=True)
    while publisher.poll() is None:
        executor.spin_once(timeout_sec=0.01)
    sent = int(publisher.stdout.read().strip() or 0)
    executor.shutdown()
    node.destroy_node()
    rclpy.shutdown(context=context)
    return {"sent": sent, "received": len(seen), "share": len(seen) / sent if sent else 0.0,
            "latency_ms": statistics.median(latencies) if latencies else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate-hz", type=float, default=30.0)
    args = parser.parse_args()
    print(f"{'encoding':>8} {'QoS':>11} {'transport':>10} {'decode':>6} {'sent':>5} {'received':>8} {'share':>6} "
          f"{'latency ms':>10}")
    cases = [(enc, rel, transport, decode) for transport in ("DEFAULT", "UDPv4", "SHM", "LARGE_DATA", PROFILE)
             for enc in ("raw", "jpeg") for rel in ("best_effort", "reliable") for decode in (False, True)]
    for encoding, reliability, transport, decode in cases:
        row = run_case(encoding, reliability, transport, decode, args.rate_hz, args.seconds)
        latency = f"{row['latency_ms']:.1f}" if row["latency_ms"] is not None else "-"
        print(f"{encoding:>8} {reliability:>11} {transport:>10} {str(decode):>6} {row['sent']:>5} {row['received']:>8} "
              f"{row['share']:>6.1%} {latency:>10}", flush=True)
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
