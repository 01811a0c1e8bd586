"""The ROS 2 robot adapter: ``sensor_msgs/JointState`` + cameras in, joint commands out.

Subscriptions run in the node's executor thread and only store the newest
message (with its arrival time); :meth:`Ros2Adapter.observe` copies the newest
data under a lock and never blocks. A ``JointState`` whose header stamp is not
newer than the last accepted one (a duplicate, or a message overtaken on the
way: out of order) is dropped and counted in ``stale_dropped``: it would
replace a newer position with an older one and reset the watchdog's age.
Unstamped messages (stamp 0) are taken in arrival order. Commands are published as
``trajectory_msgs/JointTrajectory`` (point ``i`` due at ``(i + 1) * dt``) or,
for forward position controllers, ``std_msgs/Float64MultiArray`` holding
point 0 in joint order.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from hardware.adapter import RobotAdapter, RobotObservation
from hardware.ros2.config import CommandType, Ros2RobotConfig
from hardware.ros2.convert import (
    MessageError,
    build_trajectory,
    decode_compressed,
    decode_image,
    joint_index,
    resize,
    stamp_to_seconds,
)

log = logging.getLogger(__name__)


class Ros2Adapter(RobotAdapter):
    """An arm behind ROS 2 topics, configured by :class:`Ros2RobotConfig`."""

    robot_type = "ros2"

    def __init__(self, cfg: Ros2RobotConfig) -> None:
        self.cfg = cfg
        self.joint_names = list(cfg.joint_names)
        self.state_names = list(cfg.joint_names)
        self.cameras = {name: (c.height, c.width) for name, c in cfg.cameras.items()}
        self._lock = threading.Lock()
        self._position: np.ndarray | None = None
        self._state_stamp = 0.0
        self._images: dict[str, np.ndarray] = {}
        self._image_stamps: dict[str, float] = {}
        self._index_cache: dict[tuple[str, ...], list[int] | None] = {}
        self._warned: set[str] = set()
        self._ros = None
        self._pub = None
        self._header_stamp = 0.0
        self.messages_received = 0
        self.stale_dropped = 0
        self.frames_received = dict.fromkeys(cfg.cameras, 0)

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def is_connected(self) -> bool:
        """True between connect and disconnect."""
        return self._ros is not None

    def connect(self) -> None:
        """Create the node, subscribe, and wait for a joint state and one frame per camera.

        Raises:
            ImportError: without rclpy (with the install command).
            ConnectionError: naming each topic that stayed silent for ``robot.connect_timeout_s``.
        """
        if self._ros is not None:
            return
        from sensor_msgs.msg import CompressedImage, Image, JointState
        from std_msgs.msg import Float64MultiArray
        from trajectory_msgs.msg import JointTrajectory

        from hardware.ros2.runtime import RosNode, make_qos

        cfg = self.cfg
        ros = RosNode(cfg.node_name, cfg.namespace, cfg.domain_id)
        node = ros.node
        node.create_subscription(JointState, cfg.joint_state_topic, self._on_joint_state, make_qos(cfg.state_qos))
        for name, cam in cfg.cameras.items():
            msg_type = CompressedImage if cam.compressed else Image
            node.create_subscription(msg_type, cam.topic, self._image_callback(name), make_qos(cam.qos))
        cmd_type = JointTrajectory if cfg.command_type is CommandType.TRAJECTORY else Float64MultiArray
        self._pub = node.create_publisher(cmd_type, cfg.command_topic, make_qos(cfg.command_qos))
        self._ros = ros
        deadline = time.monotonic() + cfg.connect_timeout_s
        while time.monotonic() < deadline:
            if self._complete():
                log.info("ros2: connected (%s, %d camera(s))", cfg.joint_state_topic, len(cfg.cameras))
                return
            time.sleep(0.02)
        silent = self._silent_topics()
        self.disconnect()
        raise ConnectionError(
            f"ros2: not ready within robot.connect_timeout_s={cfg.connect_timeout_s} s: {silent}. "
            f"Check the topic names, that JointState lists all of robot.joint_names {self.joint_names}, "
            "ROS_DOMAIN_ID / robot.domain_id, ROS_AUTOMATIC_DISCOVERY_RANGE, and QoS compatibility."
        )

    def disconnect(self) -> None:
        """Destroy the node and shut its context down (idempotent)."""
        ros, self._ros, self._pub = self._ros, None, None
        if ros is not None:
            ros.close()

    # -- subscriptions -------------------------------------------------------------------------------

    def _controller_listening(self) -> bool:
        return not self.cfg.wait_for_controller or (self._pub is not None and self._pub.get_subscription_count() > 0)

    def _complete(self) -> bool:
        with self._lock:
            data = self._position is not None and all(c in self._images for c in self.cameras)
        return data and self._controller_listening()

    def _silent_topics(self) -> list[str]:
        with self._lock:
            out = [] if self._position is not None else [f"{self.cfg.joint_state_topic} (JointState)"]
            out += [f"{c.topic} (camera {n})" for n, c in self.cfg.cameras.items() if n not in self._images]
        if not self._controller_listening():
            out.append(f"{self.cfg.command_topic} (no controller subscribed; robot.wait_for_controller=false skips this)")
        return out

    def _on_joint_state(self, msg: object) -> None:
        names = tuple(msg.name)  # type: ignore[attr-defined]
        idx = self._index_cache.get(names, [])
        if idx == []:
            idx = joint_index(names, self.joint_names)
            self._index_cache[names] = idx
        if idx is None:
            self._warn_once(
                f"js:{names}",
                f"JointState on {self.cfg.joint_state_topic} lacks joints "
                f"{sorted(set(self.joint_names) - set(names))}; ignoring it",
            )
            return
        pos = msg.position  # type: ignore[attr-defined]
        if len(pos) != len(names):
            self._warn_once("js-len", f"JointState has {len(pos)} positions for {len(names)} names; ignoring it")
            return
        q = np.array([pos[i] for i in idx], dtype=np.float64)
        header = getattr(msg, "header", None)
        stamp = stamp_to_seconds(header.stamp) if header is not None else 0.0
        with self._lock:
            stale = 0.0 < stamp <= self._header_stamp  # a duplicate, or overtaken by a newer message
            if stale:
                self.stale_dropped += 1
            else:
                self._header_stamp = max(self._header_stamp, stamp)
                self._position = q
                self._state_stamp = time.monotonic()
                self.messages_received += 1
        if stale:
            self._warn_once("js-stale", f"dropping JointState messages on {self.cfg.joint_state_topic} whose stamp is "
                            "not newer than the last one (duplicated or out of order); stale_dropped counts them")

    def _image_callback(self, name: str):
        cam = self.cfg.cameras[name]

        def callback(msg: object) -> None:
            try:
                if cam.compressed:
                    img = decode_compressed(msg.format, msg.data)  # type: ignore[attr-defined]
                else:
                    img = decode_image(msg.height, msg.width, msg.encoding, msg.step, msg.data)  # type: ignore[attr-defined]
                img = resize(img, cam.height, cam.width)
            except MessageError as e:
                self._warn_once(f"cam:{name}", f"camera {name} ({cam.topic}): {e}")
                return
            with self._lock:
                self._images[name] = img
                self._image_stamps[name] = time.monotonic()
                self.frames_received[name] += 1

        return callback

    def _warn_once(self, key: str, text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.error("ros2: %s", text)

    # -- adapter API ---------------------------------------------------------------------------------

    def observe(self) -> RobotObservation:
        """The newest joint state and frames (copies); never blocks.

        Raises:
            ConnectionError: if not connected or nothing has arrived yet.
        """
        if self._ros is None:
            raise ConnectionError("ros2 adapter is not connected")
        with self._lock:
            if self._position is None:
                raise ConnectionError(f"no JointState received on {self.cfg.joint_state_topic}")
            q = self._position.copy()
            return RobotObservation(
                state=q,
                position=q.copy(),
                images={k: v.copy() for k, v in self._images.items()},
                state_stamp=self._state_stamp,
                image_stamps=dict(self._image_stamps),
            )

    def send_chunk(self, targets: np.ndarray, dt: float) -> None:
        """Publish ``targets [n, A]`` (trajectory) or point 0 (position controller)."""
        pub, ros = self._pub, self._ros
        if pub is None or ros is None:
            raise ConnectionError("ros2 adapter is not connected")
        targets = np.asarray(targets, dtype=np.float64).reshape(-1, self.num_joints)
        if self.cfg.command_type is CommandType.TRAJECTORY:
            from builtin_interfaces.msg import Duration
            from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

            msg = build_trajectory(JointTrajectory, JointTrajectoryPoint, Duration, self.joint_names, targets, dt)
            if self.cfg.stamp_commands:
                msg.header.stamp = ros.now_msg()
        else:
            from std_msgs.msg import Float64MultiArray

            msg = Float64MultiArray()
            msg.data = [float(x) for x in targets[0]]
        pub.publish(msg)

    def default_limits(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``robot.position_lower`` / ``robot.position_upper`` if configured."""
        if self.cfg.position_lower and self.cfg.position_upper:
            return np.asarray(self.cfg.position_lower, dtype=np.float64), np.asarray(
                self.cfg.position_upper, dtype=np.float64
            )
        return None
