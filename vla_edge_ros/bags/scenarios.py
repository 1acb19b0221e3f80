"""Sample bags that look like a robot's recordings, with ground-truth commands, deterministic per seed.

Both scenarios write the camera as sensor_msgs/Image rgb8 on ``image_topic`` and/or as a JPEG
sensor_msgs/CompressedImage on ``image_topic + "/compressed"`` (image_transport's naming), stamped
with the time they are recorded at, plus one std_msgs/Float32MultiArray of COMMAND_DIMS values on
``command_topic`` at the same time as every frame: the command replay compares actions against.
NaN in a command means "no ground truth for this dimension" (as bags.commands uses it). Unless
``state_topic`` is empty, each frame also has the robot's state, a nav_msgs/Odometry on ``state_topic``
stamped as the frame (``odometry.py``): the odometry of a robot that executes the scenario's commanded
planar velocity (``VELOCITY_DIMS``) one period of ``rate_hz`` after another, from the origin at rest: x, y
the integral of the commands executed before the frame, yaw 0, vx, vy the last command executed (0 at the
first frame), wz 0. In the command's units (moving: half-frames, half-frames per second).

- ``moving``: the moving textured scene of SyntheticCamera (default 640x480). The command is what a
  controller tracking the red disc would send, measured from the rendered pixels (so it is only as
  fine as the pixel grid: at 64x48 the velocity is off by up to 0.25, at 320x240 by 0.04): dims 0-1 the
  disc's velocity from this frame to the next (x, y in half-frames per second, clipped to [-1, 1]),
  dims 2-3 its position (x, y from -1 at the left/top edge to 1 at the right/bottom edge), dims 4-6 0.
- ``cue-recall``: the memory benchmark's scored episodes (the same CueScene seeds for the same
  ``seed``; default 64x64), back to back, EPISODE_S each: a cue frame, distractors, a query frame,
  with cue class ``episode index % CUE_CLASSES``. The command is all NaN except at each query frame,
  where dims 0..CUE_CLASSES-1 answer which cue was shown: +1 for its class, -1 for the others (the
  remaining dims stay NaN). The bag holds whole episodes only, so it may be slightly shorter than asked.
  Its commands are answers, not motion, and its camera never moves: its robot's odometry stands still at
  the origin.

Timestamps start at START_NS and step by 1 / rate_hz, so two runs with the same arguments write the
same messages, byte for byte.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from ..worlds.scenes import TEST, CueScene, scene_seed
from ..worlds.synthetic import SyntheticCamera
from .odometry import ODOMETRY_MSGTYPE, STATE_TOPIC, CommandedOdometry, bag_odometry
from .writer import BagWriter

SCENARIOS: tuple[str, ...] = ("moving", "cue-recall")
IMAGE_MODES: tuple[str, ...] = ("raw", "compressed", "both")
DEFAULT_SIZES: dict[str, tuple[int, int]] = {"moving": (640, 480), "cue-recall": (64, 64)}  # (width, height)
COMMAND_DIMS = 7
START_NS = 1_735_689_600 * 10**9  # 2025-01-01T00:00:00Z, fixed so that bags are reproducible
CUE_CLASSES = 4
EPISODE_S = 1.0
JPEG_QUALITY = 90
VELOCITY_DIMS: dict[str, tuple[int, ...]] = {"moving": (0, 1), "cue-recall": ()}
"""The command's dimensions a robot executes as its planar velocity (vx, vy); none: it stands still."""
DISC_RED_MIN = 190  # the disc is (220, 60, 40); the background's red stays below 160 before noise (sigma 4)


