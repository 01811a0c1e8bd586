"""The language-conditioned task family over the one tabletop scene.

Task ids (without the ``mujoco/`` prefix):

- ``pick-<c>``: pick up the ``<c>`` cube and lift it;
- ``push-<c>-to-pad``: push the ``<c>`` cube onto the yellow pad;
- ``stack-<a>-on-<b>``: put the ``<a>`` cube on top of the ``<b>`` cube;
- ``multi``: one of the tasks above, drawn per episode (uniformly, from all of
  them or from the subset given in the options); the instruction tells which.

Colours are ``red``, ``green``, ``blue``. Success predicates and reward terms
are pure functions of a :class:`TaskState` snapshot, so tests can check them
on hand-built states.

Reward terms (all present for every task, so batches of ``multi`` envs share
keys). Each dense term is built on a potential ``phi`` in ``[0, scale]``:

============  =====  ==========================================================
term          scale  potential ``phi``
============  =====  ==========================================================
``reach``     0.1    ``1 - tanh(10 * |pinch - cube|)`` (pinch point to the cube)
``grasp``     0.2    1 if both fingers touch the cube (pick, stack), else 0
``lift``      0.3    pick: ``clip(height / 0.06, 0, 1)`` while grasped, else 0
``place``     0.3    push: ``1 - tanh(8 * |cube - pad|_xy)``; stack:
                     ``1 - tanh(10 * |cube - goal|)`` (goal: 4 cm above the
                     lower cube) while grasped or within 2 cm of the goal
``success``   1.0    1 on steps where the success predicate holds (sparse)
============  =====  ==========================================================

``reward_mode`` ``potential`` (default) pays ``phi(s') - phi(s)`` per step, so
the dense terms sum to at most 0.9 over an episode and never pay for hovering
short of success (shaping that keeps the optimal policy, Ng et al. 1999);
``absolute`` pays ``phi(s')`` each step (ManiSkill-style dense reward);
``sparse`` zeroes every dense term. The step reward is the sum of the terms.

Stages: every task declares the ordered sub-goals an episode passes through
(:data:`STAGES`), each a predicate on a :class:`TaskState` (:func:`stage_flags`):

=========  ==============================================================
stage      holds when
=========  ==============================================================
``reach``  the pinch point is within 3 cm of the task's cube
``grasp``  both fingers touch the cube (pick, stack)
``touch``  any robot geom touches the cube (push)
``lift``   the grasped cube's bottom is 2 cm or more above the table
``place``  push: the cube centre is within 3.5 cm of the pad (xy), resting;
           stack: the cube is centred over the lower cube (2 cm, xy) and
           within 1 cm of its stacked height
=========  ==============================================================

pick: reach -> grasp -> lift; push: reach -> touch -> place; stack: reach ->
grasp -> lift -> place. :func:`stage_progress` counts the leading stages that
hold now (0 .. number of stages), the milestone label a process reward model
learns and the stage a stage-wise constraint cost applies in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CUBE_COLORS = ("red", "green", "blue")  # order of cubes in the scene and in env_state
CUBE_HALF = 0.02  # m, half edge of every cube (matches assets/tabletop.xml)

REWARD_SCALES = {"reach": 0.1, "grasp": 0.2, "lift": 0.3, "place": 0.3, "success": 1.0}
REWARD_TERMS = tuple(REWARD_SCALES)
REWARD_MODES = ("potential", "absolute", "sparse")
MULTI = "multi"

LIFT_HEIGHT = 0.06  # m the cube's bottom must rise above the table for pick success
HOLD_RADIUS = 0.03  # m: pick success needs the cube centre this close to the pinch point
PUSH_RADIUS = 0.035  # m: push success needs the cube centre this close to the pad centre (xy)
STACK_XY = 0.02  # m: stack success needs the upper cube centred this well over the lower one
RESTING_Z = CUBE_HALF + 0.008  # m: a cube centre below this height rests on the table
STATIC_SPEED = 0.05  # m/s: a stacked cube must move slower than this
REACH_RADIUS = 0.03  # m: the ``reach`` stage holds with the pinch point this close to the cube centre
LIFT_STAGE_HEIGHT = 0.02  # m: the ``lift`` stage holds with the grasped cube's bottom this high

STAGES: dict[str, tuple[str, ...]] = {
    "pick": ("reach", "grasp", "lift"),
    "push": ("reach", "touch", "place"),
    "stack": ("reach", "grasp", "lift", "place"),
}
STAGE_NAMES: tuple[str, ...] = ("reach", "grasp", "touch", "lift", "place")  # union, in order of first use


@dataclass(frozen=True)
class Task:
    """One task of the family.

    Attributes:
        name: task id without the backend prefix, e.g. ``stack-red-on-green``.
        kind: ``pick``, ``push`` or ``stack``.
        cube: index (into ``CUBE_COLORS``) of the cube to move.
        base: stack: index of the cube to stack on; -1 otherwise.
        instruction: the language instruction given to the policy.
        max_episode_steps: default episode length at the default 10 Hz control.
    """

    name: str
    kind: str
    cube: int
    base: int
    instruction: str
    max_episode_steps: int

    @property
    def stages(self) -> tuple[str, ...]:
        """The task's ordered stages (see the module doc)."""
        return STAGES[self.kind]


