"""A camera driver without a camera: SyntheticCamera frames as sensor_msgs/Image over DDS.

`vla-edge run` and the tests use it so that frames take the same path as on a robot (a publisher in
the graph, sensor-data QoS, a stamped header, the camera subscriber decoding rgb8), with nothing
attached. On its own, `ros2 run vla_edge_ros synthetic_camera --rate-hz 30` stands in for a camera
driver in front of a launched pipeline. It is a tool rather than a configured node, so it takes
command-line arguments instead of schema parameters.
"""

from __future__ import annotations

import argparse
import array
import sys
from typing import Any

import numpy as np
import rclpy
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image
from std_msgs.msg import Header

from ..runtime.stop_signals import StopSignals
from ..worlds.synthetic import SyntheticCamera
from .ros_session import ros_session


def image_message(pixels: np.ndarray, header: Header) -> Image:
    """An HxWx3 uint8 RGB array as sensor_msgs/Image rgb8."""
    height, width = pixels.shape[:2]
    data = array.array("B")
    data.frombytes(np.ascontiguousarray(pixels))  # one copy; assigning bytes would make rclpy check every byte
    return Image(header=header, height=height, width=width, encoding="rgb8", is_bigendian=0, step=width * 3, data=data)


class SyntheticCameraPublisher(Node):
    """Publishes rgb8 frames of a deterministic synthetic scene at ``rate_hz``, stamped by the node clock."""

    def __init__(self, topic: str = "camera/image_raw", rate_hz: float = 30.0, height: int = 480,
                 width: int = 640, seed: int = 0, frame_id: str = "camera", **node_kwargs: Any) -> None:
        if not rate_hz > 0.0:
            raise ValueError(f"rate_hz must be positive, got {rate_hz}")
        self.camera = SyntheticCamera(height, width, seed)  # checks the size before a node exists
        super().__init__("synthetic_camera", **node_kwargs)
        self.frame_id = frame_id
        self.published = 0
        self._publisher = self.create_publisher(Image, topic, qos_profile_sensor_data)
        self._timer = self.create_timer(1.0 / rate_hz, self._publish)

    def _publish(self) -> None:
        # Stamp first, like a driver stamping the exposure: the header says when the scene was seen.
        header = Header(stamp=self.get_clock().now().to_msg(), frame_id=self.frame_id)
        self._publisher.publish(image_message(self.camera.frame(), header))
        self.published += 1


def run(args_with_ros: list[str], stop: StopSignals) -> int:
    """`synthetic_camera [--topic T] [--rate-hz R] ... [--ros-args ...]` (entry.py installed ``stop``)."""
    parser = argparse.ArgumentParser(prog="synthetic_camera", description=__doc__.splitlines()[0])
    parser.add_argument("--topic", default="camera/image_raw")
    parser.add_argument("--rate-hz", type=float, default=30.0)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(rclpy.utilities.remove_ros_args(args_with_ros)[1:])
    with ros_session(args_with_ros):
        try:
            node = SyntheticCameraPublisher(args.topic, args.rate_hz, args.height, args.width, args.seed)
        except ValueError as exc:
            print(f"synthetic_camera: error: {exc}", file=sys.stderr)
            return 2
        stop.running = True
        try:
            while rclpy.ok() and stop.requested is None:
                rclpy.spin_once(node, timeout_sec=0.1)
        finally:
            stop.running = False
            node.destroy_node()
    return 0