@dataclass(frozen=True)
class BagSpec:
    scenario: str = "moving"
    seconds: float = 10.0
    seed: int = 0
    rate_hz: float = 30.0
    size: tuple[int, int] | None = None  # (width, height); None takes DEFAULT_SIZES[scenario]
    images: str = "raw"  # one of IMAGE_MODES
    image_topic: str = "/camera/image_raw"
    command_topic: str = "/vla/command"
    state_topic: str = STATE_TOPIC  # the robot's odometry; empty: none
    frame_id: str = "camera"

    @property
    def frame_size(self) -> tuple[int, int]:
        return self.size or DEFAULT_SIZES[self.scenario]

    @property
    def frame_count(self) -> int:
        return max(1, round(self.seconds * self.rate_hz))

    @property
    def episode_frames(self) -> int:
        """Frames per cue-recall episode: the cue, the distractors and the query."""
        return max(3, round(EPISODE_S * self.rate_hz))

    def validate(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {self.scenario!r}; known scenarios: {', '.join(SCENARIOS)}")
        if self.images not in IMAGE_MODES:
            raise ValueError(f"images must be one of {', '.join(IMAGE_MODES)}, got {self.images!r}")
        if not (self.seconds > 0 and self.rate_hz > 0):
            raise ValueError(f"seconds and rate_hz must be positive, got {self.seconds} and {self.rate_hz}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.scenario == "cue-recall" and self.frame_count < self.episode_frames:
            raise ValueError(f"cue-recall needs at least one {EPISODE_S:g} s episode "
                             f"({self.episode_frames} frames), got {self.frame_count} frames")


def scenario_frames(spec: BagSpec) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(HxWx3 uint8 RGB frame, float32 command of COMMAND_DIMS) for each frame of ``spec``'s scenario."""
    spec.validate()
    return _moving(spec) if spec.scenario == "moving" else _cue_recall(spec)


def write_bag(spec: BagSpec, out: str | Path, *, storage: str | None = None, compression: str = "none",
              force: bool = False) -> Path:
    """Write ``spec``'s bag to ``out`` (see bags.writer for the layouts ``out`` and ``storage`` pick)."""
    spec.validate()
    with BagWriter(out, storage, compression=compression, force=force) as writer:
        types = writer.types
        state = writer.add_topic(spec.state_topic, ODOMETRY_MSGTYPE) if spec.state_topic else None  # see odometry.py
        robot = CommandedOdometry(spec.rate_hz)
        raw = writer.add_topic(spec.image_topic, "sensor_msgs/msg/Image") if spec.images != "compressed" else None
        jpeg = (writer.add_topic(f"{spec.image_topic}/compressed", "sensor_msgs/msg/CompressedImage")
                if spec.images != "raw" else None)
        command = writer.add_topic(spec.command_topic, "std_msgs/msg/Float32MultiArray")
        for index, (pixels, action) in enumerate(scenario_frames(spec)):
            time_ns = START_NS + round(index * 1e9 / spec.rate_hz)
            if state is not None:
                writer.write(state, time_ns, bag_odometry(writer, time_ns, robot.state()))
                _execute(robot, spec, index, action)
            header = writer.header(time_ns, spec.frame_id, seq=index)
            if raw is not None:
                writer.write(raw, time_ns, writer.image(time_ns, spec.frame_id, pixels, seq=index))
            if jpeg is not None:
                ok, encoded = cv2.imencode(".jpg", cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR),
                                           [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
                assert ok, "OpenCV failed to encode a JPEG"
                writer.write(jpeg, time_ns, types["sensor_msgs/msg/CompressedImage"](
                    header=header, format="rgb8; jpeg compressed bgr8", data=encoded.reshape(-1)))
            writer.write(command, time_ns, writer.float32_array(action, "action"))
    return writer.out


def _execute(robot: CommandedOdometry, spec: BagSpec, index: int, command: np.ndarray) -> None:
    """The robot executes frame ``index``'s commanded velocity (``VELOCITY_DIMS``) until the next frame."""
    dims = VELOCITY_DIMS[spec.scenario]
    try:
        robot.execute(command[list(dims)] if dims else np.zeros(2))
    except ValueError as exc:
        raise ValueError(f"{spec.scenario} frame {index}: {exc} (the disc is not visible at "
                         f"{spec.frame_size[0]}x{spec.frame_size[1]}); --state-topic '' writes no odometry") from exc


def _moving(spec: BagSpec) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    width, height = spec.frame_size
    camera = SyntheticCamera(height, width, spec.seed)
    frames = (camera.frame() for _ in range(spec.frame_count))
    current = next(frames)
    position = _disc_position(current)
    velocity = np.zeros(2)
    for upcoming in itertools.chain(frames, [None]):
        if upcoming is not None:  # the last frame keeps the velocity that led to it
            upcoming_position = _disc_position(upcoming)
            velocity = np.clip((upcoming_position - position) * spec.rate_hz, -1.0, 1.0)
        command = np.zeros(COMMAND_DIMS, np.float32)
        command[0:2], command[2:4] = velocity, position
        yield current, command
        if upcoming is not None:
            current, position = upcoming, upcoming_position


def _disc_position(frame: np.ndarray) -> np.ndarray:
    """(x, y) of the red disc's centre in [-1, 1] frame coordinates; NaN where no pixel is red enough."""
    rows, cols = np.nonzero(frame[:, :, 0] >= DISC_RED_MIN)
    if rows.size == 0:
        return np.full(2, np.nan)
    height, width = frame.shape[:2]
    return np.array([(cols.mean() + 0.5) / width * 2 - 1, (rows.mean() + 0.5) / height * 2 - 1])


def _cue_recall(spec: BagSpec) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    width, height = spec.frame_size
    per_episode = spec.episode_frames
    silent = np.full(COMMAND_DIMS, np.nan, np.float32)
    for index in range(spec.frame_count // per_episode):
        cls = index % CUE_CLASSES
        scene = CueScene(scene_seed(spec.seed, TEST, index), classes=CUE_CLASSES, height=height, width=width)
        answer = silent.copy()
        answer[:CUE_CLASSES] = -1.0
        answer[cls] = 1.0
        frames = scene.episode(cls, per_episode - 2)
        for position, frame in enumerate(frames):
            yield frame, answer if position == len(frames) - 1 else silent
