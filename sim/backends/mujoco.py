"""``mujoco/*``: the fast default tabletop tasks (see :mod:`sim.mujoco_tasks`).

Env ids: ``mujoco/pick-<c>``, ``mujoco/push-<c>-to-pad``,
``mujoco/stack-<a>-on-<b>`` for colours ``red``, ``green``, ``blue``, and
``mujoco/multi`` (one task per episode, named by the instruction)::

    env = make_env("mujoco/multi", num_envs=8, seed=0)              # 64x64 front camera, in-process
    env = make_env("mujoco/pick-red", num_envs=16, num_workers=2)  # two forkserver workers

Listing ids imports neither MuJoCo nor gym-hil; :meth:`MujocoBackend.make`
does, and each env builds its renderer lazily inside the process that steps
it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sim.core import EnvError, VecEnv
from sim.mujoco_tasks.tasks import MULTI, REWARD_MODES, TASK_INDEX, task_names
from sim.options import SimOptions
from sim.registry import ENVS, Backend
from sim.vectorize import build_vec_env

CONTROL_MODES = ("ee_delta_pos",)
PHYSICS_HZ = 200  # 1 / timestep of assets/tabletop.xml


@dataclass
class MujocoOptions(SimOptions):
    """Options of the ``mujoco/*`` tabletop envs (common fields: :class:`sim.options.SimOptions`).

    Attributes:
        image_size: camera height and width in pixels (64 by default; 0 also means 64).
        num_workers: worker processes; 0 (default) steps every env in this
            process, N > 0 spreads them over N forkserver workers, -1 means 0.
        control_mode: ``ee_delta_pos`` (the only one; empty means it):
            ``[dx, dy, dz, gripper]`` in ``[-1, 1]``, gripper -1 open, +1 closed.
        wrist_camera: also emit ``observation.images.wrist`` (the Panda hand camera).
        control_freq: control steps per simulated second; must divide the
            200 Hz physics rate (10 or 20 are sensible).
        max_step: metres the pinch-point target moves per step at action 1.
        reward_mode: ``potential`` (shaping differences, default),
            ``absolute`` (dense potentials each step) or ``sparse``; see
            :mod:`sim.mujoco_tasks.tasks` for the terms and their scales.
        terminate_on_success: end the episode on its first success step.
        multi_tasks: for ``mujoco/multi``: task names to draw from (empty: all).
    """

    image_size: int = 64
    num_workers: int = 0
    wrist_camera: bool = False
    control_freq: float = 10.0
    max_step: float = 0.04
    reward_mode: str = "potential"
    terminate_on_success: bool = True
    multi_tasks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.control_mode not in ("", *CONTROL_MODES):
            raise ValueError(f"control_mode must be one of {CONTROL_MODES} (or empty), got {self.control_mode!r}")
        if self.reward_mode not in REWARD_MODES:
            raise ValueError(f"reward_mode must be one of {REWARD_MODES}, got {self.reward_mode!r}")
        ratio = PHYSICS_HZ / self.control_freq if self.control_freq > 0 else 0.0
        if ratio < 1 or abs(ratio - round(ratio)) > 1e-6:
            raise ValueError(
                f"control_freq must divide the {PHYSICS_HZ} Hz physics rate (e.g. 10 or 20), got {self.control_freq}"
            )
        if not 0.0 < self.max_step <= 0.1:
            raise ValueError(f"max_step must be in (0, 0.1] metres per step, got {self.max_step}")
        bad = [t for t in self.multi_tasks if t not in TASK_INDEX]
        if bad:
            raise ValueError(f"multi_tasks has unknown task(s) {bad}; valid: {', '.join(TASK_INDEX)}")


def _skill_subsets() -> dict[str, tuple[str, ...]]:
    """``pick-any``: one of the three pick tasks per episode (the instruction names the colour); same for push, stack."""
    from sim.mujoco_tasks.tasks import TASKS

    out: dict[str, list[str]] = {}
    for t in TASKS:
        out.setdefault(f"{t.name.split('-')[0]}-any", []).append(t.name)
    return {k: tuple(v) for k, v in out.items()}


SKILL_SUBSETS = _skill_subsets()


@ENVS.register("mujoco", config=MujocoOptions)
class MujocoBackend(Backend):
    """Language-conditioned tabletop tasks on gym-hil's MuJoCo Panda (fast, CPU-friendly)."""

    def tasks(self) -> list[str]:
        """``pick-*``, ``push-*-to-pad``, ``stack-*-on-*``, ``multi`` and per-skill ``<skill>-any``."""
        return task_names() + list(SKILL_SUBSETS)

    def make(self, task: str, num_envs: int, seed: int, options: MujocoOptions) -> VecEnv:  # type: ignore[override]
        """Build ``num_envs`` tabletop envs; see :class:`MujocoOptions`.

        Raises:
            EnvError: for ``multi_tasks`` given to a single-task id, or if the
                scene cannot be built (gym-hil missing).
        """
        from sim.mujoco_tasks.env import TabletopConfig, TabletopEnv

        env_id = f"mujoco/{task}"
        if options.multi_tasks and task != MULTI:
            raise EnvError(f"{env_id}: multi_tasks only applies to mujoco/{MULTI}")
        subset = SKILL_SUBSETS.get(task, tuple(options.multi_tasks))
        cfg = TabletopConfig(
            env_id=env_id,
            task=MULTI if task in SKILL_SUBSETS else task,
            multi_tasks=subset,
            obs_mode=options.obs_mode,
            image_size=options.image_size or 64,
            wrist_camera=options.wrist_camera,
            max_episode_steps=options.max_episode_steps,
            control_freq=options.control_freq,
            max_step=options.max_step,
            reward_mode=options.reward_mode,
            terminate_on_success=options.terminate_on_success,
        )
        factories = [functools.partial(TabletopEnv, cfg) for _ in range(num_envs)]
        return build_vec_env(factories, env_id, max(0, options.num_workers), spin=options.spin, executor=options.executor)
