"""The deployment runner over the LeRobot transport (a real LeRobot ``Robot``: the MuJoCo ``mujoco_arm``).

A spy on ``Robot.send_action`` records every command that reaches the robot,
so each test can assert that nothing outside the envelope ever got there.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from hardware.config_mujoco_robot import MujocoRobotConfig
from hardware.intervention import KeyboardListener, OperatorEvents, ScriptedTeleop
from hardware.lerobot_adapter import LeRobotAdapter
from hardware.mujoco_robot import MujocoRobot
from hardware.recording import DatasetConfig, RobotEpisodeRecorder
from hardware.runner import DeployRunner, StepRecord
from hardware.safety import SafetyConfig
from hardware.scheduling import ChunkConfig
from hardware.testing import FaultyPolicy, TinyJointPolicy
from hardware.watchdog import EStop

MAX_DELTA = 0.02


class SpyArm:
    """A connected ``mujoco_arm`` whose ``send_action`` calls are recorded."""

    def __init__(self, tmp_path, cameras: list[str] | None = None) -> None:
        cfg = MujocoRobotConfig(model="so101", camera_names=cameras or [], calibration_dir=tmp_path / "calib")
        self.robot = MujocoRobot(cfg)
        self.sent: list[np.ndarray] = []
        inner = self.robot.send_action

        def spy(action: dict) -> dict:
            self.sent.append(np.array([action[k] for k in self.robot.action_features]))
            return inner(action)

        self.robot.send_action = spy  # type: ignore[method-assign]
        self.adapter = LeRobotAdapter(self.robot)
        self.adapter.connect()
        self.lower = self.robot.arm.lower
        self.upper = self.robot.arm.upper

    def check_envelope(self, lower=None, upper=None, max_step=MAX_DELTA) -> np.ndarray:
        lower = self.lower if lower is None else lower
        upper = self.upper if upper is None else upper
        sent = np.asarray(self.sent)
        assert np.isfinite(sent).all(), "a non-finite command reached the robot"
        assert (sent >= lower - 1e-9).all() and (sent <= upper + 1e-9).all(), "a command outside the limits"
        assert np.abs(np.diff(sent, axis=0)).max(initial=0) <= max_step + 1e-9, "a command jumped too far"
        return sent


def runner(arm: SpyArm, policy, episode_s=1.0, hz=20.0, safety=None, chunk=None, **kw) -> DeployRunner:
    safety = safety or SafetyConfig(max_delta=[MAX_DELTA], obs_timeout_s=0.5, policy_timeout_s=0.5, hold_s=0.3)
    return DeployRunner(arm.adapter, policy, hz, episode_s, safety=safety, chunk=chunk or ChunkConfig(), **kw)


def tiny(**kw) -> TinyJointPolicy:
    return TinyJointPolicy.build(6, 6, chunk_size=8, max_step=0.01, **kw)


def test_policy_drives_the_lerobot_robot_and_episode_is_recorded(tmp_path):
    arm = SpyArm(tmp_path, cameras=["front"])
    start = arm.robot.arm.positions()
    rec = RobotEpisodeRecorder(
        DatasetConfig(repo_id="test/lerobot_run", root=str(tmp_path / "ds")),
        20,
        "mujoco_arm",
        arm.adapter.state_names,
        arm.adapter.joint_names,
        arm.adapter.cameras,
    )
    steps: list[StepRecord] = []

    class Hook:
        def on_episode_start(self, episode: int) -> None: ...
        def on_step(self, record: StepRecord) -> None:
            steps.append(record)

        def on_episode_end(self, summary) -> None: ...

    report = runner(arm, tiny(), episode_s=1.5, recorder=rec, hooks=[Hook()], task="move").run()
    arm.adapter.disconnect()
    assert report.stop_reason == "" and report.episodes[0].end_reason == "time"
    sent = arm.check_envelope()
    assert len(sent) == report.commands_sent + report.holds_sent >= 10  # in-process rendering is slow when loaded
    assert np.abs(arm.robot.arm.positions() - start).max() > 0.02, "the arm did not move"
    assert steps[0].obs.images["front"].shape == (64, 64, 3)
    assert any(s.policy_action is not None for s in steps)

    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("test/lerobot_run", root=tmp_path / "ds")
    assert ds.num_episodes == 1 and len(ds) == len(steps)
    frame = ds[len(ds) - 1]
    assert frame["observation.images.front"].shape == (3, 64, 64)
    np.testing.assert_allclose(frame["action"].numpy(), sent[len(steps) - 1], atol=1e-5)
    assert frame["task"] == "move" and not bool(frame["intervention"]) and int(frame["intervention_label"]) == 0


def test_dry_run_never_reaches_the_robot(tmp_path):
    arm = SpyArm(tmp_path)
    report = runner(arm, tiny(), episode_s=0.6, dry_run=True).run()
    assert report.dry_run and report.commands_sent > 5 and arm.sent == []


@pytest.mark.parametrize("fault", ["nan", "inf"])
def test_nonfinite_policy_output_is_held(tmp_path, fault):
    arm = SpyArm(tmp_path)
    report = runner(arm, FaultyPolicy(tiny(), fault, after_calls=1)).run()
    sent = arm.check_envelope()
    assert report.violations_by_kind.get("nonfinite", 0) > 0
    assert report.holds_sent > 5
    # once the fault starts only the hold (one constant target) is sent
    last = sent[-8:]
    assert np.abs(last - last[0]).max() == 0.0


def test_out_of_limit_and_jumps_are_clamped(tmp_path):
    arm = SpyArm(tmp_path)
    lower, upper = -np.full(6, 0.3), np.full(6, 0.3)
    safety = SafetyConfig(position_lower=list(lower), position_upper=list(upper), max_delta=[MAX_DELTA])
    report = runner(arm, FaultyPolicy(tiny(), "out_of_limits", after_calls=0, magnitude=5.0), safety=safety).run()
    sent = arm.check_envelope(lower, upper)
    assert report.violations_by_kind["position_limit"] > 0
    assert np.allclose(sent[-1], 0.3)  # walked to the limit, one clamped step at a time
    assert len(sent) > 5


def test_slow_policy_holds_then_stops(tmp_path):
    arm = SpyArm(tmp_path)
    policy = FaultyPolicy(tiny(), "slow", after_calls=1, magnitude=1.5)
    report = runner(arm, policy, episode_s=3.0, chunk=ChunkConfig(replan_every=2)).run()
    assert report.stop_reason.startswith("watchdog: policy_deadline")
    assert report.violations_by_kind.get("policy_deadline") == 1
    sent = arm.check_envelope()
    assert report.holds_sent >= 3
    assert np.abs(sent[-3:] - sent[-1]).max() == 0.0


def test_policy_exception_stops_the_run(tmp_path):
    arm = SpyArm(tmp_path)
    report = runner(arm, FaultyPolicy(tiny(), "raise", after_calls=1)).run()
    assert report.stop_reason.startswith("policy raised RuntimeError")
    assert report.holds_sent >= 1 and np.array_equal(arm.sent[-1], arm.sent[-2])  # stopped with a hold


def test_transport_failure_stops_the_run(tmp_path):
    arm = SpyArm(tmp_path)
    calls = {"n": 0}
    inner = arm.robot.get_observation

    def flaky() -> dict:
        calls["n"] += 1
        if calls["n"] > 6:
            raise OSError("serial port vanished")
        return inner()

    arm.robot.get_observation = flaky  # type: ignore[method-assign]
    report = runner(arm, tiny()).run()
    assert "transport: observation failed" in report.stop_reason and "serial port vanished" in report.stop_reason


def test_takeover_executes_teleop_targets_and_marks_interventions(tmp_path):
    arm = SpyArm(tmp_path)
    estop = EStop()
    events = OperatorEvents(estop)
    teleop = ScriptedTeleop()
    target = arm.robot.arm.positions() + 0.1
    records: list[StepRecord] = []

    class Hook:
        def on_episode_start(self, episode: int) -> None: ...
        def on_step(self, record: StepRecord) -> None:
            records.append(record)
            if record.step == 4:
                teleop.set(target)
                events.handle_key("t")  # human takes over: recovery
            if record.step == 8:
                events.handle_key("m")  # recovery -> correction

        def on_episode_end(self, summary) -> None: ...

    report = runner(arm, tiny(), episode_s=1.2, events=events, estop=estop, teleop=teleop, hooks=[Hook()]).run()
    arm.check_envelope()
    assert report.episodes[0].intervention_steps > 10
    assert [r.intervention for r in records[:5]] == [False] * 5 and records[-1].intervention
    # RaC labels: policy until the takeover, recovery until marked, correction after
    assert [r.label for r in records[:9]] == [0] * 5 + [1] * 4 and records[9].label == 2 and records[-1].label == 2
    events.handle_key("h")
    assert not events.takeover and int(events.label()) == 0
    np.testing.assert_allclose(arm.sent[-1], target, atol=1e-9)  # reached the teleop target in clamped steps


def test_keyboard_estop_latches_and_clears(tmp_path):
    arm = SpyArm(tmp_path)
    estop = EStop()
    events = OperatorEvents(estop)
    r, w = os.pipe()
    keys = KeyboardListener(events, fd=r)
    assert keys.start()
    sent_at_fire: list[int] = []

    class Hook:
        def on_episode_start(self, episode: int) -> None: ...
        def on_step(self, record: StepRecord) -> None:
            if record.step == 3:
                os.write(w, b"e")
                sent_at_fire.append(len(arm.sent))

        def on_episode_end(self, summary) -> None: ...

    run = runner(arm, tiny(), episode_s=2.0, events=events, estop=estop, hooks=[Hook()])
    import threading

    t = threading.Thread(target=run.run)
    t.start()
    import time

    deadline = time.monotonic() + 10
    while not estop.is_set and time.monotonic() < deadline:
        time.sleep(0.01)
    assert estop.is_set
    time.sleep(0.5)
    during = len(arm.sent) - sent_at_fire[0]
    assert during <= 3, f"{during} commands sent while e-stopped"  # in-flight tick + the one hold
    os.write(w, b"c")
    t.join(15)
    keys.close()
    os.close(r)
    os.close(w)
    assert not estop.is_set and run.report.stop_reason == ""
    assert len(arm.sent) - sent_at_fire[0] > during + 5, "commands did not resume after clearing"
    assert run.report.violations_by_kind.get("estop") == 1
    arm.check_envelope()


def test_blend_mode_with_frequent_replanning(tmp_path):
    arm = SpyArm(tmp_path)
    report = runner(
        arm, tiny(), chunk=ChunkConfig(mode="blend", replan_every=2, blend_decay=0.5, command_horizon=3)
    ).run()
    assert report.stop_reason == "" and report.timing["policy"].n >= 5
    arm.check_envelope()


def test_start_outside_the_limits_refuses_to_move(tmp_path):
    arm = SpyArm(tmp_path)
    safety = SafetyConfig(position_lower=[0.5] * 6, position_upper=[1.0] * 6, max_delta=[MAX_DELTA])
    report = runner(arm, tiny(), safety=safety).run()
    assert report.stop_reason.startswith("cannot start episode 0: safety: the robot starts outside the joint limits")
    assert "shoulder_pan.pos=" in report.stop_reason and "not in [0.5, 1]" in report.stop_reason
    assert arm.sent == []


def test_rerecorded_episode_is_discarded_and_run_again(tmp_path):
    arm = SpyArm(tmp_path)
    estop = EStop()
    events = OperatorEvents(estop)
    rec = RobotEpisodeRecorder(
        DatasetConfig(repo_id="test/rerecord", root=str(tmp_path / "ds")),
        20,
        "mujoco_arm",
        arm.adapter.state_names,
        arm.adapter.joint_names,
        arm.adapter.cameras,
    )

    class Hook:
        def __init__(self) -> None:
            self.episode = -1

        def on_episode_start(self, episode: int) -> None:
            self.episode = episode

        def on_step(self, record: StepRecord) -> None:
            if self.episode == 0 and record.step == 3:
                events.handle_key("r")

        def on_episode_end(self, summary) -> None: ...

    report = runner(arm, tiny(), episode_s=0.5, recorder=rec, events=events, estop=estop, hooks=[Hook()]).run()
    assert [e.end_reason for e in report.episodes] == ["rerecord", "time"]
    assert [e.saved for e in report.episodes] == [False, True]
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("test/rerecord", root=tmp_path / "ds")
    assert ds.num_episodes == 1 and len(ds) == report.episodes[1].steps
