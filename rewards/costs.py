"""Constraint costs: named reward terms computed per step from the env's privileged signals.

Each cost is ``>= 0`` and ``float32 [B]`` per step, registered in :data:`rewards.terms.REWARDS`, so
PPO can use it as a penalty (``--reward.terms '{env: 1.0, collision: -0.5}'``) and GRAPE's
alignment sums it per task stage into ``R_ext`` (:mod:`vla_rl.align`). They read
``StepInput.signals`` (:class:`sim.single.StepOut`; docs/sim.md lists what each backend reports); a
cost whose signal the env does not report raises :class:`rewards.terms.RewardTermError` naming the
cost, the env id and the signals it has.

=======================  =====================================================================
cost                     per step
=======================  =====================================================================
``collision``            1 while the arm or the held object touches a non-target object
``table_force``          normal contact force of the arm on the table (N)
``path_length``          distance the end effector moved (m; summed: the EE path length)
``episode_steps``        1 (summed: the episode's steps)
``joint_limit``          ``max(0, 1 - margin / 0.1)``: grows from 0 to 1 as a joint comes within
                         10% of its range of a limit (``joint_limit_margin`` signal)
``action_jerk``          ``|a_h - 2 a_{h-1} + a_{h-2}|^2`` inside the executed chunk (0 for its
                         first two steps)
``keypoint_obstacle``    stage-wise keypoint clearance: ``sum max(0, 0.06 - d)`` over keypoints and
                         obstacles, ``d`` their distance (m); the keypoints are the end effector,
                         and from the grasp stage on the held object too (:class:`KeypointProvider`)
``keypoint_target``      distance of the end effector to the target object (m) until the task's
                         first stage (reach) holds, then 0: summed, how far and how long the arm was
                         off its object before reaching it (an arm that goes for another object never
                         reaches, and pays on every step)
=======================  =====================================================================

Keypoints come from a :class:`KeypointProvider`; the default (:class:`PrivilegedKeypoints`) reads
positions from the privileged signals. A vision-language keypoint proposer plugs in by implementing
the same interface (it receives the step's decision observation with the camera images).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from rewards.terms import REWARDS, RewardTerm, RewardTermError, StepInput

STAGE_SIGNAL = "stage_progress"
JOINT_LIMIT_ZONE = 0.1  # fraction of a joint's range next to a limit where ``joint_limit`` grows
CLEARANCE = 0.06  # m a keypoint should keep from an obstacle
MAX_OBSTACLES = 8  # obstacle<k>_* signals read at most this many obstacles


def signal(step: StepInput, name: str, cost: str) -> Tensor:
    """``float32 [B]``: signal ``name`` of ``step``.

    Raises:
        RewardTermError: if the env does not report it (names the cost, the env id and its signals).
    """
    try:
        return step.signals[name].float()
    except KeyError:
        have = ", ".join(sorted(step.signals)) or "(none)"
        raise RewardTermError(
            f"cost {cost!r} needs the privileged signal {name!r}, which env {step.env_id} does not report; "
            f"its signals: {have} (docs/sim.md lists each backend's)"
        ) from None


def require_stages(step: StepInput, cost: str) -> Tensor:
    """``float32 [B]`` stage progress of ``step`` (the leading task stages that hold).

    Raises:
        RewardTermError: if the env's task declares no stage predicates (names the task's env id).
    """
    if STAGE_SIGNAL not in step.signals:
        raise RewardTermError(
            f"cost {cost!r} is stage-wise, but task {step.env_id} declares no stage predicates (no "
            f"{STAGE_SIGNAL!r} signal); stage-wise costs run on tasks with stages, e.g. mujoco/* (docs/sim.md)"
        )
    return step.signals[STAGE_SIGNAL].float()


@dataclass(frozen=True)
class SignalCost:
    """A cost that is one signal, optionally turned into a 0/1 indicator of ``> 0``."""

    name: str
    signal_name: str
    indicator: bool = False

    def __call__(self, step: StepInput) -> Tensor:
        value = signal(step, self.signal_name, self.name)
        return (value > 0).float() if self.indicator else value.clamp_min(0.0)


@REWARDS.register("collision", help="cost: 1 while the arm or held object touches a non-target object")
def collision() -> RewardTerm:
    """1 on steps where the arm or the held object touches a non-target object (``collision`` signal)."""
    return SignalCost("collision", "collision", indicator=True)


@REWARDS.register("table_force", help="cost: normal contact force of the arm on the table (N)")
def table_force() -> RewardTerm:
    """The arm's normal contact force on the table in newtons (``table_force`` signal)."""
    return SignalCost("table_force", "table_force")


