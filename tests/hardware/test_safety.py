"""The safety envelope, watchdog and e-stop latch, without any robot."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from hardware.guard import GuardedRobot
from hardware.kinematics import Workspace, WorkspaceConfig
from hardware.safety import OnViolation, SafetyConfig, SafetyEnvelope
from hardware.watchdog import EStop, Watchdog, WatchState

LOWER = np.array([-1.0, -2.0, 0.0])
UPPER = np.array([1.0, 2.0, 0.5])
STEP = np.array([0.1, 0.2, 0.05])


def envelope(**kw) -> SafetyEnvelope:
    env = SafetyEnvelope(LOWER, UPPER, STEP, **kw)
    env.reset(np.zeros(3))
    return env


def test_clean_chunk_passes_unchanged_and_advances_reference():
    env = envelope()
    chunk = np.array([[0.05, 0.1, 0.02], [0.1, 0.2, 0.04]])
    out = env.filter(chunk, step=0)
    assert np.array_equal(out.targets, chunk) and not out.modified and not out.held
    assert np.array_equal(env.reference, chunk[0])
    assert env.violations == []


def test_position_limit_clamps_and_logs_offending_values(caplog):
    env = envelope()
    env.reset(np.array([0.95, 0.0, 0.45]))
    out = env.filter(np.array([5.0, 0.0, 0.45]), step=7)
    assert out.targets[0, 0] == pytest.approx(1.0)
    kinds = [v.kind for v in out.violations]
    assert kinds == ["position_limit"]
    v = out.violations[0]
    assert v.step == 7 and v.joints == (0,) and v.values == (5.0,) and v.response == "clamped"
    assert "position_limit" in caplog.text and "5.0" in caplog.text


def test_jump_is_clamped_per_joint():
    env = envelope()
    out = env.filter(np.array([0.9, -0.05, 0.3]))
    np.testing.assert_allclose(out.targets[0], [0.1, -0.05, 0.05])
    assert [v.kind for v in out.violations] == ["jump"]
    assert out.violations[0].joints == (0, 2)


def test_chunk_points_are_chained_step_by_step():
    env = envelope()
    out = env.filter(np.array([[0.1, 0, 0], [0.9, 0, 0], [0.95, 0, 0]]))
    np.testing.assert_allclose(out.targets[:, 0], [0.1, 0.2, 0.3])
    np.testing.assert_allclose(env.reference, [0.1, 0, 0])  # only point 0 is executed now


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nonfinite_holds_the_reference(bad):
    env = envelope()
    env.filter(np.array([0.1, 0.1, 0.05]))
    out = env.filter(np.array([0.2, bad, 0.1]))
    assert out.held and np.array_equal(out.targets, [[0.1, 0.1, 0.05]])
    assert out.violations[0].kind == "nonfinite" and out.violations[0].response == "held"
    assert not env.stopped


def test_nonfinite_later_in_chunk_truncates_it():
    env = envelope()
    out = env.filter(np.array([[0.05, 0, 0], [math.nan, 0, 0], [0.1, 0, 0]]))
    assert out.targets.shape == (1, 3) and not out.held and out.modified


@pytest.mark.parametrize(
    "kw, command, kind",
    [
        ({"on_nonfinite": OnViolation.STOP}, [math.nan, 0, 0], "nonfinite"),
        ({"on_position_limit": OnViolation.STOP}, [0, 0, 0.9], "position_limit"),
        ({"on_jump": OnViolation.STOP}, [0.5, 0, 0], "jump"),
    ],
)
def test_stop_latches_until_reset(kw, command, kind):
    env = envelope(**kw)
    out = env.filter(np.array(command))
    assert out.stopped and out.held and np.array_equal(out.targets, [[0, 0, 0]])
    assert env.stop_reason.startswith(kind)
    later = env.filter(np.array([0.01, 0.0, 0.0]))  # a perfectly safe command
    assert later.held and np.array_equal(later.targets, [[0, 0, 0]]), "a stopped envelope let a command through"
    env.reset(np.zeros(3))
    assert not env.filter(np.array([0.01, 0.0, 0.0])).held


def test_tracking_band_keeps_targets_near_the_measured_position():
    env = SafetyEnvelope(LOWER, UPPER, np.full(3, 0.5), max_tracking_error=np.full(3, 0.15))
    env.reset(np.zeros(3))
    measured = np.zeros(3)  # the arm stopped reporting motion
    for k in range(5):
        out = env.filter(np.array([0.9, -0.9, 0.4]), step=k, measured=measured)
    np.testing.assert_allclose(out.targets[0], [0.15, -0.15, 0.15])
    assert "tracking" in [v.kind for v in out.violations]


def test_reset_refuses_a_start_pose_outside_the_limits():
    env = SafetyEnvelope(LOWER, UPPER, STEP, joint_names=["a", "b", "c"])
    with pytest.raises(ValueError, match=r"c=0\.9 not in \[0, 0\.5\]"):
        env.reset(np.array([0.0, 0.0, 0.9]))
    env.reset(np.array([0.0, 0.0, 0.53]))  # parked at the limit plus noise (< one step): accepted, clipped
    np.testing.assert_allclose(env.hold()[0], [0.0, 0.0, 0.5])


def test_from_config_requires_limits_and_checks_lengths():
    with pytest.raises(ValueError, match="safety.position_lower / safety.position_upper are required"):
        SafetyEnvelope.from_config(SafetyConfig(), ["a", "b"], 0.1, None)
    with pytest.raises(ValueError, match="safety.max_delta: expected 1 or 2 values"):
        SafetyEnvelope.from_config(SafetyConfig(max_delta=[1, 2, 3]), ["a", "b"], 0.1, (np.zeros(2), np.ones(2)))
    env = SafetyEnvelope.from_config(
        SafetyConfig(max_delta=[0.5], max_velocity=[2.0, 10.0]), ["a", "b"], 0.1, (np.zeros(2), np.ones(2))
    )
    np.testing.assert_allclose(env.max_step, [0.2, 0.5])  # min(max_delta, max_velocity * dt)
    with pytest.raises(ValueError, match="safety.on_jump"):
        SafetyConfig(on_jump="explode")


def test_workspace_box_clamps_inside_and_stops():
    cfg = WorkspaceConfig(
        model_path="so101",
        site="gripperframe",
        joints=["shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", ""],
        low=[-1.0, -1.0, 0.0],
        high=[1.0, 1.0, 0.35],
    )
    ws = Workspace.from_config(cfg, 6)
    home = np.zeros(6)
    z0 = ws.end_effector(home)[2]
    assert z0 < 0.35
    lower, upper = -np.full(6, 3.0), np.full(6, 3.0)
    env = SafetyEnvelope(lower, upper, np.full(6, np.inf), workspace=ws)
    env.reset(home)
    # find a target that lifts the end effector above the box
    target = home.copy()
    target[1] = -1.5
    assert ws.end_effector(target)[2] > 0.35
    out = env.filter(target)
    assert ws.contains(out.targets[0]) and out.violations[0].kind == "workspace"
    assert out.targets[0][1] < 0 and out.targets[0][1] > -1.5  # moved part of the way
    stopping = SafetyEnvelope(lower, upper, np.full(6, np.inf), workspace=ws, on_workspace=OnViolation.STOP)
    stopping.reset(home)
    assert stopping.filter(target).stopped


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    start=arrays(np.float64, 3, elements=st.floats(-1, 1)),
    chunks=st.lists(
        arrays(
            np.float64,
            st.tuples(st.integers(1, 4), st.just(3)),
            elements=st.one_of(
                st.floats(-50, 50),
                st.sampled_from([math.nan, math.inf, -math.inf, 1e300, -1e300]),
            ),
        ),
        min_size=1,
        max_size=12,
    ),
    on_jump=st.sampled_from([OnViolation.CLAMP, OnViolation.STOP]),
    on_limit=st.sampled_from([OnViolation.CLAMP, OnViolation.STOP]),
    on_nan=st.sampled_from([OnViolation.HOLD, OnViolation.STOP]),
    measured=st.one_of(st.none(), arrays(np.float64, 3, elements=st.floats(-3, 3))),
    tracking=st.one_of(st.none(), st.floats(0.01, 1.0)),
)
def test_fuzzed_actions_never_leave_the_envelope(start, chunks, on_jump, on_limit, on_nan, measured, tracking):
    start = np.clip(start, LOWER, UPPER)
    band = None if tracking is None else np.full(3, tracking)
    env = SafetyEnvelope(LOWER, UPPER, STEP, on_nan, on_limit, on_jump, max_tracking_error=band)
    env.reset(start)
    executed = [start]
    stopped_at = None
    for i, chunk in enumerate(chunks):
        out = env.filter(chunk, step=i, measured=measured)
        t = out.targets
        assert t.ndim == 2 and t.shape[1] == 3 and len(t) <= len(chunk)
        assert np.isfinite(t).all()
        assert (t >= LOWER).all() and (t <= UPPER).all()
        prev = executed[-1]
        assert (np.abs(t[0] - prev) <= STEP + 1e-9).all()
        if len(t) > 1:
            assert (np.abs(np.diff(t, axis=0)) <= STEP + 1e-9).all()
        if stopped_at is not None:
            assert out.held and np.array_equal(t[0], executed[stopped_at]), "command passed after a stop"
        if out.stopped and stopped_at is None:
            stopped_at = len(executed)
        executed.append(t[0])


def test_watchdog_holds_then_stops_and_recovers():
    dog = Watchdog(obs_timeout_s=0.2, camera_timeout_s=1.0, policy_timeout_s=0.5, hold_s=0.3)
    assert dog.check(0.0, 0.01, 0.0, 0.0).state is WatchState.OK
    v = dog.check(1.0, 0.25, 0.0, 0.0)
    assert v.state is WatchState.HOLD and v.fault == "stale_observation"
    assert dog.check(1.1, 0.01, 0.0, 0.0).state is WatchState.OK  # recovered before hold_s
    assert dog.check(2.0, 0.0, 1.5, 0.0).fault == "stale_observation"  # camera
    assert dog.check(2.1, 0.0, 0.0, 0.0).state is WatchState.OK
    assert dog.check(3.0, 0.0, 0.0, 0.6).state is WatchState.HOLD
    assert dog.check(3.2, 0.0, 0.0, 0.8).state is WatchState.HOLD
    stop = dog.check(3.31, 0.0, 0.0, 0.91)
    assert stop.state is WatchState.STOP and stop.fault == "policy_deadline"


def test_estop_latches_until_cleared():
    e = EStop()
    assert not e.is_set
    e.fire("key 'e'")
    e.fire("topic /estop")
    assert e.is_set and e.reason == "key 'e'"
    e.clear()
    assert not e.is_set and len(e.events) == 3


class _SlowAdapter:
    """Records what it is sent; each send can be held open to race an e-stop against it."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, np.ndarray]] = []
        self.sending, self.release = threading.Event(), threading.Event()
        self.release.set()

    def send_chunk(self, targets: np.ndarray, dt: float) -> None:
        self.sending.set()
        self.release.wait(5)
        self.sent.append((time.time(), targets.copy()))


