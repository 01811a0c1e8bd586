"""ManiSkill3 tabletop tasks (``maniskill/<Task>-v1``) behind the sim contract.

Two paths, picked by :attr:`ManiSkillOptions.sim_backend`:

- CPU (default without CUDA): one ``gym.make(task, sim_backend="physx_cpu")``
  env per :class:`ManiSkillSingleEnv`, built inside worker processes by
  :func:`sim.vectorize.build_vec_env` (ManiSkill's CPU sim holds one env per
  process).
- GPU (default with CUDA): :class:`sim.backends.maniskill_gpu.ManiSkillGPUVecEnv`,
  one ManiSkill env holding every sub-env in PhysX's CUDA simulation.

Observations (per env): ``observation.state`` ``float32 [25]`` (Panda qpos 9,
qvel 9, TCP pose 7), ``observation.env_state`` ``float32 [P]`` (the task's
privileged state, see :mod:`sim.backends.maniskill_tasks`), and with
``obs_mode="rgb"`` ``observation.images.<camera>`` ``uint8 [S, S, 3]`` for each
sensor camera of the task (``base_camera``; also ``hand_camera`` for robots
with a wrist camera, e.g. the default robot of StackCube and
PegInsertionSide). Actions default to ``pd_ee_delta_pose``: ``[-1, 1]^7`` =
TCP translation (x0.1 m, robot base frame), rotation (x0.1 rad, axis-angle in
the TCP-aligned frame) and gripper (-1 closed, +1 open).

The options, specs and the Vulkan probe both paths share live in
:mod:`sim.backends.maniskill_common`.

SAPIEN needs a Vulkan driver even for state observations. :func:`make`
probes for one in a short subprocess and turns a missing driver into one
:class:`sim.core.EnvError` naming ``scripts/install_lavapipe.sh``.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

import numpy as np
import torch

from sim.backends.maniskill_common import (
    DEFAULT_CONTROL_MODE,
    INSTALL_SCRIPT,
    PREFIX,
    ManiSkillOptions,
    action_spec,
    gym_make_kwargs,
    is_vulkan_failure,
    observation_spec,
    physx_gpu_error,
    select_vulkan_icd,
    vulkan_error,
    vulkan_message,
)
from sim.core import OBS_ENV_STATE, OBS_STATE, EnvConfigError, EnvError, EnvSpec, VecEnv, image_key
from sim.options import SimOptions
from sim.registry import ENVS, Backend
from sim.single import SingleEnv, StepOut

_NOTED: set[str] = set()
"""Reasons for the CPU fallback already printed in this process."""

# ------------------------------------------------------------------ CPU path


class ManiSkillSingleEnv(SingleEnv):
    """One ManiSkill env on PhysX's CPU backend (see the module doc for obs and actions).

    Args:
        task: a key of :data:`sim.backends.maniskill_tasks.TASKS`.
        options: backend options.
        vulkan_icd: value for ``VK_ICD_FILENAMES`` in this process (empty: leave it).

    Raises:
        EnvError: if SAPIEN finds no Vulkan device or ManiSkill rejects an option.
    """

    def __init__(self, task: str, options: ManiSkillOptions, vulkan_icd: str = "") -> None:
        if vulkan_icd:
            select_vulkan_icd(vulkan_icd)
        import gymnasium as gym
        import mani_skill.envs  # noqa: F401  registers the tasks

        from sim.backends.maniskill_tasks import TASKS

        env_id = f"{PREFIX}/{task}"
        self._task = TASKS[task]
        self._options = options
        try:
            self._env = gym.make(task, sim_backend="physx_cpu", num_envs=1, **gym_make_kwargs(options))
        except Exception as exc:
            if is_vulkan_failure(exc):
                raise EnvError(vulkan_message(env_id, f"VULKAN:{exc}", vulkan_icd)) from None
            raise EnvError(
                f"{env_id}: ManiSkill could not build the env with {gym_make_kwargs(options)}: {exc}"
            ) from exc
        self._base = self._env.unwrapped
        registered = gym.spec(task).max_episode_steps or 0
        self._max_steps = options.max_episode_steps or registered
        if self._max_steps <= 0:
            raise EnvConfigError(f"{env_id}: the task sets no step limit; pass max_episode_steps > 0")
        self._cameras: tuple[str, ...] = tuple(self._base.scene.sensors) if options.obs_mode == "rgb" else ()
        self._t = 0
        size = options.resolved_image_size
        obs_spec = observation_spec(int(self._state()[0].shape[0]), self._task.state_dim, self._cameras, size)
        self.spec = EnvSpec(
            env_id=env_id,
            observation=obs_spec,
            action=action_spec(self._base.single_action_space),
            max_episode_steps=self._max_steps,
            control_freq=float(self._base.control_freq),
            cameras=self._cameras,
        )

    def _state(self) -> torch.Tensor:
        from sim.backends.maniskill_tasks import proprio_state

        return proprio_state(self._base)

    def _obs(self, raw: Any, info: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
        """Our observation of the current state; ``info``: ManiSkill's info of the same state (reused)."""
        obs = {
            OBS_STATE: self._state()[0].cpu().numpy(),
            OBS_ENV_STATE: self._task.read(self._base, info)[0].cpu().numpy(),
        }
        for cam in self._cameras:
            obs[image_key(cam)] = raw["sensor_data"][cam]["rgb"][0].cpu().numpy()
        return obs

    def reset(self, seed: int | None) -> tuple[dict[str, np.ndarray], str]:
        """Start an episode (``seed=None`` continues ManiSkill's RNG); returns (obs, instruction)."""
        raw, info = self._base.reset(seed=seed)
        self._t = 0
        return self._obs(raw, info), self._task.instruction

    def step(self, action: np.ndarray) -> StepOut:
        """Apply ``action [A]``; terminated on success, truncated after ``max_episode_steps``."""
        raw, reward, terminated, _, info = self._base.step(np.asarray(action, dtype=np.float32)[None])
        self._t += 1
        success = bool(info["success"][0]) if "success" in info else False
        r = float(reward[0]) if torch.is_tensor(reward) and reward.ndim else float(reward)
        return StepOut(
            obs=self._obs(raw, info),
            reward=r,
            terminated=bool(terminated[0]),
            truncated=self._t >= self._max_steps,
            success=success,
            signals=maniskill_signals(self._base, info),
        )

    def expert_action(self) -> np.ndarray:
        """The scripted expert's action ``float32 [7]`` for the current state.

        Raises:
            NotImplementedError: if the task has no expert, or the control mode
                is not ``pd_ee_delta_pose`` (the experts' action space).
        """
        from sim.experts.maniskill import EXPERTS

        if self._task.task not in EXPERTS:
            raise NotImplementedError(
                f"{self.spec.env_id}: no scripted expert; experts exist for {', '.join(sorted(EXPERTS))}"
            )
        if self._options.resolved_control_mode != DEFAULT_CONTROL_MODE:
            raise NotImplementedError(
                f"{self.spec.env_id}: scripted experts act in control_mode={DEFAULT_CONTROL_MODE!r}, "
                f"not {self._options.resolved_control_mode!r}"
            )
        state = self._task.read(self._base)[0].cpu().numpy()
        return EXPERTS[self._task.task](state, self._task.layout())

    def close(self) -> None:
        """Close the ManiSkill env."""
        env = getattr(self, "_env", None)
        if env is not None:
            self._env = None
            env.close()


