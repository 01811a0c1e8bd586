"""The safety envelope: every joint command passes through it, whatever the transport.

A command is a chunk of joint-position targets ``float64 [n, A]`` (``n >= 1``
points spaced one control period apart; point 0 is the target for the next
tick). :meth:`SafetyEnvelope.filter` returns the chunk that may reach the arm.
Checks run per point, in this order, each relative to the previous *accepted*
point (point 0 relative to the last accepted command, the "reference"):

1. NaN / Inf -> ``on_nonfinite``: ``hold`` (re-send the reference, drop the
   rest of the chunk) or ``stop``;
2. joint position limits -> ``on_position_limit``: ``clamp`` into
   ``[lower, upper]`` or ``stop``;
3. optional tracking band: a target further than ``max_tracking_error``
   from the *measured* position is pulled into the band (always clamped);
   this bounds how far commands can run ahead of an arm that stopped
   moving or reporting (before the watchdog notices), and so the jump an
   arm sees if it drops the commands sent meanwhile;
4. per-step jump, ``min(max_delta, max_velocity * dt)`` per joint ->
   ``on_jump``: ``clamp`` the step or ``stop``;
5. optional Cartesian workspace box of the end effector (forward kinematics
   through a MuJoCo model, :mod:`hardware.kinematics`) -> ``on_workspace``:
   ``clamp`` (move as far toward the target as the box allows) or ``stop``.

Guarantees (asserted by the property tests): every returned point is finite,
inside the limits, within one step of its predecessor, and (with a
workspace) inside the box. After a ``stop`` the envelope is latched: it only
ever returns the hold command (the reference) until :meth:`reset`. Every
violation is counted (:attr:`SafetyEnvelope.violation_counts`), the first
``MAX_KEPT_VIOLATIONS`` are kept with their values
(:attr:`SafetyEnvelope.violations`), and each kind is logged with the
offending values at most once per second (with the number suppressed since).
"""

from __future__ import annotations

import enum
import logging
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from hardware.kinematics import Workspace, WorkspaceConfig

log = logging.getLogger(__name__)

_EPS = 1e-9
MAX_KEPT_VIOLATIONS = 1000  # older runs keep counting in ``violation_counts``
LOG_INTERVAL_S = 1.0  # at most one log line per violation kind per interval (with a count of the rest)


class OnViolation(str, enum.Enum):
    """What the envelope does with an offending point."""

    CLAMP = "clamp"
    """Replace the point by the nearest safe point and continue."""
    HOLD = "hold"
    """Re-send the last accepted command; drop the rest of the chunk."""
    STOP = "stop"
    """Hold, then latch: no other command passes until the envelope is reset."""