def _family() -> tuple[Task, ...]:
    tasks = []
    for i, c in enumerate(CUBE_COLORS):
        tasks.append(Task(f"pick-{c}", "pick", i, -1, f"pick up the {c} cube", 50))
    for i, c in enumerate(CUBE_COLORS):
        tasks.append(Task(f"push-{c}-to-pad", "push", i, -1, f"push the {c} cube onto the yellow pad", 80))
    for i, a in enumerate(CUBE_COLORS):
        for j, b in enumerate(CUBE_COLORS):
            if i != j:
                tasks.append(Task(f"stack-{a}-on-{b}", "stack", i, j, f"put the {a} cube on the {b} cube", 60))
    return tuple(tasks)


TASKS: tuple[Task, ...] = _family()
TASK_INDEX: dict[str, int] = {t.name: i for i, t in enumerate(TASKS)}
MULTI_MAX_EPISODE_STEPS = max(t.max_episode_steps for t in TASKS)


def task_names() -> list[str]:
    """Every task id of the family plus ``multi``."""
    return [t.name for t in TASKS] + [MULTI]


@dataclass
class TaskState:
    """What the predicates and rewards read from the simulator (world frame, metres).

    Attributes:
        pinch: ``[3]`` point between the fingertips.
        cubes: ``[3, 3]`` cube centres (red, green, blue).
        cube_speed: ``[3]`` linear speed of each cube (m/s).
        pad: ``[3]`` pad centre on the table.
        grasped: ``[3]`` bool, both fingers touch the cube.
        touched: ``[3]`` bool, any robot geom touches the cube.
    """

    pinch: np.ndarray
    cubes: np.ndarray
    cube_speed: np.ndarray
    pad: np.ndarray
    grasped: np.ndarray
    touched: np.ndarray


def is_success(task: Task, s: TaskState) -> bool:
    """The task's success predicate on state ``s`` (see the module doc for thresholds)."""
    cube = s.cubes[task.cube]
    if task.kind == "pick":
        lifted = cube[2] - CUBE_HALF >= LIFT_HEIGHT
        return bool(lifted and np.linalg.norm(cube - s.pinch) <= HOLD_RADIUS)
    if task.kind == "push":
        return bool(np.linalg.norm(cube[:2] - s.pad[:2]) <= PUSH_RADIUS and cube[2] <= RESTING_Z)
    base = s.cubes[task.base]
    dz = cube[2] - base[2]
    return bool(
        np.linalg.norm(cube[:2] - base[:2]) <= STACK_XY
        and abs(dz - 2 * CUBE_HALF) <= 0.006
        and base[2] <= RESTING_Z
        and not s.touched[task.cube]
        and s.cube_speed[task.cube] <= STATIC_SPEED
    )


def stage_flags(task: Task, s: TaskState) -> dict[str, bool]:
    """Which of the task's stages hold on state ``s`` (keys: ``task.stages``, in order)."""
    cube = s.cubes[task.cube]
    grasped = bool(s.grasped[task.cube])
    holds = {
        "reach": float(np.linalg.norm(s.pinch - cube)) <= REACH_RADIUS,
        "grasp": grasped,
        "touch": bool(s.touched[task.cube]),
        "lift": grasped and cube[2] - CUBE_HALF >= LIFT_STAGE_HEIGHT,
    }
    if task.kind == "push":
        holds["place"] = bool(np.linalg.norm(cube[:2] - s.pad[:2]) <= PUSH_RADIUS and cube[2] <= RESTING_Z)
    elif task.kind == "stack":
        base = s.cubes[task.base]
        holds["place"] = bool(
            np.linalg.norm(cube[:2] - base[:2]) <= STACK_XY and abs(cube[2] - base[2] - 2 * CUBE_HALF) <= 0.01
        )
    return {name: bool(holds[name]) for name in task.stages}


def stage_progress(task: Task, s: TaskState) -> int:
    """How many of the task's stages, from the first, hold on ``s`` (0 .. ``len(task.stages)``)."""
    n = 0
    for held in stage_flags(task, s).values():
        if not held:
            break
        n += 1
    return n


def potentials(task: Task, s: TaskState) -> dict[str, float]:
    """The dense potentials ``phi`` (already scaled) of every term but ``success``."""
    cube = s.cubes[task.cube]
    grasped = bool(s.grasped[task.cube]) and task.kind != "push"
    phi = {
        "reach": 1.0 - np.tanh(10.0 * np.linalg.norm(s.pinch - cube)),
        "grasp": float(grasped),
        "lift": 0.0,
        "place": 0.0,
    }
    if task.kind == "pick":
        phi["lift"] = float(np.clip((cube[2] - CUBE_HALF) / LIFT_HEIGHT, 0.0, 1.0)) * grasped
    elif task.kind == "push":
        phi["place"] = 1.0 - np.tanh(8.0 * np.linalg.norm(cube[:2] - s.pad[:2]))
    else:
        goal = s.cubes[task.base] + np.array([0.0, 0.0, 2 * CUBE_HALF])
        dist = float(np.linalg.norm(cube - goal))
        phi["place"] = (1.0 - np.tanh(10.0 * dist)) * (grasped or dist <= STACK_XY)
    return {k: REWARD_SCALES[k] * float(v) for k, v in phi.items()}


def reward_terms(mode: str, phi_prev: dict[str, float], phi: dict[str, float], success: bool) -> dict[str, float]:
    """Per-step reward terms from the potentials before and after the step (see module doc)."""
    if mode == "potential":
        terms = {k: phi[k] - phi_prev[k] for k in phi}
    elif mode == "absolute":
        terms = dict(phi)
    else:
        terms = dict.fromkeys(phi, 0.0)
    terms["success"] = REWARD_SCALES["success"] * float(success)
    return terms