def _make_single(task: str, options: ManiSkillOptions, vulkan_icd: str) -> ManiSkillSingleEnv:
    """Module-level factory (picklable through ``functools.partial``) run inside a worker."""
    return ManiSkillSingleEnv(task, options, vulkan_icd)


# ------------------------------------------------------------------ backend


@ENVS.register(PREFIX, config=ManiSkillOptions)
class ManiSkillBackend(Backend):
    """ManiSkill3 tabletop tasks with the Panda arm (SAPIEN; needs Vulkan)."""

    def tasks(self) -> list[str]:
        """The supported ManiSkill task ids."""
        from sim.backends.maniskill_set import SET_ID
        from sim.backends.maniskill_tasks import TASKS

        return sorted(TASKS) + [SET_ID]

    def make(self, task: str, num_envs: int, seed: int, options: SimOptions) -> VecEnv:
        """Build ``num_envs`` envs of ``task`` on the CPU (worker processes) or GPU path.

        Raises:
            EnvError: no Vulkan device, ``sim_backend='gpu'`` without CUDA or without
                PhysX's CUDA library (:func:`sim.backends.maniskill_common.physx_gpu_error`; ``auto``
                then falls back to the CPU backend with a note), or a missing ``vulkan_icd`` file.
        """
        assert isinstance(options, ManiSkillOptions)
        env_id = f"{PREFIX}/{task}"
        if options.vulkan_icd and not os.path.isfile(options.vulkan_icd):
            raise EnvConfigError(
                f"{env_id}: vulkan_icd={options.vulkan_icd!r} does not exist; run {INSTALL_SCRIPT} "
                "and pass the json path it prints"
            )
        icd = options.vulkan_icd or os.environ.get("VK_ICD_FILENAMES", "")
        cuda = torch.cuda.is_available()
        if options.sim_backend == "gpu" and not cuda:
            raise EnvConfigError(f"{env_id}: sim_backend='gpu' needs CUDA (torch.cuda.is_available() is False); use 'cpu'")
        reason = vulkan_error(icd)
        if reason is not None:
            raise EnvError(vulkan_message(env_id, reason, icd))
        from sim.backends.maniskill_set import SET_ID, make_set_single

        if task == SET_ID:  # several tasks: one CPU env per task and slot (a GPU env holds one task)
            if options.sim_backend == "gpu":
                raise EnvError(f"{env_id}: the task set runs on the CPU backend only; use sim_backend 'cpu' or 'auto'")
            from sim.vectorize import build_vec_env

            workers = options.num_workers if options.num_workers >= 0 else min(num_envs, os.cpu_count() or 1)
            factory = functools.partial(make_set_single, ManiSkillSingleEnv, options, icd)
            return build_vec_env([factory] * num_envs, env_id, workers, spin=options.spin)
        gpu = options.sim_backend == "gpu" or (options.sim_backend == "auto" and cuda)
        why = physx_gpu_error() if gpu else None
        if why is not None and options.sim_backend == "gpu":
            raise EnvError(f"{env_id}: sim_backend='gpu': {why}; or use sim_backend 'cpu'")
        if why is not None:  # 'auto' on a CUDA machine that cannot get PhysX's CUDA library (offline)
            gpu = False
            if why not in _NOTED:
                _NOTED.add(why)
                print(f"note: {env_id}: sim_backend 'auto' runs ManiSkill on the CPU backend: {why}", file=sys.stderr)
        if gpu:
            from sim.backends.maniskill_gpu import ManiSkillGPUVecEnv

            if icd:
                select_vulkan_icd(icd)
            return ManiSkillGPUVecEnv(task, num_envs, options, env_id)
        from sim.vectorize import build_vec_env

        workers = options.num_workers if options.num_workers >= 0 else min(num_envs, os.cpu_count() or 1)
        factory = functools.partial(_make_single, task, options, icd)
        return build_vec_env([factory] * num_envs, env_id, workers, spin=options.spin, executor=options.executor)


