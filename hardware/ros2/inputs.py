"""ROS 2 operator inputs, usable with any transport: the e-stop topic and a teleop topic."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np

from hardware.ros2.convert import joint_index
from hardware.ros2.qos import QosConfig
from hardware.watchdog import EStop


class RosEStopListener:
    """Fires ``estop`` when ``std_msgs/Bool`` ``true`` arrives on ``topic`` (``false`` does not clear it).

    Uses its own node so it works whatever the robot transport is. The
    subscription is reliable with depth 10, so a single message is enough.
    """

    def __init__(self, topic: str, estop: EStop, domain_id: int = -1, node_name: str = "vla_rl_estop") -> None:
        from std_msgs.msg import Bool

        from hardware.ros2.runtime import RosNode, make_qos

        self.topic = topic
        self._estop = estop
        self._ros = RosNode(node_name, "", domain_id)
        self._ros.node.create_subscription(Bool, topic, self._on_msg, make_qos(QosConfig()))

    def _on_msg(self, msg: object) -> None:
        if bool(msg.data):  # type: ignore[attr-defined]
            self._estop.fire(f"topic {self.topic}")

    def close(self) -> None:
        """Shut the listener's node down."""
        self._ros.close()


class RosTeleopListener:
    """The newest teleoperation target from a ``sensor_msgs/JointState`` topic (a leader arm, a spacemouse IK node).

    Args:
        topic: JointState topic.
        joint_names: command order; messages lacking one are ignored.
        timeout_s: a target older than this counts as absent.
    """

    def __init__(self, topic: str, joint_names: Sequence[str], domain_id: int = -1, timeout_s: float = 0.25) -> None:
        from sensor_msgs.msg import JointState

        from hardware.ros2.runtime import RosNode, make_qos

        self.topic = topic
        self.joint_names = list(joint_names)
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._target: np.ndarray | None = None
        self._stamp = 0.0
        self._ros = RosNode("vla_rl_teleop", "", domain_id)
        self._ros.node.create_subscription(JointState, topic, self._on_msg, make_qos(QosConfig()))

    def _on_msg(self, msg: object) -> None:
        idx = joint_index(msg.name, self.joint_names)  # type: ignore[attr-defined]
        if idx is None:
            return
        q = np.array([msg.position[i] for i in idx], dtype=np.float64)  # type: ignore[attr-defined]
        with self._lock:
            self._target, self._stamp = q, time.monotonic()

    def action(self) -> np.ndarray | None:
        """The newest target ``[A]`` if fresher than ``timeout_s``, else None."""
        with self._lock:
            if self._target is None or time.monotonic() - self._stamp > self.timeout_s:
                return None
            return self._target.copy()

    def close(self) -> None:
        """Shut the listener's node down."""
        self._ros.close()
