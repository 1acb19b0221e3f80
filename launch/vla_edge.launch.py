"""ros2 launch vla_edge_ros vla_edge.launch.py [config:=FILE] [namespace:=NS] [image_topic:=T] [use_sim_time:=true]
[start_state:=active|inactive|unconfigured]

Starts the bringup process: camera subscriber, reasoning and action publisher nodes in one process
(they share the frame buffer and the action slot in memory), configured by one YAML file, which
bringup reads itself (relative paths in it resolve against its directory, then this package's share
directory). Topic names are relative, so ``namespace`` puts every topic of one robot under it.
Reasoning and the action publisher are managed nodes, brought to ``start_state`` by bringup itself
(one process holds three nodes, so launch_ros's LifecycleNode, which manages one node per process,
does not fit): active by default; inactive loads and checks the model and commands nothing until
`ros2 lifecycle set` activates them; unconfigured leaves them to a lifecycle manager.

If bringup exits, the launch ends with it: cleanly after a clean exit (SIGINT), with an error and a
non-zero code after any other (a bad config, a missing model, a crash, a kill). On Ctrl-C, launch
(unless run non-interactively) signals its processes nothing for sigterm_timeout (5 s), taking the
terminal to have interrupted them already; a SIGINT that reached the launch alone (a `kill`, a
supervisor, a test) would keep the robot driven until launch's SIGTERM. This file forwards the SIGINT
to bringup, which takes a second one as the same request.
"""

import os
import signal
from collections.abc import Callable

from ament_index_python.packages import get_package_share_directory
from launch import LaunchContext, LaunchDescription
from launch.actions import DeclareLaunchArgument, EmitEvent, RegisterEventHandler, Shutdown
from launch.event_handlers import OnShutdown
from launch.events import matches_action
from launch.events.process import ProcessExited, SignalProcess
from launch.substitutions import LaunchConfiguration, PythonExpression
from launch_ros.actions import Node


def end_with_bringup(event: ProcessExited, context) -> list:
    """A clean exit ends the launch; any other exit ends it with an error, so launch returns non-zero."""
    if event.returncode != 0:
        raise RuntimeError(f"bringup exited with code {event.returncode}")
    return [Shutdown(reason="bringup exited")]


def forward_interrupt(bringup: Node) -> Callable[[Shutdown, LaunchContext], list]:
    """An OnShutdown callback that sends bringup the SIGINT launch itself holds back (see the module doc)."""
    def on_shutdown(event, context: LaunchContext) -> list:
        if not event.due_to_sigint or context.noninteractive or bringup.process_details is None:
            return []  # launch signals bringup itself, or there is no process (yet) to signal
        return [EmitEvent(event=SignalProcess(signal_number=signal.SIGINT, process_matcher=matches_action(bringup)))]
    return on_shutdown


def generate_launch_description() -> LaunchDescription:
    default_config = os.path.join(get_package_share_directory("vla_edge_ros"), "config", "default.yaml")
    config = LaunchConfiguration("config")
    image_topic = LaunchConfiguration("image_topic")
    bringup = Node(
        package="vla_edge_ros",
        executable="bringup",
        namespace=LaunchConfiguration("namespace"),
        arguments=["--config", config, "--start-state", LaunchConfiguration("start_state")],
        parameters=[{"use_sim_time": PythonExpression(["'", LaunchConfiguration("use_sim_time"), "' == 'true'"])}],
        remappings=[("camera/image_raw", image_topic),
                    ("camera/image_raw/compressed", [image_topic, "/compressed"])],
        output="screen",
        on_exit=end_with_bringup,
    )
    return LaunchDescription([
        DeclareLaunchArgument("config", default_value=default_config, description="vla_edge_ros YAML config"),
        DeclareLaunchArgument("namespace", default_value="", description="namespace of the three nodes"),
        DeclareLaunchArgument("image_topic", default_value="camera/image_raw",
                              description="camera topic (sensor_msgs/Image; CompressedImage on <topic>/compressed)"),
        DeclareLaunchArgument("use_sim_time", default_value="false", description="use /clock (bag replay, simulators)"),
        DeclareLaunchArgument("start_state", default_value="active", choices=["active", "inactive", "unconfigured"],
                              description="state of the managed nodes (reasoning, action_publisher) at start"),
        bringup,
        RegisterEventHandler(OnShutdown(on_shutdown=forward_interrupt(bringup))),
    ])
