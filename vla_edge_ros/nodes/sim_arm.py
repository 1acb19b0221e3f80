"""Meta-World's arm as a robot on the graph: its camera on the image topic, its state on the state topic, its
controller on the command topic.

`vla-edge run --sim metaworld/<task>-v3` starts it in place of the synthetic camera, so the loop closes through
DDS as on a robot, with what ``vla-edge evaluate`` feeds the arm offline (``tools/arm_world.py``): frames of the
``corner2`` camera, upright; the 4-D state as sensor_msgs/JointState naming the joints x, y, z, gripper
(``worlds.metaworld.STATE``, the one list evaluate and the config name them by), stamped as the frame it was
seen with, published just before it; the 4-D action (dx, dy, dz, grip) taken from a Float32MultiArray, clipped
by the environment as Meta-World clips it. A command older than ``command_timeout_ms`` is replaced by the zero
action (the hand's target stays, no gripper effort): the arm's own safe stop, as the 2-D world's robot has one.
So is an empty array, the action publisher's stop before it knows the action's size. A command of another
size than 4 is dropped and counted; the arm keeps its last one.

Rate. The arm steps at 80 Hz of wall time, one environment step (12.5 ms of simulated time) per period, as in
evaluation, and ``vla-edge run`` sets the action publisher to 80 Hz too (``arm_observation``), so a chunk's
actions are one step apart live as offline. The camera is slower: a frame every ``ARM_RATE_HZ /
camera_rate_hz`` steps, 20 Hz by default (every 4th step), as in evaluation. A 96 x 96 frame costs 20 to 40 ms
of a CPU core (docs/metaworld.md), so 80 frames a second would need two cores on their own. 20 Hz costs about
half a core, and still gives each chunk of 8 actions (100 ms) two frames; with rtc the next chunk is wanted
after half of one (4 steps, 50 ms): one frame.

Threads. The arm steps on a thread of its own, as a simulator runs beside a robot's software rather than in
its executor: a frame that takes 20 to 40 ms to render would otherwise hold up the action publisher's 12.5 ms
timer on the one executor thread (``bringup.py``). After a slow step the arm catches up (physics alone is about
1 ms a step) as long as it is no more than one camera period behind; beyond that it drops the lost time and
counts a late restart instead of rushing through a burst of steps on stale commands.

Episodes. The first starts on ``start`` (the pipeline calls it once the nodes are up, so the model's loading
does not eat the first episode), from seed ``seed``; each ends at success or at the task's step limit, is
logged and counted, and the next starts from the next seed, as the 2-D world's robot does. Between two, the
arm jumps to a new layout, which no robot does, so it says so first: with ``reset_service`` it calls the
reasoning node's ``~/reset_episode`` and waits for the answer before showing the new layout. Each episode then
starts as ``vla-edge evaluate`` starts one: the memory from the prompt, no chunk of the last layout executed or
blended in, no frame of it read. Unannounced, the old episode's memory and chunk ran on into the new one and
sent the arm astray: drawer-open succeeded on 1 of 3 episodes live, the first, against 1.00 offline (an episode
that could not be announced is counted).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float32MultiArray, Header
from std_srvs.srv import Trigger

from ..tools.arm_world import ARM_RATE_HZ, CAMERA_RATE_HZ, ArmTask, arm_command, camera_period_steps
from ..worlds.metaworld import ACTION, STATE, MetaWorldEnv
from .sim_world import ANNOUNCE_TIMEOUT_S, Episodes
from .synthetic_camera import image_message

ARM_COMMAND_TYPE = "float32_multi_array"


class SimArmNode(Node):
    """Runs ``task`` episodes back to back on a thread of its own, driven by the 4-D actions of the command topic."""

    def __init__(self, task: ArmTask, *, image_topic: str, command_topic: str, command_type: str, state_topic: str,
                 camera_rate_hz: float = CAMERA_RATE_HZ, seed: int = 0, command_timeout_ms: float = 200.0,
                 reset_service: str | None = None, **node_kwargs: Any) -> None:
        """Refuses (ValueError, one line) another command type, a camera rate that does not divide 80 Hz, and a
        machine without Meta-World or OSMesa (``WorldUnavailable``), before the node joins the graph."""
        if command_type != ARM_COMMAND_TYPE:
            raise ValueError(f"the simulated arm takes its {len(ACTION)}-D action as a Float32MultiArray "
                             f"(command_type {ARM_COMMAND_TYPE}), not {command_type!r}")
        task.validate()
        self.every = camera_period_steps(camera_rate_hz)
        self.task, self.seed = task, seed
        self.env = MetaWorldEnv(task.arm, seed)  # WorldUnavailable here: nothing of the node exists yet
        super().__init__("sim_arm", **node_kwargs)
        self.tally = Episodes()  # to_success: steps to success
        self.commands = self.malformed_commands = 0
        self.steps = self.stale_steps = self.frames = self.late_restarts = self.unannounced = 0
        self.failure: str | None = None  # why the arm stopped stepping, if it did
        self._timeout_ns = int(command_timeout_ms * 1e6)
        self._command: tuple[np.ndarray, int] | None = None  # the newest action and when it came (node clock)
        self._image = self.create_publisher(Image, image_topic, qos_profile_sensor_data)
        self._state = self.create_publisher(JointState, state_topic, qos_profile_sensor_data)
        self.create_subscription(Float32MultiArray, command_topic, self._take, 10)
        self._reset = None if reset_service is None else self.create_client(Trigger, reset_service)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started: float | None = None  # monotonic time of the first step

    @property
    def camera_rate_hz(self) -> float:
        return ARM_RATE_HZ / self.every

    def describe(self) -> str:
        """For the banner: which arm, seeing what, told what."""
        return (f"simulated arm, {self.task.name} \"{self.task.description}\", {self.task.camera} "
                f"{self.task.width}x{self.task.height} at {self.camera_rate_hz:g} Hz, steps at {ARM_RATE_HZ:g} Hz")

    def start(self) -> None:
        """Start stepping: the first episode's first frame now, then a step every 12.5 ms."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sim_arm", daemon=True)
            self._thread.start()

    def _take(self, message: Float32MultiArray) -> None:
        if len(message.data) not in (0, len(ACTION)):  # not (dx, dy, dz, grip) nor a stop: the last command stays
            self.malformed_commands += 1
            self.get_logger().warning(f"dropped a command of {len(message.data)} values (need {', '.join(ACTION)}); "
                                      f"{self.malformed_commands} so far", throttle_duration_sec=5.0)
            return
        self._command = (arm_command(message.data), self.get_clock().now().nanoseconds)
        self.commands += 1

    def _current(self) -> np.ndarray:
        """The newest command while fresh, else the zero action (the arm's safe stop)."""
        command = self._command
        if command is not None and self.get_clock().now().nanoseconds - command[1] <= self._timeout_ns:
            return command[0]
        self.stale_steps += 1
        return np.zeros(len(ACTION))

    def _run(self) -> None:
        period = 1.0 / ARM_RATE_HZ
        try:
            self._publish()
            self._started = due = time.monotonic()
            while not self._stop.is_set():
                due += period
                late = time.monotonic() - due
                if late < 0:
                    self._stop.wait(-late)
                elif late > self.every * period:  # more than a camera period behind: no burst of stale steps
                    self.late_restarts += 1
                    due = time.monotonic()
                if not self._stop.is_set():
                    self._step()
        except Exception as exc:  # noqa: BLE001 - the arm stops; the camera's diagnostics then say so
            self.failure = f"{type(exc).__name__}: {exc}"
            self.get_logger().error(f"the simulated arm stopped: {self.failure}")

    def _step(self) -> None:
        outcome = self.env.step(self._current(), render=False)
        self.steps += 1
        if not outcome.done:
            if outcome.steps % self.every == 0:
                self._publish()
            return
        so_far = self.tally.end(outcome.success, outcome.steps)
        self.get_logger().info(f"{self.task.task} episode {self.tally.count} (seed {self.seed}): "
                               f"{'succeeded' if outcome.success else 'failed'} after {outcome.steps} steps "
                               f"({outcome.time_s:.2f} s simulated); {so_far}")
        self._announce()
        self.seed += 1
        self.env.reset(self.seed)
        self._publish()

    def _announce(self) -> None:
        """Ask for a new episode (``reset_service``) and wait for the answer, before the new layout is shown; one
        that cannot be asked or is refused is counted and logged, and the arm goes on."""
        if self._reset is None:
            return
        answered = threading.Event()
        if self._reset.service_is_ready():
            future = self._reset.call_async(Trigger.Request())
            future.add_done_callback(lambda _: answered.set())
            if answered.wait(ANNOUNCE_TIMEOUT_S) and future.result() is not None and future.result().success:
                self._command = None  # the old layout's: the arm holds still until the new episode's first
                return
        self.unannounced += 1
        self.get_logger().warning(f"the new episode could not be announced on {self._reset.srv_name}: its memory "
                                  f"and the last chunk run on into it", throttle_duration_sec=5.0)

    def _publish(self) -> None:
        """The state, then the frame seen in it, with one stamp: the arm was there when it was seen."""
        frame = self.env.frame()
        stamp = self.get_clock().now().to_msg()
        self._state.publish(self.state_message(stamp))
        self._image.publish(image_message(frame, Header(stamp=stamp, frame_id="camera")))
        self.frames += 1

    def state_message(self, stamp: Any) -> JointState:
        """The arm's state now as sensor_msgs/JointState: positions of the joints x, y, z, gripper."""
        return JointState(header=Header(stamp=stamp, frame_id="world"), name=list(STATE),
                          position=[float(v) for v in self.env.state])

    def step_rate_hz(self) -> float | None:
        """Steps per wall second since the first (None before it)."""
        if self._started is None:
            return None
        elapsed = time.monotonic() - self._started
        return self.steps / elapsed if elapsed > 0 else None

    def status(self) -> str:
        """The part of ``vla-edge run``'s status line that is the arm's."""
        rate = self.step_rate_hz()
        stale = self.stale_steps / self.steps if self.steps else 0.0
        return (f"arm {self.tally.successes}/{self.tally.count} succeeded, {self.steps} steps at "
                f"{'-' if rate is None else f'{rate:.1f}'}/s, stale commands {stale:.0%}"
                + (f", STOPPED: {self.failure}" if self.failure else ""))

    def summary(self) -> dict[str, Any]:
        """The arm's figures for ``vla-edge run``'s summary."""
        return {"task": self.task.name, "description": self.task.description, "episodes": self.tally.count,
                "successes": self.tally.successes, "mean_steps_to_success": self.tally.mean_to_success(),
                "steps": self.steps, "step_rate_hz": self.step_rate_hz(),
                "camera_rate_hz": self.camera_rate_hz, "frames": self.frames, "commands": self.commands,
                "malformed_commands": self.malformed_commands, "stale_steps": self.stale_steps,
                "late_restarts": self.late_restarts, "unannounced_episodes": self.unannounced, "failure": self.failure}

    def destroy_node(self) -> None:
        """Stop stepping (the thread publishes through this node), then free the environment's GL context."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self.env.close()
        super().destroy_node()
