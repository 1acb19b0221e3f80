"""What the replay tests feed ``vla-edge replay``: a small camera config for the tiny model, as settings or as
a YAML file, and bags whose frames decode or do not."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from vla_edge_ros.bags.scenarios import BagSpec, write_bag
from vla_edge_ros.bags.writer import BagWriter
from vla_edge_ros.config import Settings, parse_settings

FIXED = "fixed:encode=8ms,decode=1ms"


def replay_settings(tiny_model: Path, **reasoning) -> Settings:
    """64x48 frames into the tiny model's 128-token arena on the NumPy backend (``reasoning`` overrides)."""
    return parse_settings({
        "camera_subscriber": {"ros__parameters": {"frame_height": 48, "frame_width": 64}},
        "reasoning": {"ros__parameters": {"model_dir": str(tiny_model), "backend": "numpy",
                                          "kv_capacity_tokens": 128, **reasoning}}}, "test.yaml")


def replay_config_file(directory: Path, tiny_model: Path) -> Path:
    """``replay_settings`` as a YAML file for the command line."""
    config = directory / "c.yaml"
    config.write_text(f"reasoning:\n  ros__parameters:\n    model_dir: {tiny_model}\n    backend: numpy\n"
                      "    kv_capacity_tokens: 128\n"
                      "camera_subscriber:\n  ros__parameters:\n    frame_height: 48\n    frame_width: 64\n")
    return config


def camera_bag(path: Path, bad: Callable[[int], bool], frames: int = 20) -> Path:
    """A camera-only bag at 30 Hz whose frame i has an encoding nobody decodes when ``bad(i)``."""
    with BagWriter(path) as writer:
        topic = writer.add_topic("/camera/image_raw", "sensor_msgs/msg/Image")
        for index in range(frames):
            t = 1_000_000_000 + index * 33_333_333
            writer.write(topic, t, writer.types["sensor_msgs/msg/Image"](
                header=writer.header(t, "camera", seq=index), height=48, width=64,
                encoding="yuv422_weird" if bad(index) else "rgb8", is_bigendian=0, step=64 * 3,
                data=np.full(48 * 64 * 3, index, np.uint8)))
    return path


def write_moving_bag(directory: Path) -> Path:
    """Two seconds of the moving scene at 30 Hz, 64x48, with its ground-truth command topic (60 + 60 messages)."""
    return write_bag(BagSpec(scenario="moving", seconds=2.0, size=(64, 48)), directory / "moving.mcap")
