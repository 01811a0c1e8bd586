"""The ROS 2 bridge under load: bursts of JointState messages, duplicated and out-of-order stamps carrying
positions outside the limits, a camera topic that stops while joints keep coming.

The bridge (:class:`hardware.ros2.bridge.Ros2Adapter`) runs with its transport replaced: threads call its
subscription callbacks as rclpy's executor thread does (so no ROS domain is needed and the timing is the
test's), a small integrator plays the arm, and ``send_chunk`` records what would be published. Everything the
runner would have sent is checked against the envelope (finite, inside the limits, steps of at most
``max_delta``), and the watchdog must hold, then stop, once the camera goes quiet. ``tests/hardware/
test_ros_faults.py`` covers the same envelope over real ROS 2 (a frozen arm node, a policy that emits NaN).
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from hardware.deploy import parse_config, run_deploy
from hardware.ros2.bridge import Ros2Adapter
from hardware.testing import TinyJointPolicy
from tests.hardware.rosutil import SO101_JOINTS, SentCommands, assert_commands_within_envelope

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
    """:class:`Ros2Adapter` whose node is replaced by test threads (see the module doc)."""

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


def _config(tmp, *extra: str):
    TinyJointPolicy.build(6, 6, chunk_size=8, max_step=0.015).save_pretrained(tmp / "tiny")
    return parse_config([
        "--robot.type=ros2", f"--robot.joint_names=[{','.join(SO101_JOINTS)}]",
        f"--robot.position_lower={LOWER.tolist()}", f"--robot.position_upper={UPPER.tolist()}",
        "--robot.cameras={front: {topic: /front/image_raw, width: 8, height: 8}}",
        "--robot.wait_for_controller=false", f"--policy.path={tmp}/tiny", "--keyboard=false",
        f"--safety.max_delta=[{MAX_DELTA}]", "--control_hz=20", "--safety.obs_timeout_s=0.25",
        "--safety.camera_timeout_s=0.3", "--safety.hold_s=0.5", *extra,
    ])


def test_bursts_stale_stamps_and_a_camera_that_stops(tmp_path, monkeypatch) -> None:
    cfg = _config(tmp_path, "--episode_s=6")
    adapter = FeedAdapter(cfg.robot, camera_stops_after_s=2.0)
    monkeypatch.setattr("hardware.deploy.make_adapter", lambda robot: adapter)
    sent = SentCommands()
    report = run_deploy(cfg, hooks=(sent,))
    # the camera went quiet while joints kept coming: the watchdog held, then stopped the run
    assert report.stop_reason.startswith("watchdog: stale_observation: camera frame is"), report.stop_reason
    assert sent.held and sent.held[-1], "the runner did not hold position while the camera was stale"
    assert adapter.messages_received > 1000  # bursts arrived and were taken
    # every stale message (duplicated or overtaken stamp) was dropped, none reached the policy or the envelope
    assert adapter.stale_dropped == adapter.injected_stale > 0
    assert all(np.abs(p).max() < WILD for p in sent.positions)
    # nothing outside the envelope would have been published
    assert len(adapter.sent) >= 20
    assert_commands_within_envelope([{"positions": t.tolist()} for t in adapter.sent], LOWER, UPPER, MAX_DELTA)


def test_out_of_order_and_duplicated_stamps_never_replace_a_newer_position() -> None:
    cfg = _config_robot()
    bridge = Ros2Adapter(cfg)
    bridge._ros = object()
    for t, q in ((10.0, 0.1), (10.1, 0.2), (10.1, 0.9), (10.05, 0.8), (10.2, 0.3), (9.0, 0.7)):
        bridge._on_joint_state(joint_state(t, np.full(6, q)))
    assert np.allclose(bridge.observe().position, 0.3)
    assert bridge.messages_received == 3 and bridge.stale_dropped == 3
    bridge._on_joint_state(joint_state(0.0, np.full(6, 0.4)))  # unstamped: taken in arrival order
    assert np.allclose(bridge.observe().position, 0.4)


def _config_robot():
    from hardware.ros2.config import Ros2RobotConfig

    return Ros2RobotConfig(joint_names=list(SO101_JOINTS), wait_for_controller=False)


@pytest.mark.slow
def test_a_camera_that_stops_later_in_a_longer_run(tmp_path, monkeypatch) -> None:
    """The same faults over a longer run: 8 s of bursts before the camera stops."""
    cfg = _config(tmp_path, "--episode_s=12")
    adapter = FeedAdapter(cfg.robot, camera_stops_after_s=8.0, burst_every_s=0.1)
    monkeypatch.setattr("hardware.deploy.make_adapter", lambda robot: adapter)
    report = run_deploy(cfg)
    assert report.stop_reason.startswith("watchdog: stale_observation: camera frame is"), report.stop_reason
    assert adapter.stale_dropped == adapter.injected_stale > 50
    assert_commands_within_envelope([{"positions": t.tolist()} for t in adapter.sent], LOWER, UPPER, MAX_DELTA)
