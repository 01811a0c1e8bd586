"""The ROS 2 bridge under load: bursts of JointState messages, duplicated and out-of-order stamps carrying
positions outside the limits, a camera topic that stops while joints keep coming.

The bridge runs with its transport replaced (:class:`vla_rl.faults.ros_feed.FeedAdapter`: no ROS domain is
needed and the timing is the test's). Everything the
runner would have sent is checked against the envelope (finite, inside the limits, steps of at most
``max_delta``), and the watchdog must hold, then stop, once the camera goes quiet. ``tests/hardware/
test_ros_faults.py`` covers the same envelope over real ROS 2 (a frozen arm node, a policy that emits NaN).
"""

from __future__ import annotations

import numpy as np
import pytest

from hardware.deploy import run_deploy
from hardware.ros2.bridge import Ros2Adapter
from tests.hardware.rosutil import SO101_JOINTS, SentCommands, assert_commands_within_envelope
from vla_rl.faults.ros_feed import LOWER, MAX_DELTA, UPPER, WILD, FeedAdapter, joint_state
from vla_rl.faults.ros_feed import deploy_config as _config

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
