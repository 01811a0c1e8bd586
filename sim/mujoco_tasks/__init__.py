"""The MuJoCo tabletop task family behind the ``mujoco/*`` env ids.

One scene (gym-hil's packaged Franka Panda + Robotiq 2F-85, a table, red /
green / blue cubes and a yellow pad), many language-conditioned tasks:

- :mod:`sim.mujoco_tasks.tasks`: task ids, instructions, success predicates
  and reward terms (pure functions, no MuJoCo import);
- :mod:`sim.mujoco_tasks.scene`: builds the ``MjModel`` from
  ``assets/tabletop.xml`` and gym-hil's ``panda.xml``;
- :mod:`sim.mujoco_tasks.control`: end-effector delta control through
  differential inverse kinematics and joint position servos;
- :mod:`sim.mujoco_tasks.env`: :class:`~sim.mujoco_tasks.env.TabletopEnv`,
  one env implementing :class:`sim.single.SingleEnv`;
- :mod:`sim.mujoco_tasks.expert`: scripted experts from privileged state.

Importing this package does not import MuJoCo; the submodules that need it
do.
"""

from sim.mujoco_tasks.tasks import MULTI, TASKS, Task, task_names

__all__ = ["MULTI", "TASKS", "Task", "task_names"]
