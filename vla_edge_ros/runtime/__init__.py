"""The live core without ROS: frame hand-off, admission gate, reasoning cycle, action output, clocks, loading."""
