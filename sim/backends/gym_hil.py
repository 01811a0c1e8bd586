"""``gym_hil/*``: LeRobot's gym-hil Panda envs (MuJoCo) behind the sim contract.

Ids: ``gym_hil/PandaPickCube-v0`` ("pick up the cube") and
``gym_hil/PandaArrangeBoxes-v0``. Both run the package's own env with its
end-effector action wrapper; we only change how it is driven and rendered:

- action ``[dx, dy, dz, gripper]`` in ``[-1, 1]``: the package moves the
  end-effector target 2.5 cm per unit; gripper -1 opens, +1 closes (the
  package's ``[0, 2]`` command is ours plus one);
- ``observation.images.front`` / ``.wrist`` (``image_size``, 128 by default),
  ``observation.state`` = the package's ``agent_pos`` (18: joint positions,
  joint velocities, gripper command 0..255, pinch xyz), and
  ``observation.env_state`` = the block (and target) positions from the
  model's sensors;
- shadows and 8x anti-aliasing are turned off and the package's 1 s sleep in
  every reset is disabled (``reset_delay_seconds=0``);
- the block position is randomized per seeded reset (``random_block_position``,
  on by default; gym-hil's own default places it at one fixed spot).

Left out on purpose: the ``*Base-v0`` ids (raw 7-dim actions in metres, use the
wrapped id) and the ``*Keyboard-v0`` / ``*Gamepad-v0`` / ``*Viewer-v0`` ids
(they open a viewer and read a keyboard or gamepad, for human intervention,
and fail without a display). The package steps an operational-space
controller in Python at 500 Hz and renders its high-poly Panda: expect ~10
steps/s with images; ``mujoco/*`` is the fast tabletop family.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.backends.packaged_gym import PackagedGymOptions
from sim.core import VecEnv
from sim.registry import ENVS, Backend
from sim.vectorize import build_vec_env

INSTALL = "gym-hil==0.1.14"
TASKS = {
    "PandaPickCube-v0": "pick up the cube",
    "PandaArrangeBoxes-v0": "put each box on its target",
}
EE_STEP = 0.025  # m per unit action, gym-hil's DEFAULT_EE_STEP_SIZE


def gripper_to_gym_hil(g: float) -> float:
    """Our gripper command (-1 open .. +1 close) -> gym-hil's ``[0, 2]`` (1 = hold)."""
    return g + 1.0


def block_state(unwrapped: Any) -> np.ndarray:
    """Positions of every ``block*_pos`` / ``target*_pos`` sensor, concatenated (m)."""
    model, data = unwrapped.model, unwrapped.data
    names = [model.sensor(i).name for i in range(model.nsensor)]
    keep = [n for n in names if n.startswith(("block", "target")) and n.endswith("_pos")]
    return np.concatenate([data.sensor(n).data for n in keep]).astype(np.float32)


@dataclass
class GymHilOptions(PackagedGymOptions):
    """Options of the ``gym_hil/*`` envs (common fields: :class:`sim.options.SimOptions`).

    Attributes:
        image_size: camera height and width (128 by default, the package's own; 0 also means 128).
        num_workers: worker processes; 0 (default, also for -1) steps every env in this process.
        wrist_camera: also emit ``observation.images.wrist``.
        random_block_position: draw the block position at every reset (PandaPickCube).
        reward_type: the package's ``sparse`` (0/1 on success) or ``dense`` reward.
    """

    image_size: int = 128
    num_workers: int = 0
    wrist_camera: bool = True


@ENVS.register("gym_hil", config=GymHilOptions)
class GymHilBackend(Backend):
    """LeRobot's gym-hil MuJoCo Panda envs (pick cube, arrange boxes)."""

    def tasks(self) -> list[str]:
        """The headless gym-hil ids (without the ``gym_hil/`` prefix)."""
        return list(TASKS)

    def make(self, task: str, num_envs: int, seed: int, options: GymHilOptions) -> VecEnv:  # type: ignore[override]
        """Build ``num_envs`` gym-hil envs; each makes its gymnasium env in the process that steps it."""
        from sim.mujoco_tasks.gym_adapter import GymEnvConfig, GymMujocoEnv

        size = options.image_size or 128
        rgb = options.obs_mode == "rgb"
        kwargs: dict[str, Any] = {
            "image_obs": rgb,
            "reward_type": options.reward_type,
            "reset_delay_seconds": 0.0,
        }
        if task == "PandaPickCube-v0":
            kwargs["random_block_position"] = options.random_block_position
        cfg = GymEnvConfig(
            env_id=f"gym_hil/{task}",
            gym_id=f"gym_hil/{task}",
            package="gym_hil",
            install=INSTALL,
            make_kwargs=kwargs,
            render_spec_class="gym_hil.mujoco_gym_env:GymRenderingSpec",
            instruction=TASKS[task],
            cameras=(("front", "wrist") if options.wrist_camera else ("front",)) if rgb else (),
            control_freq=10.0,
            gripper_map=gripper_to_gym_hil,
            env_state_fn=block_state,
            penalty_key="discrete_penalty",
        )
        factories = [functools.partial(GymMujocoEnv, cfg, size, options.max_episode_steps) for _ in range(num_envs)]
        return build_vec_env(factories, cfg.env_id, max(0, options.num_workers), spin=options.spin, executor=options.executor)
