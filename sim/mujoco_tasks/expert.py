"""Scripted experts for every tabletop task, from privileged simulator state.

A small state machine per task kind, re-planned from the current cube poses
at every step (so a slipped grasp or a drifting push is corrected):

- pick: hover above the cube, descend with the gripper open, close, lift;
- stack: pick, carry above the lower cube, lower until the held cube sits
  4 mm above it, open, back off upwards;
- push: close the gripper, go down behind the cube on the line from the pad
  through the cube, push along that line (re-aimed every step), stop when
  the cube is on the pad centre;
- sequence (long-horizon): the stack machine on the current sub-task
  (:func:`sim.mujoco_tasks.tasks.subtask`): first onto a virtual cube under
  the pad (places the cube on the pad), then (after releasing and rising)
  the second cube onto the first; knocked off the pad, it starts over.

Actions are ``(goal - reference) / max_step``, clipped. The env passes the
measured pinch point as the reference (not the controller's integrated target,
which a policy cannot observe), so the expert is a function of the observation
plus the cube poses: what an imitating policy needs.
"""

from __future__ import annotations

import numpy as np

from sim.mujoco_tasks.tasks import CUBE_HALF, Task, TaskState, subtask, with_pad_base

OPEN, CLOSE = -1.0, 1.0
HOVER = 0.07  # m above the cube centre before descending
GRASP_DEPTH = 0.0  # m, pinch point relative to the cube centre when closing
CARRY_CLEARANCE = 0.05  # m the held cube's bottom clears the lower cube's top while carrying
LIFT_Z = 0.14  # m, pinch height for pick
PUSH_Z = 0.018  # m, pinch height while pushing (fingertips just above the table)
PUSH_BACKOFF = 0.055  # m behind the cube centre where the closed fingers start
PUSH_LEAD = 0.025  # m the push goal runs ahead of the contact point
CLOSE_STEPS = 4  # control steps the gripper gets to close
RELEASE_STEPS = 3
HELD_RADIUS = 0.035  # m: the cube centre this close to the pinch point counts as held


