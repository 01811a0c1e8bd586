"""Labelled episodes and the automatic labels the learned rewards train on.

An :class:`Episode` is the sequence of observations an episode showed, each frame with the success flag of the
state it shows. Two label makers turn episodes into training targets:

- success (:func:`success_targets`): the frame's own flag, 0/1 (the success classifier);
- milestones (:func:`milestone_targets`), the process reward model's progress in ``[0, 1]``:

  * ``stages`` (simulated MuJoCo tabletop episodes, which carry privileged observations): the task's stage
    predicates (:func:`sim.mujoco_tasks.tasks.stage_progress`) evaluated on a :class:`~sim.mujoco_tasks.tasks.TaskState`
    rebuilt from ``observation.env_state`` (cube and pad centres, task index) and ``observation.state`` (pinch
    point, gripper opening) by the documented rule of :func:`task_state_from_obs`; progress is
    ``stages held / (stages + 1)`` and 1 on success frames;
  * ``events`` (any recording, no privileged state; VLA-RL's pseudo labels): segment boundaries where the
    gripper opens or closes and where the end effector comes to rest (speed below a threshold after moving,
    :func:`event_boundaries`); in a successful episode with ``K`` boundaries, frame ``t`` after ``k``
    boundaries has progress ``k / (K + 1)`` and success frames 1. Only successful episodes are labelled this
    way (a failed episode's boundaries do not say how far it got), as in VLA-RL.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from sim.tasks import TASK_INDEX as TASK_INDEX_KEY
from vla_core.keys import OBS_ENV_STATE, OBS_STATE

# The rule that rebuilds the MuJoCo tabletop's contact flags from positions (task_state_from_obs).
GRASP_OPENING = (0.1, 0.8)
"""A gripper opening (1 open, 0 closed) inside this range is closed on something: a 4 cm cube holds the
Robotiq fingers at about 0.34; empty, they close to 0."""
GRASP_RADIUS = 0.025
"""m: with the gripper closed on something, the cube whose centre is this close to the pinch point is grasped."""
TOUCH_RADIUS = 0.045
"""m: the cube whose centre is this close to the pinch point (xy) with the pinch point below the cube's top
plus 2 cm counts as touched (the fingers reach about 2.5 cm past the cube's side)."""

# Event segmentation (event_boundaries).
GRIPPER_INDEX = 3
"""Index of the gripper opening in ``observation.state`` of the MuJoCo tabletop (1 open, 0 closed)."""
EE_SLICE = (0, 3)
"""``observation.state[a:b]`` holding the end-effector (pinch point) position, MuJoCo tabletop."""


@dataclass
class Episode:
    """One recorded episode.

    Attributes:
        obs: observation key -> ``[T, ...]`` frames (images ``uint8 [T, H, W, 3]``, ``observation.state``
            ``[T, S]``, ``observation.env_state`` ``[T, P]`` where recorded).
        success: ``bool [T]``: whether the state frame ``t`` shows is a success state.
        task: the instruction.
    """

    obs: dict[str, Tensor]
    success: Tensor
    task: str

    @property
    def length(self) -> int:
        return int(self.success.shape[0])

    @property
    def succeeded(self) -> bool:
        """Whether the episode reached success (any success frame)."""
        return bool(self.success.any())


def swap_instruction(episode: Episode, task: str, task_index: int | None = None) -> Episode:
    """The episode's frames under another instruction ``task``, labelled failure on every frame (sharing the
    frames). With ``task_index``, the task index the frames carry (``task_index``, and ``observation.env_state``'s
    last column where it holds the same index, as on the MuJoCo tabletop) is set to it too, so
    :func:`stage_targets` labels the frames for the new task."""
    obs = episode.obs
    if task_index is not None and TASK_INDEX_KEY in obs:
        obs = dict(obs)
        old = obs[TASK_INDEX_KEY]
        obs[TASK_INDEX_KEY] = torch.full_like(old, task_index)
        if OBS_ENV_STATE in obs and torch.equal(obs[OBS_ENV_STATE][:, -1].round().long(), old.reshape(-1).long()):
            env_state = obs[OBS_ENV_STATE].clone()
            env_state[:, -1] = task_index
            obs[OBS_ENV_STATE] = env_state
    return Episode(obs=obs, success=torch.zeros_like(episode.success), task=task)


def success_targets(episode: Episode) -> Tensor:
    """``float32 [T]`` 0/1: the success flag of each frame's state."""
    return episode.success.float()


def task_state_from_obs(state: np.ndarray, env_state: np.ndarray):  # -> sim.mujoco_tasks.tasks.TaskState
    """A :class:`~sim.mujoco_tasks.tasks.TaskState` rebuilt from one MuJoCo tabletop frame's observations.

    Positions are exact (pinch point ``state[0:3]``, cube centres ``env_state[0:9]``, pad ``env_state[9:12]``);
    the contact flags are inferred (the rule, see the constants): a cube is *grasped* when the gripper opening
    is within :data:`GRASP_OPENING` and its centre within :data:`GRASP_RADIUS` of the pinch point; *touched*
    when grasped or its centre within :data:`TOUCH_RADIUS` (xy) of a pinch point no higher than the cube's top
    plus 2 cm. Cube speeds are unknown from one frame and set to 0.
    """
    from sim.mujoco_tasks.tasks import CUBE_HALF, TaskState

    pinch = np.asarray(state[0:3], dtype=np.float64)
    opening = float(state[GRIPPER_INDEX])
    cubes = np.asarray(env_state[0:9], dtype=np.float64).reshape(3, 3)
    dist = np.linalg.norm(cubes - pinch, axis=1)
    closed = GRASP_OPENING[0] <= opening <= GRASP_OPENING[1]
    grasped = closed & (dist <= GRASP_RADIUS)
    near_xy = np.linalg.norm(cubes[:, :2] - pinch[:2], axis=1) <= TOUCH_RADIUS
    near = near_xy & (pinch[2] <= cubes[:, 2] + CUBE_HALF + 0.02)
    return TaskState(pinch=pinch, cubes=cubes, cube_speed=np.zeros(3), pad=np.asarray(env_state[9:12], np.float64),
                     grasped=grasped, touched=grasped | near)


def stage_targets(episode: Episode) -> Tensor:
    """``float32 [T]`` progress from the task's stage predicates on privileged observations (module doc).

    The task is the one ``observation.env_state``'s last column indexes in
    :data:`~sim.mujoco_tasks.tasks.ALL_TASKS`: the single-skill tasks and the long-horizon ones (``pick-place-stack``,
    8 stages).

    Raises:
        ValueError: when the episode has no ``observation.env_state`` / ``observation.state`` (not a MuJoCo
            tabletop recording): use event labels instead; or when a frame's task index is not a tabletop task.
    """
    from sim.mujoco_tasks.tasks import ALL_TASKS, stage_progress

    if OBS_ENV_STATE not in episode.obs or OBS_STATE not in episode.obs:
        raise ValueError(f"stage labels need {OBS_ENV_STATE!r} and {OBS_STATE!r} (a MuJoCo tabletop recording); "
                         f"this episode has {sorted(episode.obs)}: use --labels events")
    state, env_state = episode.obs[OBS_STATE].numpy(), episode.obs[OBS_ENV_STATE].numpy()
    index = np.rint(env_state[:, -1]).astype(np.int64)
    bad = index[(index < 0) | (index >= len(ALL_TASKS))]
    if bad.size:
        raise ValueError(f"stage labels: task index {int(bad[0])} in {OBS_ENV_STATE!r}'s last column is not a MuJoCo "
                         f"tabletop task (0..{len(ALL_TASKS) - 1}): not a tabletop recording? use --labels events")
    out = torch.zeros(episode.length)
    for t in range(episode.length):
        task = ALL_TASKS[int(index[t])]
        k = stage_progress(task, task_state_from_obs(state[t], env_state[t]))
        out[t] = 1.0 if episode.success[t] else k / (len(task.stages) + 1)
    return out


def event_boundaries(state: Tensor, gripper_index: int = GRIPPER_INDEX, ee_slice: tuple[int, int] = EE_SLICE,
                     closed_below: float = 0.5, still_speed: float = 0.004, min_moving: int = 3) -> Tensor:
    """``bool [T]``: frames where a segment starts: the gripper opens or closes, or the end effector comes to rest.

    Args:
        state: ``[T, S]`` proprioception of one episode.
        gripper_index: the gripper opening's index in ``state`` (larger = more open).
        ee_slice: ``(a, b)``: ``state[:, a:b]`` is the end-effector position.
        closed_below: the gripper counts as closed below this opening.
        still_speed: per-frame end-effector displacement below which it is at rest (units of ``state``).
        min_moving: a rest starts a segment only after at least this many frames of motion.
    """
    t = state.shape[0]
    out = torch.zeros(t, dtype=torch.bool)
    if t < 2:
        return out
    closed = state[:, gripper_index] < closed_below
    out[1:] |= closed[1:] != closed[:-1]
    a, b = ee_slice
    speed = (state[1:, a:b] - state[:-1, a:b]).norm(dim=1)  # [T-1]: frame t-1 -> t
    moving = 0
    for i in range(1, t):
        if speed[i - 1] >= still_speed:
            moving += 1
        else:
            if moving >= min_moving:
                out[i] = True
            moving = 0
    return out


def event_targets(episode: Episode, gripper_index: int = GRIPPER_INDEX,
                  ee_slice: tuple[int, int] = EE_SLICE) -> Tensor:
    """``float32 [T]`` progress from gripper and rest events of a successful episode (module doc).

    Raises:
        ValueError: for a failed episode (no success frame) or one without ``observation.state``.
    """
    if not episode.succeeded:
        raise ValueError("event labels need a successful episode")
    if OBS_STATE not in episode.obs:
        raise ValueError(f"event labels need {OBS_STATE!r}; this episode has {sorted(episode.obs)}")
    bounds = event_boundaries(episode.obs[OBS_STATE].float(), gripper_index, ee_slice)
    k = torch.cumsum(bounds.long(), 0).float()
    total = float(k[-1]) if len(k) else 0.0
    out = k / (total + 1.0)
    out[episode.success] = 1.0
    return out


LABELS = ("stages", "events")


def milestone_targets(episodes: list[Episode], labels: str) -> tuple[list[Episode], list[Tensor]]:
    """The episodes the process reward model trains on and their progress targets.

    ``stages``: every episode (:func:`stage_targets`); ``events``: the successful ones (:func:`event_targets`).

    Raises:
        ValueError: for an unknown ``labels``, episodes lacking what the labels need, or no episode to train on.
    """
    if labels == "stages":
        kept = list(episodes)
        targets = [stage_targets(e) for e in kept]
    elif labels == "events":
        kept = [e for e in episodes if e.succeeded]
        targets = [event_targets(e) for e in kept]
    else:
        raise ValueError(f"milestone labels must be one of {LABELS}, got {labels!r}")
    if not kept:
        raise ValueError(f"no episode to label with {labels!r} (event labels need successful episodes)")
    return kept, targets
