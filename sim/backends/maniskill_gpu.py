"""ManiSkill3 on PhysX's CUDA backend: every sub-env inside one simulator.

:class:`ManiSkillGPUVecEnv` implements :class:`sim.core.VecEnv` directly over
one ``gym.make(task, num_envs=N, sim_backend="physx_cuda")`` env. Observation
keys, shapes and instructions are those of the CPU path
(:mod:`sim.backends.maniskill`, sharing :mod:`sim.backends.maniskill_common`); tensors stay on the simulator's CUDA device
(observations, reward, flags, ``info``) so a GPU policy reads them without a
copy. Ended envs are reset in the same ``step`` (ManiSkill partial reset with
``options["env_idx"]``); ``info["final_obs"]`` keeps their last observation.

Seeding: ManiSkill draws GPU initial states from one torch generator seeded
with the first seed of a reset call, so a seeded reset is reproducible for
the whole batch, not independently per env.

This path needs a CUDA GPU and cannot run on CPU-only machines.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from sim.backends.maniskill_common import (
    DEFAULT_CONTROL_MODE,
    ManiSkillOptions,
    action_spec,
    gym_make_kwargs,
    is_vulkan_failure,
    observation_spec,
    vulkan_message,
)
from sim.backends.maniskill_tasks import TASKS, proprio_state
from sim.core import (
    OBS_ENV_STATE,
    OBS_STATE,
    TASK,
    EnvConfigError,
    EnvError,
    EnvSpec,
    Obs,
    VecEnv,
    image_key,
    normalize_env_ids,
    tile_images,
)


class ManiSkillGPUVecEnv(VecEnv):
    """``num_envs`` ManiSkill envs simulated together on the GPU.

    Args:
        task: a key of :data:`sim.backends.maniskill_tasks.TASKS`.
        num_envs: sub-envs in the simulation.
        options: backend options (``num_workers`` is ignored).
        env_id: the full env id, for the spec and error messages.
        device: the PhysX device: ``cuda`` or ``cuda:<n>``; ``cpu`` runs the
            same code on PhysX's CPU backend (``num_envs`` must be 1), which
            lets tests exercise this class on machines without a GPU.

    Raises:
        EnvError: if CUDA is unavailable, SAPIEN finds no Vulkan device or
            ManiSkill rejects an option.
    """

    def __init__(self, task: str, num_envs: int, options: ManiSkillOptions, env_id: str, device: str = "cuda") -> None:
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise EnvError(
                f"{env_id}: the GPU path needs CUDA (torch.cuda.is_available() is False); use sim_backend='cpu'"
            )
        if device == "cpu" and num_envs != 1:
            raise EnvConfigError(f"{env_id}: ManiSkill's CPU backend holds one env per simulator; got num_envs={num_envs}")
        import gymnasium as gym
        import mani_skill.envs  # noqa: F401  registers the tasks

        self._closed = True
        self._task = TASKS[task]
        self._options = options
        sim_backend = "physx_cpu" if device == "cpu" else device.replace("cuda", "physx_cuda")
        kwargs = gym_make_kwargs(options)
        try:
            self._env = gym.make(task, num_envs=num_envs, sim_backend=sim_backend, **kwargs)
        except Exception as exc:
            if is_vulkan_failure(exc):
                raise EnvError(vulkan_message(env_id, f"VULKAN:{exc}", "")) from None
            raise EnvError(f"{env_id}: ManiSkill could not build {num_envs} GPU envs with {kwargs}: {exc}") from exc
        self._closed = False
        self._base = self._env.unwrapped
        self.device = torch.device(self._base.device)
        self.num_envs = num_envs
        max_steps = options.max_episode_steps or (gym.spec(task).max_episode_steps or 0)
        if max_steps <= 0:
            raise EnvConfigError(f"{env_id}: the task sets no step limit; pass max_episode_steps > 0")
        self._cameras: tuple[str, ...] = tuple(self._base.scene.sensors) if options.obs_mode == "rgb" else ()
        size = options.resolved_image_size
        obs_spec = observation_spec(int(proprio_state(self._base).shape[-1]), self._task.state_dim, self._cameras, size)
        self.spec = EnvSpec(
            env_id=env_id,
            observation=obs_spec,
            action=action_spec(self._base.single_action_space),
            max_episode_steps=max_steps,
            control_freq=float(self._base.control_freq),
            cameras=self._cameras,
        )
        self._instructions = [self._task.instruction] * num_envs
        self._elapsed = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self._ep_return = torch.zeros(num_envs, dtype=torch.float32, device=self.device)
        self._last_obs = {}

    # ------------------------------------------------------------ helpers

    def _obs(self, raw: Any) -> Obs:
        obs: Obs = {OBS_STATE: proprio_state(self._base), OBS_ENV_STATE: self._task.read(self._base)}
        for cam in self._cameras:
            obs[image_key(cam)] = raw["sensor_data"][cam]["rgb"]
        obs[TASK] = list(self._instructions)
        return obs

    def check_actions(self, actions: torch.Tensor | np.ndarray, device: torch.device | str | None = None) -> torch.Tensor:
        """Validate ``actions [num_envs, A]`` and return them as float32 on the sim device."""
        return super().check_actions(actions, self.device if device is None else device)

    # ------------------------------------------------------------ contract

    def reset(self, seed: int | None = None, env_ids: Sequence[int] | torch.Tensor | None = None) -> Obs:
        """Reset all envs or only ``env_ids``; a seed seeds env ``i`` with ``seed + i`` (see module doc)."""
        ids = normalize_env_ids(env_ids, self.num_envs)
        seed = self._take_seed(seed)
        options: dict[str, Any] = {}
        if len(ids) < self.num_envs:
            options["env_idx"] = torch.tensor(ids, dtype=torch.long, device=self.device)
        seeds = None if seed is None else [seed + i for i in range(self.num_envs)]
        raw, _ = self._base.reset(seed=seeds, options=options)
        idx = torch.tensor(ids, dtype=torch.long, device=self.device)
        self._elapsed[idx] = 0
        self._ep_return[idx] = 0.0
        self._last_obs = self._obs(raw)
        return self._last_obs

    def step(self, actions: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Step every env; ended envs are auto-reset (see :mod:`sim.core`)."""
        acts = self.check_actions(actions)
        raw, reward, terminated, _, info = self._base.step(acts)
        reward = torch.as_tensor(reward, device=self.device).to(torch.float32).reshape(self.num_envs)
        terminated = torch.as_tensor(terminated, device=self.device).to(torch.bool).reshape(self.num_envs)
        success = info.get("success")
        if success is None:
            success = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        success = success.to(torch.bool).reshape(self.num_envs)
        self._elapsed += 1
        self._ep_return += reward
        truncated = self._elapsed >= self.spec.max_episode_steps
        done = terminated | truncated
        obs = self._obs(raw)
        out: dict[str, Any] = {"success": success}  # no breakdown terms: the reward is the ``env`` term
        if bool(done.any()):
            ids = done.nonzero().flatten()
            out["final_obs"] = {k: (v.clone() if torch.is_tensor(v) else list(v)) for k, v in obs.items()}
            out["done"] = done.clone()
            out["episode"] = {
                "return": self._ep_return.clone(),
                "length": self._elapsed.clone(),
                "success": success.clone(),
            }
            raw, _ = self._base.reset(options={"env_idx": ids})
            self._elapsed[ids] = 0
            self._ep_return[ids] = 0.0
            obs = self._obs(raw)
        self._last_obs = obs
        return obs, reward, terminated, truncated, out

    def render(self) -> np.ndarray:
        """The first camera of every env tiled into one ``uint8 [H, W, 3]`` frame."""
        keys = self.spec.image_keys
        if not keys:
            raise EnvError(f"{self.spec.env_id}: no camera observations to render (obs_mode=state?)")
        return tile_images(self._last_obs[keys[0]].cpu().numpy())

    def expert_actions(self) -> torch.Tensor:
        """Scripted-expert actions ``[B, A]`` (computed per env on the CPU from the privileged state).

        Raises:
            NotImplementedError: if the task has no expert.
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
        state = self._task.read(self._base).cpu().numpy()
        layout = self._task.layout()
        acts = np.stack([EXPERTS[self._task.task](s, layout) for s in state])
        return torch.from_numpy(acts).to(self.device)

    def close(self) -> None:
        """Close the ManiSkill env. Idempotent."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._env.close()
