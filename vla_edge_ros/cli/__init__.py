"""``vla-edge``: the package's command line (works without a ROS install)."""

from .main import main

__all__ = ["main"]