def test_guard_sends_only_holds_once_the_estop_latched():
    estop, adapter = EStop(), _SlowAdapter()
    env = envelope()
    guard = GuardedRobot(adapter, env, 0.05, estop=estop)
    guard.start(np.zeros(3))
    step = np.full((2, 3), 0.01)
    assert not guard.command(step, 0).held
    estop.fire("test")
    result = guard.command(step + 0.01, 1)  # the runner looked before the latch; the guard looks again
    assert result.held and len(adapter.sent) == 2
    np.testing.assert_array_equal(adapter.sent[-1][1], adapter.sent[0][1][:1])  # the hold: the last target sent
    np.testing.assert_array_equal(env.reference, adapter.sent[0][1][0])  # the refused targets never reached it
    estop.clear()
    assert not guard.command(step + 0.01, 2).held and len(adapter.sent) == 3


def test_estop_fired_during_a_send_latches_after_it():
    estop, adapter = EStop(), _SlowAdapter()
    guard = GuardedRobot(adapter, envelope(), 0.05, estop=estop)
    guard.start(np.zeros(3))
    adapter.release.clear()
    sender = threading.Thread(target=guard.command, args=(np.full((1, 3), 0.01), 0))
    sender.start()
    assert adapter.sending.wait(5)
    firing = threading.Thread(target=estop.fire, args=("key 'e'",))
    firing.start()
    firing.join(0.1)
    assert firing.is_alive() and not adapter.sent  # fire() waits for the command on the wire
    adapter.release.set()
    sender.join(5)
    firing.join(5)
    assert estop.is_set and len(adapter.sent) == 1
    assert estop.fired_at is not None and estop.fired_at >= adapter.sent[0][0]
