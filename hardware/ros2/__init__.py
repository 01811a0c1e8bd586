"""The ROS 2 transport: bridge adapter, operator inputs, and a simulated arm node.

Importing this package (and :mod:`hardware.ros2.config`) does not import rclpy;
the modules that talk to ROS import it when used and raise an ``ImportError``
with the install command when it is missing.
"""
