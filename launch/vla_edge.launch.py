"""ros2 launch vla_edge_ros vla_edge.launch.py [config:=FILE] [frames:=N]

Starts the package's engine process (`vla-edge run`) with a YAML config, on the synthetic camera.
The ROS 2 nodes (camera subscriber, reasoning, action publisher) are not in the package yet; when
they land, this file starts them instead.
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node


def generate_launch_description() -> LaunchDescription:
    default_config = os.path.join(get_package_share_directory("vla_edge_ros"), "config", "default.yaml")
    return LaunchDescription([
        DeclareLaunchArgument("config", default_value=default_config, description="vla_edge_ros YAML config"),
        DeclareLaunchArgument("frames", default_value="300", description="synthetic frames to run"),
        Node(
            package="vla_edge_ros",
            executable="vla-edge",
            name="vla_edge",
            arguments=["run", "--config", LaunchConfiguration("config"), "--frames", LaunchConfiguration("frames")],
            output="screen",
        ),
    ])
