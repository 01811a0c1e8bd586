"""A ROS 2 bridge under load, without a ROS domain: bursts of JointState messages, duplicated and out-of-order
stamps carrying positions outside the limits, a camera topic that stops while joints keep coming.

:class:`FeedAdapter` is the bridge (:class:`hardware.ros2.bridge.Ros2Adapter`) with its transport replaced:
threads call its subscription callbacks as rclpy's executor thread does, a small integrator plays the arm, and
``send_chunk`` records what would be published, to be checked against the envelope.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from hardware.deploy import parse_config
from hardware.ros2.bridge import Ros2Adapter
from hardware.testing import TinyJointPolicy

SO101_JOINTS = ["shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper"]
LOWER, UPPER = np.full(6, -1.0), np.full(6, 1.0)
MAX_DELTA = 0.02
WILD = 5.0  # the position stale messages carry: far outside [LOWER, UPPER]


def _stamp(t: float) -> SimpleNamespace:
    sec = int(t)
    return SimpleNamespace(sec=sec, nanosec=int(round((t - sec) * 1e9)))


def joint_state(t: float, q: np.ndarray, names: list[str] = SO101_JOINTS) -> SimpleNamespace:
    """A ``sensor_msgs/JointState`` stand-in (the fields the bridge reads)."""
    return SimpleNamespace(header=SimpleNamespace(stamp=_stamp(t)), name=list(names), position=[float(x) for x in q])


def image(size: int = 8) -> SimpleNamespace:
    """A ``sensor_msgs/Image`` stand-in (rgb8)."""
    return SimpleNamespace(height=size, width=size, encoding="rgb8", step=3 * size, data=bytes(3 * size * size))


class FeedAdapter(Ros2Adapter):
    """:class:`Ros2Adapter` whose node is replaced by threads (see the module doc); ``sent`` holds every chunk
    the runner would have published, ``injected_stale`` how many stale messages were fed."""

    def __init__(self, cfg, camera_stops_after_s: float, burst_every_s: float = 0.2) -> None:
        super().__init__(cfg)
        self.camera_stops_after_s, self.burst_every_s = camera_stops_after_s, burst_every_s
        self.sent: list[np.ndarray] = []
        self.injected_stale = 0
        self._q = np.zeros(6)
        self._target = np.zeros(6)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._state_cb = self._on_joint_state
        self._camera_cb = self._image_callback("front")

    def connect(self) -> None:
        self._ros, self._pub = object(), object()
        for fn in (self._arm, self._camera):
            t = threading.Thread(target=fn, daemon=True)
            t.start()
            self._threads.append(t)
        deadline = time.monotonic() + 5
        while not self._complete() and time.monotonic() < deadline:
            time.sleep(0.01)

    def disconnect(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        self._ros = self._pub = None

    def send_chunk(self, targets: np.ndarray, dt: float) -> None:
        targets = np.asarray(targets, dtype=np.float64).reshape(-1, self.num_joints)
        self.sent.append(targets.copy())
        self._target = targets[0].copy()

    def _arm(self) -> None:
        """A 200 Hz arm that tracks point 0 of the last command; every ``burst_every_s`` a burst of 200
        messages, with a duplicated stamp and an out-of-order one carrying positions outside the limits."""
        last_burst = time.monotonic()
        while not self._stop.is_set():
            now = time.time()
            self._q += np.clip(self._target - self._q, -0.01, 0.01)
            self._state_cb(joint_state(now, self._q))
            if time.monotonic() - last_burst > self.burst_every_s:
                last_burst = time.monotonic()
                for i in range(200):  # a burst: newer and newer stamps, as a flood of fresh messages
                    self._state_cb(joint_state(now + 1e-6 * (i + 1), self._q))
                newest = now + 2e-4
                self._state_cb(joint_state(newest, np.full(6, WILD)))  # duplicated stamp
                self._state_cb(joint_state(newest - 0.05, np.full(6, -WILD)))  # overtaken: out of order
                self.injected_stale += 2
                self._state_cb(joint_state(newest + 1e-6, self._q))  # the arm's own next message
            time.sleep(0.005)

    def _camera(self) -> None:
        start = time.monotonic()
        while not self._stop.is_set() and time.monotonic() - start < self.camera_stops_after_s:
            self._camera_cb(image())
            time.sleep(0.05)


def deploy_config(tmp: Path, *extra: str) -> Any:
    """A ``vla-rl deploy`` config of a tiny joint policy (saved under ``tmp/tiny``) on the ROS 2 bridge: 6 SO-101
    joints in [-1, 1], steps of at most :data:`MAX_DELTA`, an 8x8 camera, 20 Hz; ``extra``: more CLI arguments."""
    TinyJointPolicy.build(6, 6, chunk_size=8, max_step=0.015).save_pretrained(tmp / "tiny")
    return parse_config([
        "--robot.type=ros2", f"--robot.joint_names=[{','.join(SO101_JOINTS)}]",
        f"--robot.position_lower={LOWER.tolist()}", f"--robot.position_upper={UPPER.tolist()}",
        "--robot.cameras={front: {topic: /front/image_raw, width: 8, height: 8}}",
        "--robot.wait_for_controller=false", f"--policy.path={tmp}/tiny", "--keyboard=false",
        f"--safety.max_delta=[{MAX_DELTA}]", "--control_hz=20", "--safety.obs_timeout_s=0.25",
        "--safety.camera_timeout_s=0.3", "--safety.hold_s=0.5", *extra,
    ])