@REWARDS.register("path_length", help="cost: distance the end effector moved this step (m)")
def path_length() -> RewardTerm:
    """The end effector's displacement this step in metres (``ee_step`` signal); sums to the path length."""
    return SignalCost("path_length", "ee_step")


@dataclass(frozen=True)
class EpisodeSteps:
    """1 per executed step: summed over an episode, its length (held steps are masked by the composer)."""

    def __call__(self, step: StepInput) -> Tensor:
        return torch.ones(step.action.shape[0], dtype=torch.float32)


@REWARDS.register("episode_steps", help="cost: 1 per step (sums to the episode length)")
def episode_steps() -> RewardTerm:
    """1 on every executed step, so the term sums to the episode's length (a time cost)."""
    return EpisodeSteps()


@dataclass(frozen=True)
class JointLimit:
    """``max(0, 1 - margin / zone)`` of the ``joint_limit_margin`` signal (see the module doc)."""

    zone: float = JOINT_LIMIT_ZONE

    def __call__(self, step: StepInput) -> Tensor:
        margin = signal(step, "joint_limit_margin", "joint_limit")
        return (1.0 - margin / self.zone).clamp_min(0.0)


@REWARDS.register("joint_limit", help="cost: 0..1 as a joint comes within 10% of its range of a limit")
def joint_limit() -> RewardTerm:
    """Joint-limit proximity: 0 away from the limits, 1 at a limit (see the module doc)."""
    return JointLimit()


@dataclass(frozen=True)
class ActionJerk:
    """Squared second difference of the executed actions inside the chunk (see the module doc)."""

    def __call__(self, step: StepInput) -> Tensor:
        b = step.action.shape[0]
        if step.executed is None or step.step < 2:
            return torch.zeros(b, dtype=torch.float32)
        a = step.executed[:, step.step - 2 : step.step + 1].float()  # [B, 3, A]
        return (a[:, 2] - 2 * a[:, 1] + a[:, 0]).square().sum(-1)


@REWARDS.register("action_jerk", help="cost: squared second difference of the executed actions")
def action_jerk() -> RewardTerm:
    """Action jerk inside the executed chunk: ``|a_h - 2 a_{h-1} + a_{h-2}|^2`` (0 for the first two steps)."""
    return ActionJerk()


@dataclass
class Keypoints:
    """What a :class:`KeypointProvider` returns for one step of ``B`` envs.

    Attributes:
        points: ``float32 [B, K, 3]`` keypoints (m); ``point_mask [B, K]`` which are present.
        obstacles: ``float32 [B, M, 3]`` obstacle points (m); ``obstacle_mask [B, M]`` which are present.
    """

    points: Tensor
    point_mask: Tensor
    obstacles: Tensor
    obstacle_mask: Tensor


class KeypointProvider(Protocol):
    """Where keypoints come from: ``provider(step, stage) -> Keypoints`` for one step.

    ``stage`` is the step's stage progress ``[B]`` (the leading stages that hold), so a provider can
    change its keypoints per stage (the held object counts from the grasp on). The default reads
    privileged sim state (:class:`PrivilegedKeypoints`); a vision-language proposer reads
    ``step.obs`` (the camera images of the decision) instead.
    """

    def __call__(self, step: StepInput, stage: Tensor) -> Keypoints: ...


