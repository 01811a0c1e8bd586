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

Long-horizon tasks (:data:`LONG_TASKS`, kind ``sequence``) chain two
sub-tasks; they have their own env ids and never join ``multi`` or the
``<skill>-any`` ids (whose task sets, episodes and task indices are unchanged):

- ``pick-place-stack``: pick the red cube, place it on the yellow pad, then
  stack the blue cube on it. Stages: ``reach``, ``grasp``, ``lift`` (red),
  ``place`` (red resting on the pad, 3.5 cm xy), then ``reach2``, ``grasp2``,
  ``lift2`` (blue) and ``stack`` (blue on red, as the stack predicate). Once
  red rests on the pad the first three stages count as held (the sub-task is
  done, the hand has moved on); likewise ``reach2`` .. ``lift2`` once blue is
  stacked. Success: red on the pad and blue stacked on
  it, at rest and released. Reward potentials: half per sub-task, each the
  pick/stack potentials of its cube and goal (:func:`potentials`).
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
    "sequence": ("reach", "grasp", "lift", "place", "reach2", "grasp2", "lift2", "stack"),
}
STAGE_NAMES: tuple[str, ...] = (  # union, in order of first use
    "reach", "grasp", "touch", "lift", "place", "reach2", "grasp2", "lift2", "stack")
SEQUENCE_SUBTASKS = 2  # sub-tasks of a ``sequence`` task: place ``cube`` on the pad, stack ``second`` on it


@dataclass(frozen=True)
class Task:
    """One task of the family.

    Attributes:
        name: task id without the backend prefix, e.g. ``stack-red-on-green``.
        kind: ``pick``, ``push``, ``stack`` or ``sequence`` (long-horizon, :data:`LONG_TASKS`).
        cube: index (into ``CUBE_COLORS``) of the cube to move (sequence: the one placed on the pad).
        base: stack: index of the cube to stack on; sequence: the cube stacked on ``cube``; -1 otherwise.
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
"""The single-skill tasks: ``multi`` and the ``<skill>-any`` ids draw from these."""
LONG_TASKS: tuple[Task, ...] = (
    Task("pick-place-stack", "sequence", 0, 2, "put the red cube on the yellow pad, then stack the blue cube on it",
         120),
)
"""Long-horizon tasks with sub-tasks: their own env ids only (module doc)."""
ALL_TASKS: tuple[Task, ...] = TASKS + LONG_TASKS
TASK_INDEX: dict[str, int] = {t.name: i for i, t in enumerate(ALL_TASKS)}
"""Task name -> index into :data:`ALL_TASKS` (the single-skill tasks keep their indices)."""
MULTI_MAX_EPISODE_STEPS = max(t.max_episode_steps for t in TASKS)


def task_names() -> list[str]:
    """Every task id (single-skill and long-horizon) plus ``multi``."""
    return [t.name for t in ALL_TASKS] + [MULTI]


def on_pad(cube: np.ndarray, pad: np.ndarray) -> bool:
    """A cube centre ``[3]`` rests on the pad: within :data:`PUSH_RADIUS` of its centre (xy), on the table."""
    return bool(np.linalg.norm(cube[:2] - pad[:2]) <= PUSH_RADIUS and cube[2] <= RESTING_Z)


def subtask(task: Task, s: TaskState) -> tuple[Task, int]:
    """The sub-task of ``task`` being worked on in state ``s`` and its index.

    A single-skill task is its own sub-task 0. ``sequence``: sub-task 0 is a
    ``stack`` of ``cube`` onto a virtual base under the pad (index 3 of
    :func:`with_pad_base`'s cubes) until ``cube`` rests on the pad, then
    sub-task 1, ``stack`` of ``base`` on ``cube``.
    """
    if task.kind != "sequence":
        return task, 0
    if not on_pad(s.cubes[task.cube], s.pad):
        return Task(f"{task.name}:place", "stack", task.cube, 3, task.instruction, task.max_episode_steps), 0
    return Task(f"{task.name}:stack", "stack", task.base, task.cube, task.instruction, task.max_episode_steps), 1


def with_pad_base(s: TaskState) -> TaskState:
    """``s`` with a fourth, virtual cube whose top is the pad: stacking onto it places a cube on the pad."""
    virtual = np.array([s.pad[0], s.pad[1], -CUBE_HALF])
    return TaskState(pinch=s.pinch, cubes=np.vstack([s.cubes, virtual]), cube_speed=np.append(s.cube_speed, 0.0),
                     pad=s.pad, grasped=np.append(s.grasped, False), touched=np.append(s.touched, False))


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
    if task.kind == "sequence":
        second = Task(task.name, "stack", task.base, task.cube, task.instruction, task.max_episode_steps)
        return on_pad(cube, s.pad) and is_success(second, s)
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
    if task.kind == "sequence":
        return _sequence_flags(task, s)
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


def _sequence_flags(task: Task, s: TaskState) -> dict[str, bool]:
    placed = on_pad(s.cubes[task.cube], s.pad)
    first = Task(task.name, "pick", task.cube, -1, task.instruction, task.max_episode_steps)
    second = Task(task.name, "stack", task.base, task.cube, task.instruction, task.max_episode_steps)
    flags = {k: placed or v for k, v in stage_flags(first, s).items()}
    flags["place"] = placed
    later = stage_flags(second, s)
    stacked = placed and later["place"]
    flags.update({"reach2": stacked or later["reach"], "grasp2": stacked or later["grasp"],
                  "lift2": stacked or later["lift"], "stack": stacked})
    return {name: bool(flags[name]) for name in task.stages}


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
    if task.kind == "sequence":
        sub, k = subtask(task, s)
        inner = potentials(sub, with_pad_base(s) if k == 0 else s)
        return {name: (k * REWARD_SCALES[name] + v) / SEQUENCE_SUBTASKS for name, v in inner.items()}
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
