"""Config of the ROS 2 transport (``--robot.type ros2``); importable without rclpy.

Registered in LeRobot's ``RobotConfig`` registry next to LeRobot's own robot
types, so one ``--robot.type`` flag picks either transport.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lerobot.robots import RobotConfig

from hardware.ros2.qos import CommandType, Durability, QosConfig, Reliability

__all__ = ["CommandType", "Durability", "QosConfig", "Reliability", "Ros2RobotConfig", "RosCameraConfig"]


@dataclass
class RosCameraConfig:
    """One camera topic."""

    topic: str = ""
    """``sensor_msgs/Image`` topic, or ``sensor_msgs/CompressedImage`` with ``compressed``."""
    compressed: bool = False
    """Subscribe ``sensor_msgs/CompressedImage`` (JPEG/PNG) instead of ``Image``."""
    width: int = 0
    """Frame width handed to the policy; frames of another size are resized."""
    height: int = 0
    """Frame height handed to the policy."""
    fps: int = 30
    """Nominal frame rate (informational; staleness uses ``safety.camera_timeout_s``)."""
    qos: QosConfig = field(default_factory=lambda: QosConfig(Reliability.BEST_EFFORT))
    """QoS of the subscription (best effort matches most camera drivers)."""


@RobotConfig.register_subclass("ros2")
@dataclass
class Ros2RobotConfig(RobotConfig):
    """An arm driven by ROS 2 controllers: joint states in, joint commands out."""

    joint_names: list[str] = field(default_factory=list)
    """Joints in command / ``observation.state`` order (JointState messages may list them in any order)."""
    joint_state_topic: str = "/joint_states"
    """``sensor_msgs/JointState`` topic."""
    command_topic: str = "/arm_controller/joint_trajectory"
    """Command topic (JointTrajectory or Float64MultiArray, per ``command_type``)."""
    command_type: CommandType = CommandType.TRAJECTORY
    """``trajectory`` or ``position``."""
    cameras: dict[str, RosCameraConfig] = field(default_factory=dict)
    """Camera name -> topic config; names become ``observation.images.<name>``."""
    position_lower: list[float] = field(default_factory=list)
    """The arm's joint lower limits (radians), used when ``safety.position_lower`` is empty."""
    position_upper: list[float] = field(default_factory=list)
    """The arm's joint upper limits (radians)."""
    state_qos: QosConfig = field(default_factory=QosConfig)
    """QoS of the joint-state subscription."""
    command_qos: QosConfig = field(default_factory=QosConfig)
    """QoS of the command publisher."""
    node_name: str = "vla_rl_deploy"
    """Name of the bridge's node."""
    namespace: str = ""
    """Namespace of the bridge's node (relative topic names resolve in it)."""
    domain_id: int = -1
    """ROS domain; -1 uses ``ROS_DOMAIN_ID`` (or 0)."""
    connect_timeout_s: float = 10.0
    """How long :meth:`connect` waits for the first joint state and camera frames (discovery takes ~2.5 s)."""
    wait_for_controller: bool = True
    """``connect`` also waits until the arm's controller subscribes to ``command_topic`` (else the first
    commands are lost to discovery); set false for a dry run with no controller running."""
    stamp_commands: bool = True
    """Stamp JointTrajectory headers with the send time (a zero stamp means "start on receipt")."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.command_type = CommandType(self.command_type)
        if not self.joint_names:
            raise ValueError("robot.joint_names is required for --robot.type ros2 (joints in command order)")
        if len(set(self.joint_names)) != len(self.joint_names):
            raise ValueError(f"robot.joint_names has duplicates: {self.joint_names}")
        n = len(self.joint_names)
        for name in ("position_lower", "position_upper"):
            vals = getattr(self, name)
            if vals and len(vals) != n:
                raise ValueError(f"robot.{name}: expected {n} values (one per joint), got {len(vals)}")
        for cam, c in self.cameras.items():
            if not c.topic:
                raise ValueError(f"robot.cameras.{cam}.topic is required")
            if c.width <= 0 or c.height <= 0:
                raise ValueError(f"robot.cameras.{cam}: width and height must be > 0 (the size the policy sees)")
        if self.connect_timeout_s <= 0:
            raise ValueError(f"robot.connect_timeout_s must be > 0, got {self.connect_timeout_s}")
