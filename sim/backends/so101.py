"""``lerobot_env_so101/*``: the lerobot-env-so101 SO-101 arm envs (MuJoCo) behind the sim contract.

Ids (the package's own gymnasium ids): ``lerobot_env_so101/SO101PickCube-v0``
("pick up the cube") and ``lerobot_env_so101/SO101PickPlace-v0`` ("move the cube to the goal position"; the goal
is not drawn in the scene, only given in ``observation.env_state``). The
package's own envs run unchanged; we only change how they are driven and
rendered:

- action ``[dx, dy, dz, gripper]`` in ``[-1, 1]``: the package's IK target
  moves ``action_scale`` metres per unit (2.5 cm by default, the scale the
  package's scripted controller is calibrated for; the package's own default
  of 1 m per unit saturates the workspace in one step); gripper -1 opens, +1
  closes (the package wants an absolute opening in ``[0, 1]``, 1 open);
- ``observation.images.front`` (``image_size``, 128 by default),
  ``observation.state`` = the package's ``agent_pos`` (14: joint positions,
  joint velocities, gripper opening in [-1, 1], end-effector xyz) and
  ``observation.env_state`` = block xyz (PickPlace: then the goal xyz);
- shadows and 8x anti-aliasing are off (the package builds its renderer on
  first use, after we change the model);
- the block (and goal) position is randomized per seeded reset.

``SO101PickPlace-v0`` has a scripted expert: the package's own
``PickPlaceController`` (``expert_actions()`` on the vector env).
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

INSTALL = "lerobot-env-so101==0.4.0"
TASKS = {
    "SO101PickCube-v0": "pick up the cube",
    "SO101PickPlace-v0": "move the cube to the goal position",
}


def gripper_to_so101(g: float) -> float:
    """Our gripper command (-1 open .. +1 close) -> the package's opening (1 open .. 0 closed)."""
    return 0.5 * (1.0 - g)


def block_state(unwrapped: Any) -> np.ndarray:
    """Block centre (m), then the goal (PickPlace only)."""
    parts = [unwrapped.data.sensor("block_pos").data]
    if hasattr(unwrapped, "goal_pos"):
        parts.append(unwrapped.goal_pos)
    return np.concatenate(parts).astype(np.float32)


class PickPlaceExpert:
    """The package's ``PickPlaceController`` driving our action convention.

    Args:
        action_scale: the env's metres per unit action.
    """

    def __init__(self, action_scale: float) -> None:
        from lerobot_env_so101.scripted.pick_place import PickPlaceController

        self.controller = PickPlaceController(action_scale=action_scale)

    def reset(self) -> None:
        """Back to the first phase (hover)."""
        self.controller.reset()

    def act(self, unwrapped: Any) -> np.ndarray:
        """Our action ``float32 [4]`` from the env's grasp point, block and goal positions."""
        native = self.controller.act(
            unwrapped.ik_point_pos, unwrapped.data.sensor("block_pos").data, unwrapped.goal_pos
        )
        return np.array([native[0], native[1], native[2], 1.0 - 2.0 * native[3]], dtype=np.float32)


@dataclass
class SO101Options(PackagedGymOptions):
    """Options of the ``lerobot_env_so101/*`` envs (common fields: :class:`sim.options.SimOptions`).

    Attributes:
        image_size: camera height and width (128 by default; 0 also means 128).
        num_workers: worker processes; 0 (default, also for -1) steps every env in this process.
        action_scale: metres the IK target moves per unit action.
        random_block_position: draw the block (and goal) position at every reset.
        reward_type: SO101PickCube's ``sparse`` (0/1) or ``dense`` reward
            (SO101PickPlace is always sparse).
        top_down_ik: keep the gripper pointing down (the package's PickPlace default).
        jaw_pads: collide with the fingertip pads (the package's PickPlace default).
    """

    image_size: int = 128
    num_workers: int = 0
    action_scale: float = 0.025
    top_down_ik: bool = True
    jaw_pads: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.action_scale <= 0.2:
            raise ValueError(f"action_scale must be in (0, 0.2] metres per unit action, got {self.action_scale}")


@ENVS.register("lerobot_env_so101", config=SO101Options)
class SO101Backend(Backend):
    """The SO-101 arm pick-cube / pick-place envs of lerobot-env-so101."""

    def tasks(self) -> list[str]:
        """``SO101PickCube-v0`` and ``SO101PickPlace-v0``."""
        return list(TASKS)

    def make(self, task: str, num_envs: int, seed: int, options: SO101Options) -> VecEnv:  # type: ignore[override]
        """Build ``num_envs`` SO-101 envs; each makes its gymnasium env in the process that steps it.

        Raises:
            sim.core.EnvError: for ``reward_type='dense'`` with SO101PickPlace-v0.
        """
        from sim.core import EnvError
        from sim.mujoco_tasks.gym_adapter import GymEnvConfig, GymMujocoEnv

        env_id = f"lerobot_env_so101/{task}"
        size = options.image_size or 128
        rgb = options.obs_mode == "rgb"
        kwargs: dict[str, Any] = {
            "image_obs": rgb,
            "random_block_position": options.random_block_position,
            "action_scale": options.action_scale,
            "top_down_ik": options.top_down_ik,
            "jaw_pads": options.jaw_pads,
        }
        expert = None
        if task == "SO101PickCube-v0":
            kwargs["reward_type"] = options.reward_type
        else:
            if options.reward_type != "sparse":
                raise EnvError(f"{env_id}: the package's pick-place reward is sparse only; drop reward_type")
            expert = functools.partial(PickPlaceExpert, options.action_scale)
        cfg = GymEnvConfig(
            env_id=env_id,
            gym_id=f"lerobot_env_so101/{task}",
            package="lerobot_env_so101",
            install=INSTALL,
            make_kwargs=kwargs,
            render_spec_class="lerobot_env_so101.mujoco_env:GymRenderingSpec",
            instruction=TASKS[task],
            cameras=("front",) if rgb else (),
            control_freq=10.0,
            gripper_map=gripper_to_so101,
            env_state_fn=block_state,
            expert_factory=expert,
        )
        factories = [functools.partial(GymMujocoEnv, cfg, size, options.max_episode_steps) for _ in range(num_envs)]
        return build_vec_env(factories, env_id, max(0, options.num_workers), spin=options.spin, executor=options.executor)
