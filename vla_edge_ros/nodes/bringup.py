"""One process, three nodes: camera subscriber -> reasoning -> action publisher.

rclpy has no intra-process transport, so the camera and reasoning nodes share the frame buffer (and
reasoning and the publisher share the action slot) as plain objects in one process. The reasoning
loop runs on its own thread; every ROS callback (image decode, publisher timer, diagnostics) runs on
one SingleThreadedExecutor. Measured here, rclpy's MultiThreadedExecutor busy-waits while a
mutually exclusive callback group is busy and holds the GIL while doing so: on a 2-core machine it
starved the reasoning thread (about 1 run in 4 fell to ~2 actions per second). The callbacks take
well under a millisecond each, so one executor thread is enough. Started by `ros2 run vla_edge_ros
bringup --config FILE` (what the launch file does) or by `vla-edge run`, which can add a synthetic
camera publishing over DDS like a real driver, or the 2-D world as a simulated robot (closed loop).
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

from ..config import USER_ERRORS, Settings, load_settings
from ..runtime.action_slot import ActionSlot
from ..runtime.frame_buffer import FrameBuffer
from ..runtime.loader import load_engine
from ..runtime.stop_signals import StopSignals
from .action_publisher import ActionPublisher
from .camera_subscriber import CameraSubscriber
from .reasoning import ReasoningNode
from .ros_session import ros_session
from .sim_world import SimWorldNode
from .synthetic_camera import SyntheticCameraPublisher


class Pipeline:
    """The nodes of one process, the objects they share, and their executor."""

    def __init__(self, settings: Settings, *, context: Context | None = None, namespace: str | None = None,
                 synthetic_camera: bool = False, camera_rate_hz: float = 30.0, use_sim_time: bool = False,
                 sim_task: str | None = None) -> None:
        """``namespace`` (else the one ``--ros-args -r __ns:=`` gives) holds every node and relative topic."""
        self.loaded = load_engine(settings)  # refuses an over-budget config before any node exists
        engine, self.plan = self.loaded.engine, self.loaded.plan
        where = {"context": context} if namespace is None else {"context": context, "namespace": namespace}
        camera = settings["camera_subscriber"]
        self.buffer = FrameBuffer(camera["frame_height"], camera["frame_width"])
        self.slot = ActionSlot()
        self.camera = CameraSubscriber(self.buffer, camera, **where)
        self.reasoning = ReasoningNode(engine, self.buffer, self.slot, settings["reasoning"], store=self.loaded.store,
                                       **where)
        self.publisher = ActionPublisher(self.slot, settings["action_publisher"], dof=engine.config.action.dof,
                                         **where)
        self.nodes = [self.camera, self.reasoning, self.publisher]
        if synthetic_camera:
            self.nodes.append(SyntheticCameraPublisher(
                topic=camera["image_topic"], rate_hz=camera_rate_hz, height=camera["frame_height"],
                width=camera["frame_width"], **where))
        self.sim: SimWorldNode | None = None
        if sim_task is not None:  # the simulated robot: camera out, commands in (nodes/sim_world.py)
            publisher = settings["action_publisher"]
            self.sim = SimWorldNode(sim_task, image_topic=camera["image_topic"], command_topic=publisher["command_topic"],
                                    command_type=publisher["command_type"],
                                    command_timeout_ms=publisher["action_timeout_ms"], **where)
            self.nodes.append(self.sim)
        if use_sim_time:  # stamps and the publisher's watchdog follow /clock (a bag played with --clock)
            for node in self.nodes:
                node.set_parameters([Parameter("use_sim_time", Parameter.Type.BOOL, True)])
        self._stopped = False
        self.executor = SingleThreadedExecutor(context=context)
        for node in self.nodes:
            self.executor.add_node(node)

    def run(self, duration_s: float | None = None, every_second: Callable[[], None] | None = None,
            stop: StopSignals | None = None) -> None:
        """Spin until ``duration_s`` has passed, ``stop`` reports SIGINT or SIGTERM, or the context shuts down."""
        self.reasoning.start()
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
        """Stop reasoning and send the robot one explicit stop command (once; the nodes stay up)."""
        if self._stopped:
            return
        self._stopped = True
        self.reasoning.stop()
        if self.executor.context.ok():
            self.publisher.publish_stop()

    def shutdown(self) -> None:
        """``stop``, then take the nodes down."""
        self.stop()
        self.executor.shutdown()
        for node in self.nodes:
            node.destroy_node()


def run(args_with_ros: list[str], stop: StopSignals) -> int:
    """`bringup --config FILE [--ros-args ...]` (entry.py installed ``stop``). A bad configuration or model is
    one line on stderr and exit code 2 (the launch file's on_exit then ends the launch)."""
    parser = argparse.ArgumentParser(prog="bringup", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, help="vla_edge_ros YAML config (default: built-in defaults)")
    args = parser.parse_args(rclpy.utilities.remove_ros_args(args_with_ros)[1:])
    try:
        settings = load_settings(args.config)
        with ros_session(args_with_ros):
            pipeline = Pipeline(settings)
            try:
                pipeline.run(stop=stop)
            finally:
                pipeline.shutdown()
    except USER_ERRORS as exc:
        print(f"bringup: error: {exc}", file=sys.stderr)
        return 2
    return 0