@dataclass
class SafetyConfig:
    """Limits every command must respect, and what to do when one is violated.

    Values are in the robot's joint units (radians for ROS 2 arms, LeRobot's
    units for LeRobot robots: degrees or ``[-100, 100]`` for SO-100/101 joints,
    ``[0, 100]`` for their gripper), one entry per joint in the robot's joint
    order. A list with a single value applies to every joint.
    """

    position_lower: list[float] = field(default_factory=list)
    """Lower joint position limits; empty takes the robot's own (ROS config / sim model), else an error."""
    position_upper: list[float] = field(default_factory=list)
    """Upper joint position limits; empty takes the robot's own, else an error."""
    max_delta: list[float] = field(default_factory=list)
    """Largest change of a joint target between consecutive control steps; empty = no per-step limit."""
    max_velocity: list[float] = field(default_factory=list)
    """Largest joint target velocity (units/s); combined with the control period into a per-step limit."""
    max_tracking_error: list[float] = field(default_factory=list)
    """Largest distance of a target from the measured position (clamped into the band); empty = off."""
    workspace: WorkspaceConfig = field(default_factory=WorkspaceConfig)
    """Optional Cartesian box the end effector must stay in (off unless ``workspace.model_path`` is set)."""
    on_nonfinite: OnViolation = OnViolation.HOLD
    """NaN/Inf in a command: ``hold`` or ``stop``."""
    on_position_limit: OnViolation = OnViolation.CLAMP
    """A target outside the joint limits: ``clamp`` or ``stop``."""
    on_jump: OnViolation = OnViolation.CLAMP
    """A step larger than the delta/velocity limit: ``clamp`` or ``stop``."""
    on_workspace: OnViolation = OnViolation.CLAMP
    """A target whose end effector leaves the box: ``clamp`` or ``stop``."""
    obs_timeout_s: float = 0.25
    """Watchdog: an observation older than this is stale (hold, then stop)."""
    camera_timeout_s: float = 1.0
    """Watchdog: a camera frame older than this is stale."""
    policy_timeout_s: float = 1.0
    """Watchdog: a policy call running longer than this is past its deadline."""
    hold_s: float = 0.5
    """Watchdog: how long to hold position on a fault before stopping the run."""
    estop_topic: str = ""
    """ROS 2 ``std_msgs/Bool`` topic; ``true`` fires the e-stop (needs rclpy). Empty = none."""
    estop_key: str = "e"
    """Keyboard key that fires the e-stop (space also does). The e-stop latches until cleared."""
    clear_key: str = "c"
    """Keyboard key that clears a latched e-stop."""

    def __post_init__(self) -> None:
        for name in ("on_nonfinite", "on_position_limit", "on_jump", "on_workspace"):
            value = getattr(self, name)
            if not isinstance(value, OnViolation):
                try:
                    setattr(self, name, OnViolation(value))
                except ValueError:
                    valid = ", ".join(v.value for v in OnViolation)
                    raise ValueError(f"safety.{name}: {value!r} is not one of {valid}") from None
        if self.on_nonfinite is OnViolation.CLAMP:
            raise ValueError("safety.on_nonfinite: a NaN cannot be clamped; use 'hold' or 'stop'")
        for name in ("on_position_limit", "on_jump", "on_workspace"):
            if getattr(self, name) is OnViolation.HOLD:
                raise ValueError(f"safety.{name}: use 'clamp' or 'stop'")
        for name in ("obs_timeout_s", "camera_timeout_s", "policy_timeout_s", "hold_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"safety.{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class Violation:
    """One safety event, with the values that caused it.

    Attributes:
        kind: ``nonfinite``, ``position_limit``, ``jump``, ``workspace``,
            ``stale_observation``, ``policy_deadline``, ``estop``, ``policy_error``.
        step: control step (tick index within the episode).
        point: index of the offending point in its chunk (-1 for watchdog events).
        joints: joint indices involved.
        values: the offending values (targets, steps or end-effector position).
        limits: the bounds they broke, as text.
        response: ``clamped``, ``held`` or ``stopped``.
    """

    kind: str
    step: int
    point: int
    joints: tuple[int, ...]
    values: tuple[float, ...]
    limits: str
    response: str


@dataclass
class FilterResult:
    """What :meth:`SafetyEnvelope.filter` lets through.

    Attributes:
        targets: ``float64 [m, A]`` safe points (``m >= 1``); the hold command
            ``[1, A]`` when the chunk was rejected.
        modified: True if any point was clamped, dropped or replaced.
        held: True if the result is the hold command.
        stopped: True if the envelope is latched stopped (only holds pass).
        violations: what happened in this call.
    """

    targets: np.ndarray
    modified: bool
    held: bool
    stopped: bool
    violations: list[Violation]


def _per_joint(values: list[float], n: int, name: str, default: float) -> np.ndarray:
    if not values:
        return np.full(n, default, dtype=np.float64)
    if len(values) == 1:
        return np.full(n, float(values[0]), dtype=np.float64)
    if len(values) != n:
        raise ValueError(f"safety.{name}: expected 1 or {n} values (one per joint), got {len(values)}")
    return np.asarray(values, dtype=np.float64)


class SafetyEnvelope:
    """Filters joint-target chunks; see the module docstring for the rules.

    Args:
        lower, upper: ``[A]`` joint position limits (finite, ``lower <= upper``).
        max_step: ``[A]`` largest per-step change (``inf`` = unlimited).
        on_nonfinite, on_position_limit, on_jump, on_workspace: responses.
        workspace: optional Cartesian box check.
        joint_names: names used in log messages.

    Raises:
        ValueError: for limits of the wrong length, non-finite or inverted limits.
    """

    def __init__(
        self,
        lower: np.ndarray,
        upper: np.ndarray,
        max_step: np.ndarray,
        on_nonfinite: OnViolation = OnViolation.HOLD,
        on_position_limit: OnViolation = OnViolation.CLAMP,
        on_jump: OnViolation = OnViolation.CLAMP,
        on_workspace: OnViolation = OnViolation.CLAMP,
        workspace: Workspace | None = None,
        joint_names: list[str] | None = None,
        max_tracking_error: np.ndarray | None = None,
    ) -> None:
        self.lower = np.asarray(lower, dtype=np.float64)
        self.upper = np.asarray(upper, dtype=np.float64)
        self.max_step = np.asarray(max_step, dtype=np.float64)
        n = self.lower.shape[0]
        if self.upper.shape != (n,) or self.max_step.shape != (n,):
            raise ValueError(f"safety: lower/upper/max_step must all have {n} entries")
        if not (np.isfinite(self.lower).all() and np.isfinite(self.upper).all()):
            raise ValueError("safety.position_lower/position_upper must be finite")
        if (self.lower > self.upper).any():
            bad = np.nonzero(self.lower > self.upper)[0].tolist()
            raise ValueError(f"safety: position_lower > position_upper for joint(s) {bad}")
        if (self.max_step <= 0).any() or np.isnan(self.max_step).any():
            raise ValueError("safety.max_delta/max_velocity must be > 0")
        self.max_tracking_error = (
            np.full(n, np.inf) if max_tracking_error is None else np.asarray(max_tracking_error, dtype=np.float64)
        )
        if self.max_tracking_error.shape != (n,) or (self.max_tracking_error <= 0).any():
            raise ValueError(f"safety.max_tracking_error must have {n} values > 0")
        self.num_joints = n
        self.on_nonfinite = OnViolation(on_nonfinite)
        self.on_position_limit = OnViolation(on_position_limit)
        self.on_jump = OnViolation(on_jump)
        self.on_workspace = OnViolation(on_workspace)
        self.workspace = workspace
        self.joint_names = list(joint_names) if joint_names else [f"joint{i}" for i in range(n)]
        self.reference: np.ndarray | None = None
        self.stop_reason: str | None = None
        self.violations: list[Violation] = []
        self.violation_counts: Counter[str] = Counter()
        self._last_log: dict[str, float] = {}
        self._suppressed: Counter[str] = Counter()

    @classmethod
    def from_config(
        cls,
        cfg: SafetyConfig,
        joint_names: list[str],
        dt: float,
        default_limits: tuple[np.ndarray, np.ndarray] | None,
    ) -> SafetyEnvelope:
        """Build the envelope for a robot with ``joint_names`` run every ``dt`` seconds.

        Raises:
            ValueError: naming the ``safety.*`` field that is missing or has the
                wrong length (no limits in the config and none from the robot).
        """
        n = len(joint_names)
        if cfg.position_lower and cfg.position_upper:
            lower = _per_joint(cfg.position_lower, n, "position_lower", 0.0)
            upper = _per_joint(cfg.position_upper, n, "position_upper", 0.0)
        elif cfg.position_lower or cfg.position_upper:
            raise ValueError("safety.position_lower and safety.position_upper must be given together")
        elif default_limits is not None:
            lower, upper = (np.asarray(x, dtype=np.float64) for x in default_limits)
        else:
            raise ValueError(
                f"safety.position_lower / safety.position_upper are required: this robot reports no joint "
                f"limits. Give {n} values each (joints: {', '.join(joint_names)})"
            )
        step = _per_joint(cfg.max_delta, n, "max_delta", np.inf)
        vel = _per_joint(cfg.max_velocity, n, "max_velocity", np.inf)
        max_step = np.minimum(step, vel * dt)
        workspace = Workspace.from_config(cfg.workspace, n) if cfg.workspace.model_path else None
        tracking = _per_joint(cfg.max_tracking_error, n, "max_tracking_error", np.inf)
        return cls(
            lower,
            upper,
            max_step,
            cfg.on_nonfinite,
            cfg.on_position_limit,
            cfg.on_jump,
            cfg.on_workspace,
            workspace,
            joint_names,
            tracking,
        )

    # -- state ---------------------------------------------------------------------------------

    def reset(self, position: np.ndarray) -> None:
        """Start from the measured joint ``position [A]``; clears a latched stop.

        A joint resting just outside its limits (by at most one step, e.g. an
        arm parked at a limit plus sensor noise) is accepted: the reference is
        clipped into the limits, one step from where the arm is.

        Raises:
            ValueError: if ``position`` is non-finite, further outside the joint
                limits, or (with a workspace) outside the box, naming the joint
                and values: the run must not start from a pose the envelope cannot hold.
        """
        q = np.asarray(position, dtype=np.float64).reshape(-1)
        if q.shape != (self.num_joints,):
            raise ValueError(f"safety: start position has {q.shape[0]} joints, expected {self.num_joints}")
        if not np.isfinite(q).all():
            raise ValueError(f"safety: start position is not finite: {q.tolist()}")
        slack = np.where(np.isfinite(self.max_step), self.max_step, 0.0) + 1e-6
        out = np.nonzero((q < self.lower - slack) | (q > self.upper + slack))[0]
        if out.size:
            detail = ", ".join(
                f"{self.joint_names[j]}={q[j]:.4g} not in [{self.lower[j]:.4g}, {self.upper[j]:.4g}]" for j in out
            )
            raise ValueError(
                f"safety: the robot starts outside the joint limits ({detail}); move it inside or widen "
                "safety.position_lower / safety.position_upper"
            )
        q = np.clip(q, self.lower, self.upper)
        if self.workspace is not None and not self.workspace.contains(q):
            ee = self.workspace.end_effector(q)
            raise ValueError(
                f"safety: the end effector starts outside the workspace box (at {np.round(ee, 4).tolist()}, box "
                f"{self.workspace.low.tolist()}..{self.workspace.high.tolist()}); move the arm or widen safety.workspace"
            )
        self.reference = q.copy()
        self.stop_reason = None

    def hold(self) -> np.ndarray:
        """The hold command ``[1, A]``: the last accepted target.

        Raises:
            RuntimeError: before :meth:`reset`.
        """
        if self.reference is None:
            raise RuntimeError("SafetyEnvelope.hold() before reset(): no reference position")
        return self.reference[None].copy()

    @property
    def stopped(self) -> bool:
        """True once a ``stop`` response has latched (until :meth:`reset`)."""
        return self.stop_reason is not None

    def latch_stop(self, reason: str) -> None:
        """Latch the stopped state (used by the watchdog); only holds pass afterwards."""
        if self.stop_reason is None:
            self.stop_reason = reason
            log.error("safety: STOP latched: %s", reason)

    # -- filtering -----------------------------------------------------------------------------

    def filter(self, targets: np.ndarray, step: int = 0, measured: np.ndarray | None = None) -> FilterResult:
        """Return the part of ``targets [n, A]`` (or ``[A]``) that may reach the arm.

        ``measured [A]`` is the newest measured position (for the tracking
        band; ignored when it is None or not finite).

        Accepting a chunk advances the reference to its point 0 (the command
        executed this tick). Never raises on bad values; raises only for a
        wrongly shaped input or a call before :meth:`reset`.

        Raises:
            ValueError: if ``targets`` is not ``[n, A]`` with this robot's A.
            RuntimeError: before :meth:`reset`.
        """
        hold = self.hold()
        band = None
        if measured is not None and np.isfinite(self.max_tracking_error).any():
            m = np.asarray(measured, dtype=np.float64).reshape(-1)
            if m.shape == (self.num_joints,) and np.isfinite(m).all():
                band = (m - self.max_tracking_error, m + self.max_tracking_error)
        chunk = np.asarray(targets, dtype=np.float64)
        if chunk.ndim == 1:
            chunk = chunk[None]
        if chunk.ndim != 2 or chunk.shape[1] != self.num_joints or chunk.shape[0] < 1:
            raise ValueError(f"safety: command must be [n, {self.num_joints}], got {list(chunk.shape)}")
        if self.stopped:
            return FilterResult(hold, True, True, True, [])
        events: list[Violation] = []
        accepted: list[np.ndarray] = []
        prev = self.reference
        modified = False
        for i, point in enumerate(chunk):
            q, response = self._check_point(point, prev, step, i, events, band)
            if response is not None:  # hold or stop: drop this point and the rest
                modified = True
                if response is OnViolation.STOP:
                    self.latch_stop(f"{events[-1].kind} at step {step}, point {i}")
                break
            modified |= not np.array_equal(q, point)
            accepted.append(q)
            prev = q
        for v in events:
            self.add_violation(v)
        if not accepted:
            return FilterResult(hold, True, True, self.stopped, events)
        if self.stopped:  # a later point stopped the run: send nothing new
            return FilterResult(hold, True, True, True, events)
        out = np.stack(accepted)
        self.reference = out[0].copy()
        return FilterResult(out, modified or len(accepted) < len(chunk), False, False, events)

    def _check_point(
        self,
        point: np.ndarray,
        prev: np.ndarray,
        step: int,
        i: int,
        events: list[Violation],
        band: tuple[np.ndarray, np.ndarray] | None,
    ) -> tuple[np.ndarray, OnViolation | None]:
        """Check one point against ``prev``; return (safe point, None) or (_, HOLD/STOP)."""
        bad = np.nonzero(~np.isfinite(point))[0]
        if bad.size:
            self._record(events, "nonfinite", step, i, bad, point[bad], "finite values", self.on_nonfinite)
            return prev, self.on_nonfinite
        q = point
        out = np.nonzero((q < self.lower) | (q > self.upper))[0]
        if out.size:
            limits = "; ".join(f"[{self.lower[j]:.4g}, {self.upper[j]:.4g}]" for j in out)
            self._record(events, "position_limit", step, i, out, q[out], limits, self.on_position_limit)
            if self.on_position_limit is OnViolation.STOP:
                return prev, OnViolation.STOP
            q = np.clip(q, self.lower, self.upper)
        if band is not None:
            far = np.nonzero((q < band[0]) | (q > band[1]))[0]
            if far.size:
                limits = "; ".join(f"|target - measured| <= {self.max_tracking_error[j]:.4g}" for j in far)
                self._record(events, "tracking", step, i, far, q[far], limits, OnViolation.CLAMP)
                q = np.clip(np.clip(q, band[0], band[1]), self.lower, self.upper)
        delta = q - prev
        big = np.nonzero(np.abs(delta) > self.max_step + _EPS)[0]
        if big.size:
            limits = "; ".join(f"|step| <= {self.max_step[j]:.4g}" for j in big)
            self._record(events, "jump", step, i, big, delta[big], limits, self.on_jump)
            if self.on_jump is OnViolation.STOP:
                return prev, OnViolation.STOP
            q = prev + np.clip(delta, -self.max_step, self.max_step)
        if self.workspace is not None and not self.workspace.contains(q):
            ee = self.workspace.end_effector(q)
            box = f"{self.workspace.low.tolist()}..{self.workspace.high.tolist()}"
            self._record(events, "workspace", step, i, np.arange(0), ee, box, self.on_workspace)
            if self.on_workspace is OnViolation.STOP:
                return prev, OnViolation.STOP
            q = self.workspace.clamp_segment(prev, q)
        return q, None

    def add_violation(self, v: Violation) -> None:
        """Count, keep (up to the cap) and log (rate-limited) one violation."""
        self.violation_counts[v.kind] += 1
        if len(self.violations) < MAX_KEPT_VIOLATIONS:
            self.violations.append(v)
        now = time.monotonic()
        if now - self._last_log.get(v.kind, -1e9) < LOG_INTERVAL_S and v.response != "stopped":
            self._suppressed[v.kind] += 1
            return
        self._last_log[v.kind] = now
        more = (
            f" (+{self._suppressed.pop(v.kind)} similar in the last {LOG_INTERVAL_S:.0f} s)"
            if self._suppressed[v.kind]
            else ""
        )
        names = (
            [self.joint_names[j] for j in v.joints]
            if v.joints
            else ["(end effector)" if v.kind == "workspace" else "-"]
        )
        log.warning(
            "safety: %s at step %d point %d %s: values %s, limits %s -> %s%s",
            v.kind,
            v.step,
            v.point,
            names,
            [round(x, 6) for x in v.values],
            v.limits,
            v.response,
            more,
        )

    def _record(
        self,
        events: list[Violation],
        kind: str,
        step: int,
        point: int,
        joints: np.ndarray,
        values: np.ndarray,
        limits: str,
        response: OnViolation,
    ) -> None:
        word = {OnViolation.CLAMP: "clamped", OnViolation.HOLD: "held", OnViolation.STOP: "stopped"}[response]
        events.append(
            Violation(kind, step, point, tuple(int(j) for j in joints), tuple(float(x) for x in values), limits, word)
        )
