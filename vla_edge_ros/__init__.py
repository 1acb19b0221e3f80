"""vla_edge_ros: a Vision-Language-Action transformer for ROS 2 robots under a hard control deadline.

Everything in this package except ``vla_edge_ros.nodes`` is plain Python that never imports rclpy.
"""

__version__ = "0.1.0"