def _xyz(step: StepInput, prefix: str, cost: str) -> Tensor:
    return torch.stack([signal(step, f"{prefix}_{a}", cost) for a in "xyz"], dim=-1)


@dataclass(frozen=True)
class PrivilegedKeypoints:
    """Keypoints from the privileged signals: the end effector (``ee_*``), and the target object
    (``target_*``) once the stage progress reaches ``held_from_stage`` (2 = past reach and grasp);
    obstacles ``obstacle<k>_*`` for ``k < obstacle_count``."""

    held_from_stage: int = 2

    def __call__(self, step: StepInput, stage: Tensor) -> Keypoints:
        cost = "keypoint_obstacle"
        ee, target = _xyz(step, "ee", cost), _xyz(step, "target", cost)
        count = signal(step, "obstacle_count", cost)
        ks = [k for k in range(MAX_OBSTACLES) if f"obstacle{k}_x" in step.signals]
        b = ee.shape[0]
        obstacles = torch.stack([_xyz(step, f"obstacle{k}", cost) for k in ks], 1) if ks else torch.zeros(b, 0, 3)
        return Keypoints(
            points=torch.stack([ee, target], 1),
            point_mask=torch.stack([torch.ones(b, dtype=torch.bool), stage >= self.held_from_stage], 1),
            obstacles=obstacles,
            obstacle_mask=torch.arange(len(ks))[None, :] < count[:, None],
        )


@dataclass(frozen=True)
class KeypointObstacle:
    """Stage-wise keypoint clearance cost ``sum max(0, clearance - |p - o|)`` (see the module doc)."""

    provider: KeypointProvider = PrivilegedKeypoints()
    clearance: float = CLEARANCE

    def __call__(self, step: StepInput) -> Tensor:
        stage = require_stages(step, "keypoint_obstacle")
        kp = self.provider(step, stage)
        dist = torch.cdist(kp.points.float(), kp.obstacles.float())  # [B, K, M]
        mask = kp.point_mask[:, :, None] & kp.obstacle_mask[:, None, :]
        return torch.where(mask, (self.clearance - dist).clamp_min(0.0), 0.0).sum((1, 2))


@REWARDS.register("keypoint_obstacle", help="cost: stage-wise clearance shortfall of keypoints from obstacles (m)")
def keypoint_obstacle() -> RewardTerm:
    """Keypoint-to-obstacle clearance per stage with the privileged keypoint provider (see the module doc)."""
    return KeypointObstacle()


@dataclass(frozen=True)
class KeypointTarget:
    """Stage-wise approach cost: ``|ee - target|`` while no task stage holds yet, else 0 (see the module doc)."""

    def __call__(self, step: StepInput) -> Tensor:
        stage = require_stages(step, "keypoint_target")
        dist = (_xyz(step, "ee", "keypoint_target") - _xyz(step, "target", "keypoint_target")).norm(dim=-1)
        return torch.where(stage < 1, dist, 0.0)


@REWARDS.register("keypoint_target", help="cost: distance of the end effector to the target object before reach (m)")
def keypoint_target() -> RewardTerm:
    """The end effector's distance to the target object until the reach stage holds (see the module doc)."""
    return KeypointTarget()


COSTS: tuple[str, ...] = (
    "collision", "table_force", "path_length", "episode_steps", "joint_limit", "action_jerk", "keypoint_obstacle",
    "keypoint_target",
)
"""The constraint costs registered here, in the order reports list them."""


def check_costs(names: list[str]) -> None:
    """Raise ``ValueError`` listing the valid costs if any of ``names`` is not one."""
    bad = [n for n in names if n not in COSTS]
    if bad:
        raise ValueError(f"unknown cost term(s) {', '.join(map(repr, bad))}; valid cost terms: {', '.join(COSTS)}")
