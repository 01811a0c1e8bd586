"""A simulated operator for RaC data collection: watches privileged state, recovers, corrects, hands back.

It stands in for a person at the teleop device (tests, benchmarks, users with
no device) on the MuJoCo tabletop (``mujoco/*``). Per env and step it reads
the observation (the end-effector state and, privileged, the cube poses:
:func:`sim.mujoco_tasks.privileged.observed_state`) and either lets the
policy act or returns its own action with a label:

1. **watch** (``policy``): it flags imminent failure when the hand goes for
   the wrong cube (the pinch point within ``wrong_radius`` of another cube,
   or holding it), the grasp missed (gripper closed low over the table for
   ``miss_steps`` steps without holding the sub-task's cube), the held cube
   was dropped (held and lifted, then no longer held before its sub-goal), or
   no stage of the task was newly reached for ``patience`` steps;
2. after ``reaction_delay`` more steps (the policy keeps acting) it takes over;
3. **recovery** (``recovery``): it drives the arm, gripper open, back toward
   a state visited earlier in this episode: the most recent pinch point at
   least ``min_back_steps`` old, at least ``recovery_clearance`` above the
   table, from a step at the current sub-task's starting progress (else any
   such point, else the episode's first), until within
   ``recovery_tolerance`` or ``max_recovery_steps`` steps. The simulator is
   never reset or teleported: a person cannot do that;
4. **correction** (``correction``): the scripted expert
   (:class:`sim.mujoco_tasks.expert.ScriptedExpert`) completes the current
   sub-task, starting (``correct_from``) either from its first phase
   (``approach``: hover above the cube, then down, which backs off by
   itself) or from the state as it is (``here``: holding the cube it goes on
   lifting, else straight to the cube; :meth:`ScriptedExpert.resume`); on a long-horizon task it hands back once the next
   sub-task begins (the cube released, the hand risen), on a single-skill task
   it finishes the episode.

Operator actions get Gaussian noise of std ``action_noise`` on the motion
components (clipped to the action box), like a person's hand. With
``recover=False`` it skips step 3 (corrections without recovery, DAgger-style).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.mujoco_tasks.expert import ScriptedExpert
from sim.mujoco_tasks.privileged import observed_state
from sim.mujoco_tasks.tasks import CUBE_HALF, STAGES, Task, TaskState, stage_progress, subtask
from vla_core.labels import Label

OPEN = -1.0
CORRECT_FROM = ("approach", "here")


@dataclass
class OperatorConfig:
    """How the simulated operator behaves (module doc)."""

    reaction_delay: int = 2
    """Steps between noticing a failure and taking over (the policy keeps acting meanwhile)."""
    action_noise: float = 0.05
    """Std of Gaussian noise on the operator's motion commands (action units, clipped to [-1, 1])."""
    recover: bool = True
    """Drive back to an earlier state before correcting (RaC); False corrects at once (DAgger-style)."""
    patience: int = 30
    """Steps without reaching a new stage of the task before it counts as stuck."""
    miss_steps: int = 2
    """Steps the gripper must be closed low over the table, holding nothing, to count as a missed grasp."""
    wrong_radius: float = 0.04
    """Metres: the pinch point this close to a cube other than the sub-task's is going for the wrong one."""
    recovery_clearance: float = 0.07
    """Metres: recovery targets are earlier pinch points at least this high above the table."""
    recovery_tolerance: float = 0.02
    """Metres: recovery ends this close to its target."""
    max_recovery_steps: int = 15
    """Recovery ends after this many steps even short of its target."""
    min_back_steps: int = 3
    """A recovery target is at least this many steps old."""
    correct_from: str = "approach"
    """Where the correction starts: ``approach`` (the expert's first phase, hovering above the cube first) or
    ``here`` (from the state as it is, no backing off: :meth:`~sim.mujoco_tasks.expert.ScriptedExpert.resume`)."""
    max_takeovers: int = 3
    """Takeovers per episode at most (then the policy is left alone)."""
    max_step: float = 0.04
    """The env's metres per unit action (``--env.max_step`` of ``mujoco/*``; used where the operator is built
    from this config alone, as in RaC rounds)."""

    def __post_init__(self) -> None:
        for name in ("reaction_delay", "patience", "miss_steps", "max_recovery_steps", "min_back_steps",
                     "max_takeovers"):
            if getattr(self, name) < 0:
                raise ValueError(f"operator.{name} must be >= 0, got {getattr(self, name)}")
        if self.action_noise < 0:
            raise ValueError(f"operator.action_noise must be >= 0, got {self.action_noise}")
        if self.correct_from not in CORRECT_FROM:
            raise ValueError(f"operator.correct_from must be one of {', '.join(CORRECT_FROM)}, got {self.correct_from!r}")


