"""Config of the ``mujoco_arm`` LeRobot robot type (a simulated arm, no hardware, no ROS).

Registered in LeRobot's ``RobotConfig`` registry, so ``--robot.type mujoco_arm``
works wherever LeRobot robot types do; LeRobot's ``make_robot_from_config``
finds :class:`hardware.mujoco_robot.MujocoRobot` by its naming convention.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lerobot.robots import RobotConfig


@RobotConfig.register_subclass("mujoco_arm")
@dataclass
class MujocoRobotConfig(RobotConfig):
    """A MuJoCo arm stepped in real time, seen through LeRobot's ``Robot`` interface."""

    model: str = "so101"
    """Packaged model (``so101``, ``panda``) or an MJCF path."""
    camera_names: list[str] = field(default_factory=lambda: ["front"])
    """Model cameras to render into the observation (empty: none)."""
    image_height: int = 64
    """Rendered frame height in pixels."""
    image_width: int = 64
    """Rendered frame width in pixels."""
