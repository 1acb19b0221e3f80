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
non-zero code after any other (a bad config, a missing model, a crash, a kill).
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, Shutdown
from launch.events.process import ProcessExited
from launch.substitutions import LaunchConfiguration, PythonExpression
from launch_ros.actions import Node


def end_with_bringup(event: ProcessExited, context) -> list:
    """A clean exit ends the launch; any other exit ends it with an error, so launch returns non-zero."""
    if event.returncode != 0:
        raise RuntimeError(f"bringup exited with code {event.returncode}")
    return [Shutdown(reason="bringup exited")]


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
    ])