class ScriptedExpert:
    """Per-env expert with a little memory (phase and a step counter).

    Args:
        max_step: the env's metres per unit action (to normalize actions).
    """

    def __init__(self, max_step: float) -> None:
        self.max_step = max_step
        self.reset()

    def reset(self) -> None:
        """Forget the phase; call at every episode start."""
        self.phase = "approach"
        self.count = 0
        self.subtask = 0

    def resume(self, task: Task, s: TaskState, closure: float) -> None:
        """Take over from the state as it is, pushing the (sub-)task forward with no backing off: holding its
        cube, go on lifting it (then carry, lower, release); otherwise go straight to the cube with the gripper
        open, skipping the hover above it that :meth:`reset` starts with. Push tasks start as after reset.

        This is how a corrector that does not first recover behaves (HG-DAgger-style corrections,
        :mod:`vla_rl.intervention.operator`); the expert's own retries (a dropped cube: approach again) apply.
        """
        self.reset()
        if task.kind == "sequence":
            task, self.subtask = subtask(task, s)
        if task.kind == "push":
            return
        held = closure > 0.5 and float(np.linalg.norm(s.cubes[task.cube] - s.pinch)) < HELD_RADIUS
        self._set("lift" if held else "descend")

    def act(self, task: Task, s: TaskState, closure: float, target: np.ndarray) -> np.ndarray:
        """The next action ``float32 [4]`` for ``task`` in state ``s``.

        Args:
            task: the current task.
            s: privileged state (cube poses, pinch point, contacts).
            closure: gripper closure, 0 open .. 1 closed.
            target: the controller's current pinch target ``[3]``.
        """
        if task.kind == "sequence":
            sub, k = subtask(task, s)
            if k != self.subtask:  # placed (release the cube and rise first) or knocked off the pad (start over)
                self._set("release" if k > self.subtask else "approach")
                self.subtask = k
            elif self.phase == "retreat" and self.count >= RELEASE_STEPS:
                self._set("approach")
            goal, grip = self._pick_place(sub, with_pad_base(s) if k == 0 else s, closure)
        elif task.kind == "push":
            goal, grip = self._push(task, s)
        else:
            goal, grip = self._pick_place(task, s, closure)
        delta = np.clip((goal - target) / self.max_step, -1.0, 1.0)
        return np.array([*delta, grip], dtype=np.float32)

    def _set(self, phase: str) -> None:
        self.phase, self.count = phase, 0

    def _pick_place(self, task: Task, s: TaskState, closure: float) -> tuple[np.ndarray, float]:
        cube = s.cubes[task.cube]
        self.count += 1
        held = np.linalg.norm(cube - s.pinch) < HELD_RADIUS
        if self.phase in ("lift", "carry", "lower") and not held:
            self._set("approach")  # dropped it: start over
        if self.phase == "approach":
            goal = cube + [0.0, 0.0, HOVER]
            if np.linalg.norm((goal - s.pinch)[:2]) < 0.012 and abs(goal[2] - s.pinch[2]) < 0.03:
                self._set("descend")
            return goal, OPEN
        if self.phase == "descend":
            goal = cube + [0.0, 0.0, GRASP_DEPTH]
            if np.linalg.norm(goal - s.pinch) < 0.012 or self.count > 10:
                self._set("close")
            return goal, OPEN
        if self.phase == "close":
            if self.count >= CLOSE_STEPS:
                self._set("lift")
            return cube + [0.0, 0.0, GRASP_DEPTH], CLOSE
        if task.kind == "pick":
            return np.array([cube[0], cube[1], LIFT_Z]), CLOSE
        base = s.cubes[task.base]
        above = base + [0.0, 0.0, 2 * CUBE_HALF]  # where the held cube's centre should end up
        offset = s.pinch - cube  # keeps the grasp offset out of the placement error
        if self.phase == "lift":
            carry_z = base[2] + 3 * CUBE_HALF + CARRY_CLEARANCE + offset[2]
            goal = np.array([s.pinch[0], s.pinch[1], carry_z])
            if s.pinch[2] > carry_z - 0.02:
                self._set("carry")
            return goal, CLOSE
        if self.phase == "carry":
            goal = np.array([above[0] + offset[0], above[1] + offset[1], s.pinch[2]])
            if np.linalg.norm(cube[:2] - above[:2]) < 0.008:
                self._set("lower")
            return goal, CLOSE
        if self.phase == "lower":
            goal = above + [0.0, 0.0, 0.004] + offset
            if abs(cube[2] - goal[2] + offset[2]) < 0.004 or self.count > 12:
                self._set("release")
            return goal, CLOSE
        if self.phase == "release":
            if self.count >= RELEASE_STEPS:
                self._set("retreat")
            return s.pinch.copy(), OPEN
        return s.pinch + [0.0, 0.0, 0.05], OPEN  # retreat

    def _push(self, task: Task, s: TaskState) -> tuple[np.ndarray, float]:
        cube = s.cubes[task.cube][:2]
        to_pad = s.pad[:2] - cube
        dist = float(np.linalg.norm(to_pad))
        if dist < 0.012:
            return np.array([*s.pinch[:2], PUSH_Z + 0.06]), CLOSE  # on the pad: back off upwards
        u = to_pad / dist
        start = cube - PUSH_BACKOFF * u
        rel = s.pinch[:2] - cube
        along, across = float(rel @ u), float(abs(rel @ np.array([-u[1], u[0]])))
        aligned = along < -0.02 and across < 0.015
        if self.phase == "push" and not aligned:
            self._set("approach")
        if self.phase == "approach":
            if np.linalg.norm(s.pinch[:2] - start) < 0.012:
                if s.pinch[2] < PUSH_Z + 0.015:
                    self._set("push")
                return np.array([*start, PUSH_Z]), CLOSE
            lift = PUSH_Z if along < -0.04 and across < 0.03 else CUBE_HALF * 2 + 0.04
            return np.array([*start, max(lift, PUSH_Z)]), CLOSE
        contact = cube - (PUSH_BACKOFF - 0.02) * u
        step = min(PUSH_LEAD, dist)
        return np.array([*(contact + step * u), PUSH_Z]), CLOSE
