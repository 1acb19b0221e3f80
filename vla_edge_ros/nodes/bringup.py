"""One process, three nodes: camera subscriber -> reasoning -> action publisher.

rclpy has no intra-process transport, so the camera and reasoning nodes share the frame buffer (and
reasoning and the publisher share the action slot) as plain objects in one process. The reasoning
loop runs on its own thread; every ROS callback (image decode, publisher timer, diagnostics, lifecycle
and parameter services) runs on one SingleThreadedExecutor. Measured here, rclpy's
MultiThreadedExecutor busy-waits while a mutually exclusive callback group is busy and holds the GIL
while doing so: on a 2-core machine it starved the reasoning thread (about 1 run in 4 fell to ~2
actions per second). The callbacks take well under a millisecond each, so one executor thread is
enough. Started by `ros2 run vla_edge_ros bringup --config FILE` (what the launch file does) or by
`vla-edge run`, which can add a synthetic camera publishing over DDS like a real driver, the 2-D
world as a simulated robot, or Meta-World's arm as a simulated arm (closed loop; the arm steps on a
thread of its own: ``sim_arm.py``).

Reasoning and the action publisher are managed (lifecycle) nodes, so a robot's bringup can hold them
loaded but idle and re-activate them after a fault without restarting the process; the camera
subscriber stays a plain node: it commands nothing, keeps the buffer on the newest frame (so an
activated reasoning acts on the current view at once) and keeps telling on /diagnostics whether the
camera is alive while the robot is idle. The process brings the managed nodes to ``start_state``
(active by default): configure both, then activate reasoning and the publisher, in that order. Going
down runs the other way: deactivate the publisher first, so that the robot's explicit stop is the
first thing that happens, then reasoning (which may still save the episode memory), then shut both
down (the publisher waits at most a second for reliable subscribers to acknowledge the stop).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import rclpy
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter

from ..config import USER_ERRORS, ObservationKnobs, Settings, load_settings
from ..model.config import load_model_config
from ..runtime.action_slot import ActionSlot
from ..runtime.observation import SIM_ODOMETRY_TOPIC, observation_buffer, simulated_robot_observation
from ..runtime.stop_signals import StopSignals
from ..tools.arm_world import (ARM_STATE_TOPIC, CAMERA_RATE_HZ, PREFIX, ArmTask, arm_observation, arm_tasks,
                               is_arm_task)
from ..worlds.synthetic import RATE_HZ as SYNTHETIC_RATE_HZ
from .action_publisher import ActionPublisher
from .camera_subscriber import CameraSubscriber
from .managed_node import TransitionError
from .reasoning import NODE_NAME as REASONING_NODE_NAME
from .reasoning import ReasoningNode
from .ros_session import ros_session
from .sim_arm import SimArmNode
from .sim_world import SimWorldNode
from .synthetic_camera import SyntheticCameraPublisher

START_STATES = ("active", "inactive", "unconfigured")
"""Where the process takes the managed nodes at start: acting, loaded but idle, or waiting for a lifecycle manager."""


class Pipeline:
    """The nodes of one process, the objects they share, and their executor."""

    def __init__(self, settings: Settings, *, context: Context | None = None, namespace: str | None = None,
                 synthetic_camera: bool = False, camera_rate_hz: float | None = None, use_sim_time: bool = False,
                 sim_task: str | ArmTask | None = None, sim_instructions: tuple[str, ...] = (),
                 start_state: str = "active") -> None:
        """``namespace`` (else the one ``--ros-args -r __ns:=`` gives) holds every node and relative topic. A
        configure that fails at start (a bad model, a plan over budget) raises TransitionError, with no node left.
        With ``sim_task`` the simulated robot is the source: its camera, and its odometry for a checkpoint that
        reads a state (``simulated_robot_observation``: the state topic and type are set here, not by the user);
        ``sim_instructions``: lang-reach's instruction templates (none: the world's own phrasing). A Meta-World
        task (``metaworld/<task>``, or an ``ArmTask`` for another camera or frame size) is the simulated arm
        instead: its frames as the buffer's, its JointState, its description as the instruction, its 4-D action
        at its step rate (``arm_observation``, as evaluate sets them). ``camera_rate_hz``: the synthetic
        camera's (default 30 Hz) or the arm's (default 20 Hz)."""
        if start_state not in START_STATES:
            raise ValueError(f"start state must be one of {', '.join(START_STATES)}, got {start_state!r}")
        arm = _arm_task(sim_task)
        if arm is not None:
            config = load_model_config(settings["reasoning"]["model_dir"])
            settings = arm_observation(settings, config, arm, f"run --sim {arm.name}").replace(
                "camera_subscriber", {"frame_height": arm.height, "frame_width": arm.width})
        elif sim_task is not None:
            state = load_model_config(settings["reasoning"]["model_dir"]).state
            settings = simulated_robot_observation(settings, state, f"run --sim {sim_task}")
        self.settings = settings  # as the nodes were given them
        where = {"context": context} if namespace is None else {"context": context, "namespace": namespace}
        camera = settings["camera_subscriber"]
        publisher = settings["action_publisher"]
        self.sim: SimWorldNode | SimArmNode | None = None
        if arm is not None:  # first: a machine without Meta-World or OSMesa is refused before anything loads
            self.sim = SimArmNode(arm, image_topic=camera["image_topic"], command_topic=publisher["command_topic"],
                                  command_type=publisher["command_type"], state_topic=camera["state_topic"] or
                                  ARM_STATE_TOPIC, camera_rate_hz=camera_rate_hz or CAMERA_RATE_HZ,
                                  command_timeout_ms=publisher["action_timeout_ms"],
                                  reset_service=f"{REASONING_NODE_NAME}/reset_episode", **where)
        try:
            self._build(settings, where, synthetic_camera, camera_rate_hz or SYNTHETIC_RATE_HZ, sim_task,
                        sim_instructions, use_sim_time)
        except BaseException:
            if isinstance(self.sim, SimArmNode):
                self.sim.destroy_node()
            raise
        try:
            for label in {"unconfigured": (), "inactive": ("configure",),
                          "active": ("configure", "activate")}[start_state]:
                for node in self.managed:
                    node.transition(label)
        except BaseException:  # a failed transition, or a signal during one: nothing stays up
            self.shutdown()
            raise
        if isinstance(self.sim, SimArmNode):  # its first episode starts now, not while the model loaded
            self.sim.start()

    def _build(self, settings: Settings, where: dict, synthetic_camera: bool, camera_rate_hz: float,
               sim_task: str | ArmTask | None, sim_instructions: tuple[str, ...], use_sim_time: bool) -> None:
        """The nodes, the objects they share and the executor (the simulated arm, if any, exists already)."""
        camera = settings["camera_subscriber"]
        self.buffer = observation_buffer(camera["frame_height"], camera["frame_width"], ObservationKnobs.of(camera))
        self.slot = ActionSlot()
        self.reasoning = ReasoningNode(self.buffer, self.slot, settings, **where)
        self.camera = CameraSubscriber(self.buffer, camera, on_frame=self.reasoning.debug_image.add_frame, **where)
        self.publisher = ActionPublisher(self.slot, settings["action_publisher"], dof=self.reasoning.action_dof,
                                         **where)
        self.reasoning.horizon = self.publisher.horizon  # the gate plans chunks on what the timeline holds
        self.managed = (self.reasoning, self.publisher)  # bringup order; going down runs the other way
        self.nodes = [self.camera, self.reasoning, self.publisher]
        if synthetic_camera:
            self.nodes.append(SyntheticCameraPublisher(
                topic=camera["image_topic"], rate_hz=camera_rate_hz, height=camera["frame_height"],
                width=camera["frame_width"], **where))
        if self.sim is not None:  # the simulated arm (nodes/sim_arm.py)
            self.nodes.append(self.sim)
        elif sim_task is not None:  # the simulated robot: camera out, commands in (nodes/sim_world.py)
            publisher = settings["action_publisher"]
            self.sim = SimWorldNode(sim_task, image_topic=camera["image_topic"], command_topic=publisher["command_topic"],
                                    command_type=publisher["command_type"],
                                    instruction_topic=settings["reasoning"]["instruction_topic"],
                                    odometry_topic=camera["state_topic"] or SIM_ODOMETRY_TOPIC,
                                    instructions=sim_instructions, command_timeout_ms=publisher["action_timeout_ms"],
                                    reset_service=f"{REASONING_NODE_NAME}/reset_episode", **where)
            self.nodes.append(self.sim)
        if use_sim_time:  # stamps and the publisher's watchdog follow /clock (a bag played with --clock)
            for node in self.nodes:
                node.set_parameters([Parameter("use_sim_time", Parameter.Type.BOOL, True)])
        self.executor = SingleThreadedExecutor(context=where["context"])
        for node in self.nodes:
            self.executor.add_node(node)

    def run(self, duration_s: float | None = None, every_second: Callable[[], None] | None = None,
            stop: StopSignals | None = None) -> None:
        """Spin until ``duration_s`` has passed, ``stop`` reports SIGINT or SIGTERM, or the context shuts down."""
        start = last = time.monotonic()
        if stop is not None:
            stop.running = True
        try:
            while self.executor.context.ok() and (stop is None or stop.requested is None):
                try:
                    self.executor.spin_once(timeout_sec=0.05)
                except Exception:
                    # The context can shut down between ok() and the wait (another thread, a launch
                    # shutting the process down): rclpy then raises from its wait set. That is a
                    # shutdown, not a failure.
                    if self.executor.context.ok():
                        raise
                    break
                now = time.monotonic()
                if every_second is not None and now - last >= 1.0:
                    last = now
                    every_second()
                if duration_s is not None and now - start >= duration_s:
                    break
        finally:
            if stop is not None:
                stop.running = False

    def stop(self) -> None:
        """Deactivate whichever managed node is active, the publisher first: the robot gets one explicit stop,
        then reasoning stops (the nodes stay up, inactive)."""
        self._transition_all("deactivate", ("active",))

    def shutdown(self) -> None:
        """``stop``, shut the managed nodes down (reasoning frees its engine; the publisher waits for the stop
        to be acknowledged), then take every node down."""
        self.stop()
        self._transition_all("shutdown", ("inactive", "unconfigured"))
        self._destroy()

    def _transition_all(self, label: str, states: tuple[str, ...]) -> None:
        """Take every managed node in one of ``states`` through ``label``, in going-down order; a failure is
        logged and the others still go (a node that cannot stop must not keep the robot's stop from going out)."""
        if not self.executor.context.ok():  # nothing can be published any more, not even a stop
            return
        for node in reversed(self.managed):
            if node.state in states:
                try:
                    node.transition(label)
                except TransitionError as exc:
                    node.get_logger().error(f"going down: {label} failed: {exc}")

    def _destroy(self) -> None:
        self.executor.shutdown()
        for node in self.nodes:
            node.destroy_node()


def _arm_task(sim_task: str | ArmTask | None) -> ArmTask | None:
    """The Meta-World task ``sim_task`` names (None: a 2-D world task, or no simulation)."""
    if isinstance(sim_task, ArmTask):
        return sim_task
    if sim_task is None or not is_arm_task(sim_task):
        return None
    tasks = arm_tasks(sim_task)  # ValueError for an unknown name
    if len(tasks) != 1:
        raise ValueError(f"a simulated arm runs one Meta-World task ({PREFIX}<task>), not {sim_task}")
    return tasks[0]


def run(args_with_ros: list[str], stop: StopSignals) -> int:
    """`bringup --config FILE [--ros-args ...]` (entry.py installed ``stop``). A bad configuration or model is
    one line on stderr and exit code 2 (the launch file's on_exit then ends the launch)."""
    parser = argparse.ArgumentParser(prog="bringup", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, help="vla_edge_ros YAML config (default: built-in defaults)")
    parser.add_argument("--start-state", choices=START_STATES, default="active",
                        help="where the managed nodes (reasoning, action_publisher) start: active (default), inactive "
                             "(model loaded, no commands) or unconfigured (for a lifecycle manager)")
    args = parser.parse_args(rclpy.utilities.remove_ros_args(args_with_ros)[1:])
    try:
        settings = load_settings(args.config)
        with ros_session(args_with_ros):
            pipeline = Pipeline(settings, start_state=args.start_state)
            try:
                pipeline.run(stop=stop)
            finally:
                pipeline.shutdown()
    except USER_ERRORS as exc:
        print(f"bringup: error: {exc}", file=sys.stderr)
        return 2
    return 0
