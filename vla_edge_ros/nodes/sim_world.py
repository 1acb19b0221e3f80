"""The 2-D world as a robot on the graph: its camera on the image topic, its odometry on the odometry topic,
its wheels on the command topic.

`vla-edge run --sim reach|cue-reach|lang-reach|chase` starts it in place of the synthetic camera, so the loop
closes through DDS as on a robot: every camera period the world applies the newest command (zero once that
is older than ``command_timeout_ms``: the robot's own safe stop), steps, and publishes its odometry as
nav_msgs/Odometry (``CueReachEnv.odometry``: pose x, y and yaw, twist linear x, y and angular z; frame
``odom``, child frame ``base_link``) and then the view as sensor_msgs/Image rgb8, both with the same header
stamp, so the reasoning node pairs the frame with the state it was seen in (a checkpoint that reads a state
subscribes to it: ``simulated_robot_observation``). Finished episodes are logged and counted, and the next
one starts from the next seed. Between two the robot jumps to a new layout, which no robot does, so with
``reset_service`` the world says so first, as the simulated arm does: it calls the reasoning node's
``~/reset_episode`` and holds the new layout back (no step, no frame) until the answer comes, at most
``ANNOUNCE_TIMEOUT_S``. Each episode then starts as ``vla-edge evaluate`` starts one: the memory from the
prompt, no chunk of the last layout executed or blended in, no frame of it read. An episode that could not
be announced is counted and logged, and the world goes on. The world runs on the executor's thread, so it
waits by skipping its ticks, never by blocking.

In ``lang-reach`` nothing in the view marks the goal: the world words it as an operator would, one
instruction per episode on the instruction topic, sent once the reasoning node listens, so the first
episode's is not lost to discovery. The instruction is the episode's template (``instructions``: drawn from
the episode's seed as ``vla-edge evaluate`` draws it; ``INSTRUCTION`` when none are given) with the goal's
colour filled in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from geometry_msgs.msg import Quaternion, Twist
from nav_msgs.msg import Odometry
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image
from std_msgs.msg import Float32MultiArray, Header, String
from std_srvs.srv import Trigger

from ..runtime.robot_state import yaw_quaternion
from ..tools.lang_reach import instruction_of
from ..worlds.sim.world import VELOCITY_COMMANDS, CueReachEnv, TaskSpec
from .synthetic_camera import image_message

INSTRUCTION = "go to the {color} target"
ANNOUNCE_TIMEOUT_S = 2.0  # how long a simulated world waits for the reasoning node to take a new episode


@dataclass
class Episodes:
    """The episodes a simulated robot (or arm) ran back to back: how many, how many succeeded, and a figure of each
    success (the time or the steps it took), for its log line, the status line and the summary."""

    count: int = 0
    successes: int = 0
    to_success: list[float] = field(default_factory=list)

    def end(self, success: bool, figure: float) -> str:
        """Count an episode that ended; "k/n so far" for its log line."""
        self.count += 1
        self.successes += success
        if success:
            self.to_success.append(figure)
        return f"{self.successes}/{self.count} so far"

    def mean_to_success(self) -> float | None:
        return float(np.mean(self.to_success)) if self.to_success else None


class SimWorldNode(Node):
    """Runs ``task`` episodes back to back, driven by (vx, vy) from the command topic."""

    def __init__(self, task: str, *, image_topic: str, command_topic: str, command_type: str, instruction_topic: str,
                 odometry_topic: str = "odom", instructions: Sequence[str] = (INSTRUCTION,), seed: int = 0,
                 command_timeout_ms: float = 200.0, reset_service: str | None = None, **node_kwargs: Any) -> None:
        if command_type not in VELOCITY_COMMANDS:
            raise ValueError(f"the simulated robot takes velocity commands ({', '.join(VELOCITY_COMMANDS)}), "
                             f"not {command_type!r}")
        self.spec = TaskSpec(name=task)
        self.spec.validate()
        super().__init__("sim_world", **node_kwargs)
        self.seed = seed
        self.env = CueReachEnv(self.spec, seed)
        self.tally = Episodes()  # to_success: seconds to reach the goal
        self.commands = self.malformed_commands = self.unannounced = 0
        self._reset = None if reset_service is None else self.create_client(Trigger, reset_service)
        self._announcing: tuple[Any, int, np.ndarray] | None = None  # (the call, when asked, the new layout's frame)
        self._timeout_ns = int(command_timeout_ms * 1e6)
        self._command = np.zeros(2)
        self._command_ns: int | None = None
        self._publisher = self.create_publisher(Image, image_topic, qos_profile_sensor_data)
        self._odometry = self.create_publisher(Odometry, odometry_topic, qos_profile_sensor_data)
        self.instructions = tuple(instructions) or (INSTRUCTION,)
        self.instruction: str | None = None  # this episode's, in lang-reach
        self._told = False  # whether the reasoning node has been sent this episode's instruction
        self._instructions = (self.create_publisher(String, instruction_topic, 10) if task == "lang-reach" else None)
        self._new_instruction()
        if command_type == "twist":
            self.create_subscription(Twist, command_topic, lambda m: self._take(m.linear.x, m.linear.y), 10)
        else:
            self.create_subscription(Float32MultiArray, command_topic, self._take_array, 10)
        self.create_timer(1.0 / self.spec.rate_hz, self._tick)

    def _take_array(self, message: Float32MultiArray) -> None:
        if len(message.data) < 2:  # not (vx, vy): dropped and counted, the robot keeps its last command
            self.malformed_commands += 1
            self.get_logger().warning(f"dropped a command with {len(message.data)} values (need vx, vy); "
                                      f"{self.malformed_commands} so far", throttle_duration_sec=5.0)
            return
        self._take(message.data[0], message.data[1])

    def _take(self, vx: float, vy: float) -> None:
        self._command = np.array([vx, vy], dtype=np.float64)  # the world clips and zeroes NaN itself
        self._command_ns = self.get_clock().now().nanoseconds
        self.commands += 1

    def _tick(self) -> None:
        now = self.get_clock().now().nanoseconds
        if self._announcing is not None:
            if self._announced(now):
                self._show(self._announcing[2])
                self._announcing = None
            return
        fresh = self._command_ns is not None and now - self._command_ns <= self._timeout_ns
        outcome = self.env.step(self._command if fresh else np.zeros(2))
        frame = outcome.frame
        if outcome.done:
            so_far = self.tally.end(outcome.success, outcome.time_s)
            self.get_logger().info(f"{self.spec.name} episode {self.episodes} (seed {self.seed}): "
                                   f"{'reached the goal' if outcome.success else 'failed'} after {outcome.time_s:.2f} s"
                                   f"{', touched a wrong target' if outcome.touched_wrong else ''}; {so_far}")
            self.seed += 1
            self.env = CueReachEnv(self.spec, self.seed)
            frame = self.env.reset()
            self._new_instruction()
            if self._announce(now, frame):
                return
        self._show(frame)

    def _show(self, frame: np.ndarray) -> None:
        """Tell this episode's instruction if not yet told, then publish the odometry and the frame seen in it."""
        self._tell()
        stamp = self.get_clock().now().to_msg()  # the frame's and its state's: the robot was there when it was seen
        self._odometry.publish(self.odometry_message(stamp))
        self._publisher.publish(image_message(frame, Header(stamp=stamp, frame_id="camera")))

    def _announce(self, now_ns: int, frame: np.ndarray) -> bool:
        """Ask for a new episode (``reset_service``) before ``frame``, the new layout, is shown; whether the world
        now waits for the answer (no: no service, or none ready, counted)."""
        if self._reset is None:
            return False
        if not self._reset.service_is_ready():
            self._unannounced("no service ready")
            return False
        self._announcing = (self._reset.call_async(Trigger.Request()), now_ns, frame)
        self._command_ns = None  # the old layout's command: the robot holds still until the new episode's first
        return True

    def _announced(self, now_ns: int) -> bool:
        """Whether the wait for the answer is over: answered, refused or timed out (the last two counted)."""
        future, asked_ns, _ = self._announcing
        if future.done():
            result = future.result()
            if result is None or not result.success:
                self._unannounced(f"refused: {getattr(result, 'message', 'no answer')}")
            return True
        if now_ns - asked_ns > ANNOUNCE_TIMEOUT_S * 1e9:
            self._unannounced(f"no answer in {ANNOUNCE_TIMEOUT_S:g} s")
            return True
        return False

    def _unannounced(self, why: str) -> None:
        self.unannounced += 1
        self.get_logger().warning(f"the new episode could not be announced on {self._reset.srv_name} ({why}): its "
                                  "memory and the last chunk run on into it", throttle_duration_sec=5.0)

    @property
    def episodes(self) -> int:
        return self.tally.count

    @property
    def successes(self) -> int:
        return self.tally.successes

    def status(self) -> str:
        """The part of ``vla-edge run``'s status line that is the world's."""
        return f"sim {self.successes}/{self.episodes} reached"

    def summary(self) -> dict[str, Any]:
        """The world's episodes for ``vla-edge run``'s summary."""
        return {"task": self.spec.name, "episodes": self.episodes, "successes": self.successes,
                "mean_time_to_reach_s": self.tally.mean_to_success(), "unannounced_episodes": self.unannounced}

    def describe(self) -> str:
        """For the banner."""
        return f"simulated robot, {self.spec.name}"

    def odometry_message(self, stamp: Any) -> Odometry:
        """The robot's odometry now (``CueReachEnv.odometry``) as nav_msgs/Odometry stamped ``stamp``."""
        x, y, yaw, vx, vy, wz = (float(v) for v in self.env.odometry())
        msg = Odometry(header=Header(stamp=stamp, frame_id="odom"), child_frame_id="base_link")
        msg.pose.pose.position.x, msg.pose.pose.position.y = x, y
        qx, qy, qz, qw = yaw_quaternion(yaw)
        msg.pose.pose.orientation = Quaternion(x=qx, y=qy, z=qz, w=qw)
        msg.twist.twist.linear.x, msg.twist.twist.linear.y, msg.twist.twist.angular.z = vx, vy, wz
        return msg

    def _new_instruction(self) -> None:
        if self._instructions is not None:
            self.instruction, self._told = instruction_of(self.instructions, self.env, self.seed), False

    def _tell(self) -> None:
        """Send this episode's instruction once a subscriber listens (lang-reach only)."""
        if self._instructions is not None and not self._told and self._instructions.get_subscription_count():
            self._instructions.publish(String(data=self.instruction))
            self._told = True
