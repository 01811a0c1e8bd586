"""QoS and command-type settings of the ROS 2 transport (standard library only, no rclpy, no LeRobot)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Reliability(str, enum.Enum):
    """DDS reliability."""

    RELIABLE = "reliable"
    BEST_EFFORT = "best_effort"


class Durability(str, enum.Enum):
    """DDS durability."""

    VOLATILE = "volatile"
    TRANSIENT_LOCAL = "transient_local"


class CommandType(str, enum.Enum):
    """What the arm's controller listens to."""

    TRAJECTORY = "trajectory"
    """``trajectory_msgs/JointTrajectory`` (joint_trajectory_controller)."""
    POSITION = "position"
    """``std_msgs/Float64MultiArray`` of positions in joint order (forward position controllers)."""


@dataclass
class QosConfig:
    """A QoS profile (history KEEP_LAST)."""

    reliability: Reliability = Reliability.RELIABLE
    """``reliable`` or ``best_effort`` (camera drivers often publish best effort)."""
    durability: Durability = Durability.VOLATILE
    """``volatile`` or ``transient_local``."""
    depth: int = 10
    """History depth."""

    def __post_init__(self) -> None:
        self.reliability = Reliability(self.reliability)
        self.durability = Durability(self.durability)
        if self.depth < 1:
            raise ValueError(f"qos.depth must be >= 1, got {self.depth}")