class SimulatedOperator:
    """One env's simulated operator (module doc); call :meth:`reset` at every episode start.

    Args:
        cfg: behaviour settings.
        max_step: the env's metres per unit action (``MujocoOptions.max_step``).
        seed: seed of the action noise.
    """

    def __init__(self, cfg: OperatorConfig, max_step: float, seed: int = 0) -> None:
        self.cfg = cfg
        self.max_step = max_step
        self.rng = np.random.default_rng(seed)
        self.expert = ScriptedExpert(max_step)
        self.reset()

    def reset(self) -> None:
        """Forget the episode: history, mode, counters."""
        self.mode = "watch"
        self.history: list[tuple[np.ndarray, int]] = []  # (pinch point, stage progress) per step
        self.best = -1
        self.since_best = 0
        self.missed = 0
        self.was_lifted = False
        self.countdown = 0
        self.takeovers = 0
        self.failures: list[str] = []
        self.goal: np.ndarray | None = None
        self.recovery_steps = 0
        self.sub_at_takeover = 0
        self.released = False

    # ---------------------------------------------------------------- step

    def act(self, state: np.ndarray, env_state: np.ndarray) -> tuple[np.ndarray | None, Label]:
        """The operator's action for this step (None: the policy acts) and the step's label.

        Args:
            state: the env's ``observation.state`` row ``[11]``.
            env_state: its ``observation.env_state`` row ``[13]`` (privileged).
        """
        task, s, closure = observed_state(state, env_state)
        progress = stage_progress(task, s)
        self.history.append((s.pinch.copy(), progress))
        if progress > self.best:
            self.best, self.since_best = progress, 0
        else:
            self.since_best += 1
        if self.mode == "watch":
            failure = self._failure(task, s, closure)
            if failure and self.takeovers < self.cfg.max_takeovers:
                self.failures.append(failure)
                self.mode, self.countdown = "pending", self.cfg.reaction_delay
        if self.mode == "pending":
            if self.countdown > 0:
                self.countdown -= 1
                return None, Label.POLICY
            self._take_over(task, s, closure)
        if self.mode == "recovery":
            action = self._recover(s)
            if action is not None:
                return self._noisy(action), Label.RECOVERY
            self._start_correction(task, s, closure)
        if self.mode == "correction":
            action = self._correct(task, s, closure)
            if action is not None:
                return self._noisy(action), Label.CORRECTION
        return None, Label.POLICY

    # ---------------------------------------------------------------- watch

    def _failure(self, task: Task, s: TaskState, closure: float) -> str:
        """The name of the imminent failure seen on ``s``, or ``""``."""
        sub, _ = subtask(task, s)
        target = sub.cube
        others = [j for j in range(3) if j != target and j != sub.base]
        if task.kind == "sequence":
            others = [j for j in range(3) if j not in (task.cube, task.base)]
        for j in others:
            if np.linalg.norm(s.pinch - s.cubes[j]) < self.cfg.wrong_radius or s.grasped[j]:
                return "wrong_object"
        held = bool(s.grasped[target])
        lifted = held and s.cubes[target][2] - CUBE_HALF > 0.02
        if sub.kind != "push":
            low = s.pinch[2] < 2 * CUBE_HALF + 0.01
            self.missed = self.missed + 1 if (closure > 0.5 and low and not s.grasped.any()) else 0
            if self.missed >= self.cfg.miss_steps:
                self.missed = 0
                return "missed_grasp"
            if self.was_lifted and not held and not self._near_goal(task, s):
                self.was_lifted = False
                return "dropped"
            self.was_lifted = lifted or (self.was_lifted and held)
        if self.since_best >= self.cfg.patience:
            self.since_best = 0
            return "no_progress"
        return ""

    @staticmethod
    def _near_goal(task: Task, s: TaskState) -> bool:
        """The sub-task's cube was let go at (or near) where it belongs: a release, not a drop."""
        sub, _ = subtask(task, s)
        if sub.kind == "pick":
            return False
        cube = s.cubes[sub.cube]
        base = s.pad if sub.base >= 3 or sub.base < 0 else s.cubes[sub.base]
        return bool(np.linalg.norm(cube[:2] - base[:2]) < 0.03)

    # ---------------------------------------------------------------- takeover

    def _take_over(self, task: Task, s: TaskState, closure: float) -> None:
        self.takeovers += 1
        _, self.sub_at_takeover = subtask(task, s)
        self.released = False
        if self.cfg.recover:
            self.mode, self.goal, self.recovery_steps = "recovery", self._recovery_goal(task, s), 0
        else:
            self._start_correction(task, s, closure)

    def _recovery_goal(self, task: Task, s: TaskState) -> np.ndarray:
        """An earlier pinch point to return to (module doc, step 3)."""
        _, k = subtask(task, s)
        start = STAGES[task.kind].index("reach2") if (task.kind == "sequence" and k == 1) else 0
        old = self.history[: max(0, len(self.history) - self.cfg.min_back_steps)]
        high = [(p, prog) for p, prog in old if p[2] >= self.cfg.recovery_clearance]
        for p, prog in reversed(high):
            if prog == start:
                return p.copy()
        if high:
            return high[-1][0].copy()
        return self.history[0][0].copy()

    def _recover(self, s: TaskState) -> np.ndarray | None:
        assert self.goal is not None
        if (np.linalg.norm(self.goal - s.pinch) < self.cfg.recovery_tolerance
                or self.recovery_steps >= self.cfg.max_recovery_steps):
            return None
        self.recovery_steps += 1
        delta = self.goal - s.pinch
        if s.pinch[2] < self.cfg.recovery_clearance - 0.01:
            delta[:2] *= 0.3  # rise first, then move sideways: no sweeping through the cubes
        return np.array([*np.clip(delta / self.max_step, -1.0, 1.0), OPEN])

    def _start_correction(self, task: Task, s: TaskState, closure: float) -> None:
        self.mode = "correction"
        if self.cfg.correct_from == "here":
            self.expert.resume(task, s, closure)
        else:
            self.expert.reset()

    def _correct(self, task: Task, s: TaskState, closure: float) -> np.ndarray | None:
        _, k = subtask(task, s)
        if k > self.sub_at_takeover and self.expert.phase == "approach" and self.expert.subtask == k:
            self._hand_back()
            return None
        return self.expert.act(task, s, closure, s.pinch.copy())

    def _hand_back(self) -> None:
        self.mode = "watch"
        self.best, self.since_best, self.missed, self.was_lifted = -1, 0, 0, False

    def _noisy(self, action: np.ndarray) -> np.ndarray:
        out = np.asarray(action, dtype=np.float32).copy()
        if self.cfg.action_noise > 0:
            out[:3] += self.rng.normal(0.0, self.cfg.action_noise, size=3).astype(np.float32)
        return np.clip(out, -1.0, 1.0)


def count_recoveries(progress: list[int]) -> int:
    """Recovery manoeuvres in one episode's per-step stage progress: how often progress fell below a level it had
    reached and later regained that level (a lost or failed grasp, then a successful retry).

    ``[0, 1, 2, 1, 0, 1, 2, 3]`` has one; ``[0, 1, 2, 3]`` none; a fall never regained counts nothing.
    """
    count, peak, fell = 0, -1, False
    for p in progress:
        if p > peak:
            peak = p if not fell else peak
        if fell and p >= peak:
            count, fell = count + 1, False
            peak = p
        elif p < peak:
            fell = True
    return count