def maniskill_signals(base: Any, info: dict[str, Any]) -> dict[str, float]:
    """Privileged signals of a one-env ManiSkill task (docs/sim.md): what its ``info`` and agent expose.

    ``grasped`` / ``placed`` from ManiSkill's ``is_grasped`` / ``is_obj_placed`` where the task reports
    them, the TCP position ``ee_x/y/z`` where the agent has a TCP link, and ``joint_limit_margin`` (the
    smallest distance of a joint to its nearer limit over the joint's range) from the robot's limits.
    """
    out: dict[str, float] = {}
    for key, name in (("is_grasped", "grasped"), ("is_obj_placed", "placed")):
        if key in info:
            out[name] = float(torch.as_tensor(info[key]).reshape(-1)[0])
    tcp = getattr(base.agent, "tcp", None)
    if tcp is not None:
        out.update(zip(("ee_x", "ee_y", "ee_z"), torch.as_tensor(tcp.pose.p).reshape(-1, 3)[0].tolist()))
    robot = base.agent.robot
    q = torch.as_tensor(robot.get_qpos()).reshape(-1).cpu()
    limits = torch.as_tensor(robot.get_qlimits()).reshape(-1, 2).cpu()
    span = (limits[:, 1] - limits[:, 0]).clamp_min(1e-6)
    finite = torch.isfinite(span) & (span < 1e3)
    if finite.any():
        margin = torch.minimum(q - limits[:, 0], limits[:, 1] - q)[finite] / span[finite]
        out["joint_limit_margin"] = float(margin.min().clamp(0.0, 0.5))
    return out
