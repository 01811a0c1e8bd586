"""The task state behind a tabletop observation, for observers with privileged access (a simulated operator).

A tabletop observation carries the end-effector state (``observation.state``)
and, privileged, the cube and pad poses and the task index
(``observation.env_state``, see :mod:`sim.mujoco_tasks.env`). From those two
rows :func:`observed_state` rebuilds a :class:`~sim.mujoco_tasks.tasks.TaskState`
without touching the simulator, so it works on envs in worker processes too.
Contacts are not observed: a cube counts as grasped (and touched) when the
gripper is more than :data:`GRASP_CLOSURE` closed and the cube centre lies
within :data:`GRASP_RADIUS` of the pinch point; cube speeds are unknown (0).
"""

from __future__ import annotations

import numpy as np

from sim.core import EnvError
from sim.mujoco_tasks.tasks import ALL_TASKS, Task, TaskState

GRASP_CLOSURE = 0.3  # gripper closure (0 open .. 1 closed) above which a cube near the pinch point counts as held
GRASP_RADIUS = 0.035  # m
STATE_DIM, ENV_STATE_DIM = 11, 13


def observed_state(state: np.ndarray, env_state: np.ndarray) -> tuple[Task, TaskState, float]:
    """``(task, task state, gripper closure)`` of one env from its ``observation.state [11]`` and
    ``observation.env_state [13]`` rows (module doc for what is approximated).

    Raises:
        EnvError: for rows of the wrong size or a task index outside :data:`ALL_TASKS`.
    """
    state, env_state = np.asarray(state, dtype=np.float64), np.asarray(env_state, dtype=np.float64)
    if state.shape != (STATE_DIM,) or env_state.shape != (ENV_STATE_DIM,):
        raise EnvError(f"mujoco tabletop: observed_state needs observation.state [{STATE_DIM}] and "
                       f"observation.env_state [{ENV_STATE_DIM}], got {state.shape} and {env_state.shape}")
    index = int(round(env_state[12]))
    if not 0 <= index < len(ALL_TASKS):
        raise EnvError(f"mujoco tabletop: task index {index} in observation.env_state is not a task")
    pinch, closure = state[:3], float(1.0 - state[3])
    cubes = env_state[:9].reshape(3, 3)
    near = np.linalg.norm(cubes - pinch, axis=1) < GRASP_RADIUS
    held = near & (closure > GRASP_CLOSURE)
    s = TaskState(pinch=pinch.copy(), cubes=cubes.copy(), cube_speed=np.zeros(3), pad=env_state[9:12].copy(),
                  grasped=held, touched=held | near)
    return ALL_TASKS[index], s, closure
